package webhook

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqsqueue"
)

// sqsFIFO creates a FIFO queue on the SQS emulator for t and opens it.
func sqsFIFO(t *testing.T) *sqsqueue.Queue {
	t.Helper()
	ep := testenv.Require(t, testenv.SQS, "the webhook receiver on SQS FIFO (local-aws-sqs)")
	c := sqs.New(sqs.Options{Region: "us-east-1", BaseEndpoint: aws.String(ep),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test"}, nil
		})})
	b := make([]byte, 6)
	rand.Read(b)
	out, err := c.CreateQueue(context.Background(), &sqs.CreateQueueInput{
		QueueName:  aws.String("idem-webhook-" + hex.EncodeToString(b) + ".fifo"),
		Attributes: map[string]string{"FifoQueue": "true"},
	})
	if err != nil {
		t.Fatal(err)
	}
	url := aws.ToString(out.QueueUrl)
	t.Cleanup(func() { c.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: aws.String(url)}) })
	q, err := sqsqueue.Open(context.Background(), c, url, sqsqueue.Options{WaitTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// receiveSQS receives what q holds (acking it) until a receive comes back
// empty.
func receiveSQS(t *testing.T, q *sqsqueue.Queue) []queue.Message {
	t.Helper()
	var out []queue.Message
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		ds, err := q.Receive(ctx, 10)
		cancel()
		if len(ds) == 0 || err != nil {
			return out
		}
		for _, d := range ds {
			out = append(out, d.Message())
			if err := d.Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// The payment-notification receiver forwards each inbound event onto an SQS FIFO queue
// with MessageGroupId and MessageDeduplicationId both naming the event, the
// operation, never a timestamp or a random value. On the real queue
// (local-aws-sqs): the event is captured (200, not the 500 of a FIFO publish
// without a group), its retry is replayed without a second send, and when
// the ledger's completion fails after the publish (500, the sender retries,
// the retry takes the lapsed key over and publishes again) the queue drops
// the second copy on its DedupID: the queue holds one message.
func TestReceiverSQSFIFO(t *testing.T) {
	q := sqsFIFO(t)
	e := newEnv(t)
	fs := idemtest.NewFaultStore(e.store)
	l := idem.New(fs, idem.WithLogger(quiet), idem.WithLease(10*time.Second))
	s := mustStandard(t, testSecret)
	rc, err := NewReceiver("payments", s, l, Publish(q), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}

	if a := serve(rc, swRequest(t, s, "evt_1", `{"order":"o-1"}`, time.Now())); a.status != 200 {
		t.Fatalf("first delivery to a FIFO queue: %d %s, want 200", a.status, a.body)
	}
	if a := serve(rc, swRequest(t, s, "evt_1", `{"order":"o-1"}`, time.Now())); a.status != 200 || a.header.Get(ReplayedHeader) != "true" {
		t.Fatalf("the sender's retry: %d replayed=%q %s, want the first 200 replayed", a.status, a.header.Get(ReplayedHeader), a.body)
	}

	fs.Inject(idemtest.OpComplete, idemtest.Fault{Err: errInjected})
	if a := serve(rc, swRequest(t, s, "evt_2", `{"order":"o-2"}`, time.Now())); a.status != 500 {
		t.Fatalf("completion failed after the publish: %d %s, want 500", a.status, a.body)
	}
	fs.Heal(idemtest.OpComplete)
	e.clock.Add(11 * time.Second) // the lease lapses; the sender retries
	if a := serve(rc, swRequest(t, s, "evt_2", `{"order":"o-2"}`, time.Now())); a.status != 200 {
		t.Fatalf("retry after the lease: %d %s, want 200", a.status, a.body)
	}

	got := map[string]int{}
	for _, m := range receiveSQS(t, q) {
		id := m.Attributes[AttrEventID]
		got[id]++
		if want := Key("payments", id).String(); m.DedupID != want || m.GroupID == "" {
			t.Errorf("message of %s: GroupID %q DedupID %q, want a group and DedupID %q", id, m.GroupID, m.DedupID, want)
		}
	}
	if got["evt_1"] != 1 || got["evt_2"] != 1 || len(got) != 2 {
		t.Fatalf("messages per event %v, want one each of evt_1 and evt_2", got)
	}
}
