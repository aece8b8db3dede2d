package queue_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testobserve"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/memqueue"
	"github.com/idemkit/idem/store/memstore"
)

// debugLevel makes a test's handler keep the consumer's DEBUG lines.
var debugLevel = &slog.HandlerOptions{Level: slog.LevelDebug}

// namedQueue is a memqueue with a name, as sqlqueue's queues have.
type namedQueue struct{ *memqueue.Queue }

func (namedQueue) Name() string { return "jobs" }

// handleOne publishes body, receives it and handles it with h on a
// consumer of a ledger that reports to rec, and returns the logs of both.
func handleOne(t *testing.T, rec *testobserve.Recorder, key queue.KeyFunc, h queue.Handler) (*memqueue.Queue, string) {
	t.Helper()
	ctx := context.Background()
	q := memqueue.New()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, debugLevel))
	l := idem.New(memstore.New(), idem.WithLogger(log), idem.WithObserver(rec))
	c, err := queue.NewConsumer(namedQueue{q}, l, key, h, queue.WithLogger(log), queue.WithMaxReceives(3))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Publish(ctx, queue.Outgoing{Body: []byte("x"), Attributes: map[string]string{"traceparent": "00-abc"}}); err != nil {
		t.Fatal(err)
	}
	ds, err := q.Receive(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	c.HandleBatch(ctx, ds)
	return q, logs.String()
}

// checkDelivery checks that rec saw a delivery whose ledger call nests
// in it, ended with outcome and reason, naming the ledger's attempt.
func checkDelivery(t *testing.T, rec *testobserve.Recorder, outcome, reason string) testobserve.Recorded {
	t.Helper()
	want := []idem.EventKind{idem.DeliveryStart, idem.OpStart, idem.OpEnd, idem.DeliveryEnd}
	if got := rec.Kinds(); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if err := rec.Check(); err != nil {
		t.Fatal(err)
	}
	evs := rec.Events()
	start, op, end := evs[0], evs[2], evs[3]
	if start.Queue != "jobs" || start.MessageID == "" || start.Receives != 1 || start.Attributes["traceparent"] != "00-abc" {
		t.Errorf("DeliveryStart %+v", start.Event)
	}
	if evs[1].Parent != start.Span {
		t.Errorf("the ledger's OpStart is not under the DeliveryStart's context")
	}
	if end.Outcome != outcome || end.Reason != reason || end.MessageID != start.MessageID || end.Queue != "jobs" || end.Duration <= 0 {
		t.Errorf("DeliveryEnd %+v, want %s (%s)", end.Event, outcome, reason)
	}
	if end.Key != op.Key || end.Fence != op.Fence || end.Fence == 0 || end.Attempt != op.Attempt || end.AttemptID != op.AttemptID {
		t.Errorf("DeliveryEnd names key %q fence %d attempt %d (%s); the ledger's OpEnd %q fence %d attempt %d (%s)",
			end.Key, end.Fence, end.Attempt, end.AttemptID, op.Key, op.Fence, op.Attempt, op.AttemptID)
	}
	return end
}

func TestConsumerReportsAnAckedDelivery(t *testing.T) {
	rec := new(testobserve.Recorder)
	_, logs := handleOne(t, rec, queue.MessageIDKey("m"), func(context.Context, queue.Message) ([]byte, error) { return nil, nil })
	checkDelivery(t, rec, "acked", "executed")
	// One INFO line per effect: the ledger's; the consumer's is DEBUG.
	if n := strings.Count(logs, "level=INFO"); n != 1 || !strings.Contains(logs, `level=INFO msg="idem executed"`) ||
		!strings.Contains(logs, `level=DEBUG msg="queue message executed"`) {
		t.Errorf("want one INFO line, the ledger's, and the consumer's at DEBUG; logs:\n%s", logs)
	}
}

func TestConsumerReportsARetriedDelivery(t *testing.T) {
	rec := new(testobserve.Recorder)
	q, _ := handleOne(t, rec, queue.MessageIDKey("m"), func(context.Context, queue.Message) ([]byte, error) { return nil, errors.New("smtp down") })
	end := checkDelivery(t, rec, "retried", "retried")
	if end.Delay <= 0 {
		t.Errorf("retried DeliveryEnd with delay %v", end.Delay)
	}
	if ready, held := q.Len(); ready+held != 1 {
		t.Errorf("ready %d held %d, want the message back in the queue", ready, held)
	}
}

// A dead letter's line and DeliveryEnd carry the attempt that ran the
// handler, as the ledger's line does (not fence=0 attempt=0).
func TestConsumerReportsADeadLetterWithItsAttempt(t *testing.T) {
	rec := new(testobserve.Recorder)
	_, logs := handleOne(t, rec, queue.MessageIDKey("m"), func(context.Context, queue.Message) ([]byte, error) {
		return nil, idem.Permanent(errors.New("no such user"))
	})
	end := checkDelivery(t, rec, "dead-lettered", "failed")
	line := ""
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, `msg="queue message dead-lettered"`) {
			line = l
		}
	}
	if want := fmt.Sprintf("fence=%d attempt=1 ", end.Fence); !strings.Contains(line, "level=WARN") || !strings.Contains(line, want) {
		t.Errorf("dead-letter line %q, want WARN with %q", line, want)
	}
}

// A message without a key is dead-lettered before the ledger is asked,
// and its reason says "undecodable" once.
func TestConsumerReportsAnUndecodableMessage(t *testing.T) {
	rec := new(testobserve.Recorder)
	q, logs := handleOne(t, rec, func(queue.Message) (idem.OperationKey, error) {
		return idem.OperationKey{}, queue.Undecodable(errors.New("no order id"))
	}, func(context.Context, queue.Message) ([]byte, error) { return nil, nil })
	if got, want := rec.Kinds(), []idem.EventKind{idem.DeliveryStart, idem.DeliveryEnd}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if err := rec.Check(); err != nil {
		t.Fatal(err)
	}
	if end, _ := rec.Last(idem.DeliveryEnd); end.Outcome != "dead-lettered" || end.Reason != "undecodable" || end.Key != "" {
		t.Errorf("DeliveryEnd %+v", end.Event)
	}
	dl := q.DeadLetters()
	if len(dl) != 1 || dl[0].Reason != "undecodable: no operation key: no order id" {
		t.Fatalf("dead letters %+v, want one with the reason saying undecodable once", dl)
	}
	if strings.Count(logs, "undecodable") != 2 { // cause=undecodable reason="undecodable: ..."
		t.Errorf("the line repeats itself:\n%s", logs)
	}
}
