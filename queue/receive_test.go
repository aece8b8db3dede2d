package queue_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store/memstore"
)

// scriptedSource answers each Receive with the next of its answers, then
// blocks until the context ends.
type scriptedSource struct {
	visibility time.Duration

	mu      sync.Mutex
	answers []scriptedAnswer
	calls   int
}

type scriptedAnswer struct {
	ds  []queue.Delivery
	err error
}

func (s *scriptedSource) Receive(ctx context.Context, _ int) ([]queue.Delivery, error) {
	s.mu.Lock()
	s.calls++
	if len(s.answers) > 0 {
		a := s.answers[0]
		s.answers = s.answers[1:]
		s.mu.Unlock()
		return a.ds, a.err
	}
	s.mu.Unlock()
	<-ctx.Done()
	return nil, ctx.Err()
}

func (s *scriptedSource) Visibility() time.Duration { return s.visibility }

// Deliveries a source hands out together with an error are handled, not
// dropped: dropped, they stay unsettled until their visibility lapses, and
// forever on a broker without one (AMQP: until the channel closes).
func TestDeliveriesReturnedWithAnErrorAreHandled(t *testing.T) {
	d := &fakeDelivery{m: queue.Message{ID: "1", ReceiveCount: 1}}
	src := &scriptedSource{answers: []scriptedAnswer{{ds: []queue.Delivery{d}, err: errors.New("connection reset after the first message")}}}
	c, err := queue.NewConsumer(src, idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler))), queue.MessageIDKey("m"), noop,
		queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(3 * time.Second)
	for {
		if got, _ := d.settled(); len(got) > 0 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			got, _ := d.settled()
			t.Fatalf("a delivery returned with a receive error: settled %v 3s later, want [ack]", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if got, _ := d.settled(); len(got) != 1 || got[0] != "ack" {
		t.Fatalf("settled %v, want [ack]", got)
	}
}

// emptySource answers every Receive at once with nothing (a short poll).
type emptySource struct{ calls atomic.Int64 }

func (s *emptySource) Receive(context.Context, int) ([]queue.Delivery, error) {
	s.calls.Add(1)
	return nil, nil
}
func (*emptySource) Visibility() time.Duration { return time.Minute }

// A source that returns nothing without waiting does not make the receive
// loop spin on the CPU it shares with the handlers.
func TestEmptyReceivesDoNotSpin(t *testing.T) {
	src := &emptySource{}
	c, err := queue.NewConsumer(src, idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler))), queue.MessageIDKey("m"), noop,
		queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := c.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if n := src.calls.Load(); n > 100 {
		t.Fatalf("%d receives in 500ms from a source that returns nothing at once, want a paced loop (at most 100)", n)
	}
}
