package otelidem_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/nats-io/nats.go"
	njs "github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/otelidem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/amqpqueue"
	"github.com/idemkit/idem/queue/jetstream"
	"github.com/idemkit/idem/queue/sqsqueue"
)

// carriesTrace publishes through otelidem.Publisher(pub) inside a span and
// checks that the message src hands out continues that span's trace.
func carriesTrace(t *testing.T, pub queue.Publisher, src queue.Source) {
	t.Helper()
	ctx := context.Background()
	pctx, span := tracer(t).Start(ctx, "publish")
	span.End()
	if _, err := otelidem.Publisher(pub).Publish(pctx, queue.Outgoing{Body: []byte("m"), Attributes: map[string]string{"kept": "yes"}}); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var ds []queue.Delivery
	for len(ds) == 0 {
		var err error
		if ds, err = src.Receive(rctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	m := ds[0].Message()
	got := trace.SpanContextFromContext(otelidem.Extract(ctx, m.Attributes))
	if got.TraceID() != span.SpanContext().TraceID() || got.SpanID() != span.SpanContext().SpanID() || m.Attributes["kept"] != "yes" {
		t.Errorf("received attributes %v: trace %v, want the publishing span %v and the message's own attribute", m.Attributes, got, span.SpanContext())
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

func uniqueName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// The brokers whose adapters carry attributes as headers or message
// attributes, each against the real service.
func TestBrokersCarryTheTraceContext(t *testing.T) {
	t.Run("jetstream", func(t *testing.T) {
		nc, err := nats.Connect(testenv.Require(t, testenv.NATS, "otelidem's JetStream trace test"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := njs.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		id := uniqueName()
		stream, subject := "OTELIDEM_"+strings.ToUpper(id), "otelidem."+id
		for _, s := range []njs.StreamConfig{
			{Name: stream, Subjects: []string{subject}, Retention: njs.WorkQueuePolicy, Storage: njs.MemoryStorage},
			{Name: stream + "_DL", Subjects: []string{subject + ".dl"}, Storage: njs.MemoryStorage},
		} {
			if _, err := js.CreateStream(ctx, s); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = js.DeleteStream(context.Background(), s.Name) })
		}
		if _, err := js.CreateOrUpdateConsumer(ctx, stream, njs.ConsumerConfig{Durable: "worker", AckPolicy: njs.AckExplicitPolicy}); err != nil {
			t.Fatal(err)
		}
		src, err := jetstream.NewSource(ctx, js, jetstream.SourceConfig{Stream: stream, Consumer: "worker", DeadLetterSubject: subject + ".dl", PollWait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = src.Close() })
		pub, err := jetstream.NewPublisher(js, subject)
		if err != nil {
			t.Fatal(err)
		}
		carriesTrace(t, pub, src)
	})
	t.Run("amqpqueue", func(t *testing.T) {
		conn, err := amqp.Dial(testenv.Require(t, testenv.AMQP, "otelidem's RabbitMQ trace test"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		ctx := context.Background()
		cfg := amqpqueue.Config{Queue: "otelidem-" + uniqueName()}
		if err := amqpqueue.Declare(ctx, conn, cfg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(cfg.Queue, false, false, false)
				_, _ = ch.QueueDelete(cfg.Queue+".dead-letter", false, false, false)
				_ = ch.Close()
			}
		})
		src, err := amqpqueue.NewSource(ctx, conn, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = src.Close() })
		pub, err := amqpqueue.NewPublisher(conn, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		carriesTrace(t, pub, src)
	})
	t.Run("sqsqueue", func(t *testing.T) {
		endpoint := testenv.Require(t, testenv.SQS, "otelidem's SQS trace test")
		c := sqs.New(sqs.Options{
			Region:       "us-east-1",
			BaseEndpoint: aws.String(endpoint),
			Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
				return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "idem tests"}, nil
			}),
		})
		ctx := context.Background()
		out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("otelidem-" + uniqueName())})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = c.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: out.QueueUrl}) })
		q, err := sqsqueue.Open(ctx, c, aws.ToString(out.QueueUrl), sqsqueue.Options{WaitTime: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		carriesTrace(t, q, q)
	})
}
