package memqueue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/memqueue"
	"github.com/idemkit/idem/queue/queuetest"
)

func TestConformance(t *testing.T) {
	queuetest.Run(t, queuetest.Harness{
		New: func(t *testing.T, vis time.Duration) (queue.Source, queue.Publisher) {
			q := memqueue.New(memqueue.WithVisibility(vis))
			return q, q
		},
		DeadLetters: func(t *testing.T, src queue.Source) []queuetest.DeadLetter {
			var out []queuetest.DeadLetter
			for _, d := range src.(*memqueue.Queue).DeadLetters() {
				out = append(out, queuetest.DeadLetter{Message: d.Message, Reason: d.Reason})
			}
			return out
		},
		Features: queuetest.Features{FIFO: true, DedupWindow: true, Delay: true, RetryDelay: true, DeadLetter: true},
	})
}

// A delivery settled once (by Ack, Retry or DeadLetter) holds nothing: any
// later settle or Extend is refused with ErrSettled and changes nothing. A
// Retry did not end the hold: a later Ack removed the retried message, and
// an Extend hid it again.
func TestSettledDeliveryRefusesEverything(t *testing.T) {
	ctx := context.Background()
	firsts := []queuetest.SettleOp{
		{Name: "Ack", Call: func(ctx context.Context, d queue.Delivery) error { return d.Ack(ctx) }},
		{Name: "Retry(1h)", Call: func(ctx context.Context, d queue.Delivery) error { return d.Retry(ctx, time.Hour) }},
		{Name: "DeadLetter", Call: func(ctx context.Context, d queue.Delivery) error { return d.DeadLetter(ctx, "x") }},
	}
	for _, first := range firsts {
		for _, then := range queuetest.SettleOps(time.Hour) {
			q := memqueue.New()
			if _, err := q.Publish(ctx, queue.Outgoing{Body: []byte("x")}); err != nil {
				t.Fatal(err)
			}
			ds, err := q.Receive(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			if err := first.Call(ctx, ds[0]); err != nil {
				t.Fatalf("%s: %v", first.Name, err)
			}
			ready, held := q.Len()
			dead := len(q.DeadLetters())
			if err := then.Call(ctx, ds[0]); !errors.Is(err, queue.ErrSettled) {
				t.Errorf("%s after %s: %v, want an error wrapping queue.ErrSettled", then.Name, first.Name, err)
			}
			if r, h := q.Len(); r != ready || h != held || len(q.DeadLetters()) != dead {
				t.Errorf("%s after %s changed the queue: ready %d→%d, held %d→%d, dead letters %d→%d",
					then.Name, first.Name, ready, r, held, h, dead, len(q.DeadLetters()))
			}
		}
	}
}

// A delivery whose message another receive took (its visibility lapsed)
// is refused with ErrReceiptExpired, not ErrSettled: it never settled.
func TestStaleDeliveryIsRefused(t *testing.T) {
	ctx := context.Background()
	q := memqueue.New(memqueue.WithVisibility(time.Millisecond))
	if _, err := q.Publish(ctx, queue.Outgoing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	first, err := q.Receive(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	second, err := q.Receive(ctx, 1) // after the first's visibility lapsed
	if err != nil {
		t.Fatal(err)
	}
	if err := first[0].Ack(ctx); !errors.Is(err, memqueue.ErrReceiptExpired) || errors.Is(err, queue.ErrSettled) {
		t.Fatalf("stale Ack: %v, want ErrReceiptExpired", err)
	}
	if err := second[0].Ack(ctx); err != nil {
		t.Fatalf("Ack of the current delivery: %v", err)
	}
}
