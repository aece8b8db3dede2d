package sqsqueue_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/queuetest"
	"github.com/idemkit/idem/queue/sqsqueue"
)

// TestConformance runs the queue conformance suite against a standard and
// a FIFO queue, each with its own dead-letter queue.
func TestConformance(t *testing.T) {
	for _, fifo := range []bool{false, true} {
		name := "standard"
		if fifo {
			name = "fifo"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := client(t)
			dl := &deadLetters{c: c, dlq: map[queue.Source]string{}, got: map[string][]queuetest.DeadLetter{}}
			queuetest.Run(t, queuetest.Harness{
				New: func(t *testing.T, visibility time.Duration) (queue.Source, queue.Publisher) {
					dlq, _ := newQueue(t, c, queueSpec{fifo: fifo})
					url, _ := newQueue(t, c, queueSpec{fifo: fifo, visibility: visibility})
					q := open(t, c, url, sqsqueue.Options{DeadLetterURL: dlq})
					dl.add(q, dlq)
					if fifo {
						return q, ownGroups{q}
					}
					return q, q
				},
				DeadLetters: dl.read,
				Features: queuetest.Features{
					FIFO:        fifo,
					DedupWindow: fifo, // reported from the returned MessageId (see the package doc)
					Delay:       !fifo,
					RetryDelay:  true,
					DeadLetter:  true,
					// Each message is a few HTTP calls to the emulator.
					LoadMessages: 1000,
				},
			})
		})
	}
}

// ownGroups publishes a message without a GroupID in a group of its own
// (and without a DedupID under a fresh one): SQS FIFO requires both, and
// the suite's unordered messages must not queue behind each other.
type ownGroups struct{ q *sqsqueue.Queue }

func (o ownGroups) Publish(ctx context.Context, m queue.Outgoing) (queue.Published, error) {
	if m.GroupID == "" {
		m.GroupID = "solo-" + randomID()
	}
	if m.DedupID == "" {
		m.DedupID = "once-" + randomID()
	}
	return o.q.Publish(ctx, m)
}

func randomID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// deadLetters reads each queue's dead-letter queue, keeping what it has
// read (the messages are deleted from the dead-letter queue as they are
// read, so that FIFO groups there do not block).
type deadLetters struct {
	c   *sqs.Client
	mu  sync.Mutex
	dlq map[queue.Source]string
	got map[string][]queuetest.DeadLetter
}

func (d *deadLetters) add(src queue.Source, dlq string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dlq[src] = dlq
}

func (d *deadLetters) read(t *testing.T, src queue.Source) []queuetest.DeadLetter {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	url, ok := d.dlq[src]
	if !ok {
		t.Fatalf("DeadLetters: source %v was not made by New", src)
	}
	for {
		out, err := d.c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(url), MaxNumberOfMessages: 10,
			AttributeNames:              []types.QueueAttributeName{types.QueueAttributeNameAll},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
			MessageAttributeNames:       []string{"All"},
		})
		if err != nil {
			t.Fatalf("reading dead letters: %v", err)
		}
		if len(out.Messages) == 0 {
			return d.got[url]
		}
		for _, m := range out.Messages {
			qm := queue.Message{ID: aws.ToString(m.MessageId), Body: []byte(aws.ToString(m.Body)), Attributes: map[string]string{}}
			for k, v := range m.MessageAttributes {
				qm.Attributes[k] = aws.ToString(v.StringValue)
			}
			d.got[url] = append(d.got[url], queuetest.DeadLetter{Message: qm, Reason: qm.Attributes[sqsqueue.ReasonAttribute]})
			if _, err := d.c.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatalf("deleting a read dead letter: %v", err)
			}
		}
	}
}
