package sqsqueue_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/idemkit/idem/internal/tcprelay"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/queuetest"
	"github.com/idemkit/idem/queue/sqsqueue"
)

var settleOps = queuetest.SettleOps(time.Second)

// cutFixture is a queue (visibility 2 s) and its dead-letter queue opened
// directly, and the same queue opened through a relay with the SDK's
// default retries.
type cutFixture struct {
	direct, relayed, dlq *sqsqueue.Queue
	px                   *tcprelay.Relay
}

func newCutFixture(t *testing.T) cutFixture {
	t.Helper()
	c := client(t)
	dlqURL, _ := newQueue(t, c, queueSpec{})
	qURL, _ := newQueue(t, c, queueSpec{visibility: 2 * time.Second})
	u, err := url.Parse(*c.Options().BaseEndpoint)
	if err != nil {
		t.Fatal(err)
	}
	px := tcprelay.New(t, u.Host)
	rc := sqs.New(c.Options(), func(o *sqs.Options) { o.BaseEndpoint = aws.String("http://" + px.Addr()) })
	o := sqsqueue.Options{DeadLetterURL: dlqURL}
	return cutFixture{direct: open(t, c, qURL, o), relayed: open(t, rc, qURL, o), dlq: open(t, c, dlqURL, sqsqueue.Options{}), px: px}
}

// The connection to SQS is cut while a settle (or an extension) is on its
// way, before SQS saw it, and the SDK's retries find a silent network:
// the call returns an error, and the message comes back when its
// visibility lapses (receive count 2), with nothing dead-lettered.
func TestCutMidSettle(t *testing.T) {
	t.Parallel()
	for _, op := range settleOps {
		t.Run(op.Name, func(t *testing.T) {
			t.Parallel()
			f := newCutFixture(t)
			publish(t, f.direct, queue.Outgoing{Body: []byte("fragile")})
			d := receive(t, f.relayed, 1)[0]

			f.px.Blackhole()
			res := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				res <- op.Call(ctx, d)
			}()
			time.Sleep(50 * time.Millisecond)
			f.px.Cut()
			if err := <-res; err == nil {
				t.Fatalf("%s cut mid-call returned nil", op.Name)
			}
			f.px.Close()

			again := receive(t, f.direct, 1)[0]
			if string(again.Message().Body) != "fragile" || again.Message().ReceiveCount != 2 {
				t.Fatalf("redelivery: %+v", again.Message())
			}
			if err := again.Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
			nothing(t, f.dlq, 200*time.Millisecond)
		})
	}
}

// SQS's answer to a settle is lost with its connection. The SDK may send
// the call again on a new connection; whatever it returns must be true: an
// error, or nil for a settle SQS did take (an acked or dead-lettered
// message does not come back; a retried one comes back at once; an
// extended one stays hidden past its first visibility).
func TestSettleAnswerCut(t *testing.T) {
	t.Parallel()
	for _, op := range settleOps {
		t.Run(op.Name, func(t *testing.T) {
			t.Parallel()
			f := newCutFixture(t)
			publish(t, f.direct, queue.Outgoing{Body: []byte("fragile")})
			d := receive(t, f.relayed, 1)[0]
			f.px.DropAnswers(1)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := op.Call(ctx, d)
			cancel()
			if err != nil {
				t.Logf("%s whose answer was cut: %v", op.Name, err)
				return
			}
			switch op.Name {
			case "Ack":
				nothing(t, f.direct, 3*time.Second)
			case "DeadLetter":
				nothing(t, f.direct, 3*time.Second)
				if dl := receive(t, f.dlq, 1); string(dl[0].Message().Body) != "fragile" {
					t.Fatalf("dead letter %q", dl[0].Message().Body)
				}
			case "Extend":
				nothing(t, f.direct, 3*time.Second)
			case "Retry(0)":
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				if ds, err := f.direct.Receive(ctx, 1); err != nil || len(ds) != 1 {
					t.Fatalf("Retry(0) said nil but the message is not visible at once: %v", err)
				}
			case "Retry(1s)":
				nothing(t, f.direct, 500*time.Millisecond)
				receive(t, f.direct, 1)
			}
		})
	}
}

// A publish cut before SQS saw it returns an error and stores nothing.
func TestCutMidPublish(t *testing.T) {
	t.Parallel()
	f := newCutFixture(t)
	f.px.Blackhole()
	res := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := f.relayed.Publish(ctx, queue.Outgoing{Body: []byte("lost?")})
		res <- err
	}()
	time.Sleep(50 * time.Millisecond)
	f.px.Cut()
	if err := <-res; err == nil {
		t.Fatal("Publish cut mid-call returned nil")
	}
	f.px.Close()
	nothing(t, f.direct, 300*time.Millisecond)
}
