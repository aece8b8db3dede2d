package amqpqueue

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store/memstore"
)

// countingSource counts what the broker hands out and what is acked.
type countingSource struct {
	queue.Source
	received, acked atomic.Int32
	ackFailed       atomic.Int32
	mu              sync.Mutex
	ids             map[string]bool // message ids delivered
	ackedIDs        map[string]bool // message ids acked without error
}

// ackedDistinct is how many distinct messages were acked without error.
func (s *countingSource) ackedDistinct() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ackedIDs)
}

func (s *countingSource) Receive(ctx context.Context, max int) ([]queue.Delivery, error) {
	ds, err := s.Source.Receive(ctx, max)
	s.received.Add(int32(len(ds)))
	s.mu.Lock()
	if s.ids == nil {
		s.ids = map[string]bool{}
	}
	for _, d := range ds {
		s.ids[d.Message().ID] = true
	}
	s.mu.Unlock()
	for i, d := range ds {
		ds[i] = &countingDelivery{Delivery: d, s: s}
	}
	return ds, err
}

type countingDelivery struct {
	queue.Delivery
	s *countingSource
}

func (d *countingDelivery) Ack(ctx context.Context) error {
	err := d.Delivery.Ack(ctx)
	if err != nil {
		d.s.ackFailed.Add(1)
		return err
	}
	d.s.acked.Add(1)
	d.s.mu.Lock()
	if d.s.ackedIDs == nil {
		d.s.ackedIDs = map[string]bool{}
	}
	d.s.ackedIDs[d.Message().ID] = true
	d.s.mu.Unlock()
	return nil
}

// RabbitMQ has no dedup, so the ledger is the only line: the same order
// published twice (one DedupID, as a retrying producer would) is delivered
// twice by the broker, both deliveries are acked, and the effect runs once.
func TestConsumerLedgerIsTheOnlyLine(t *testing.T) {
	bothKinds(t, func(t *testing.T, quorum bool) {
		f := newFixture(t, quorum)
		p := f.publisher(t, f.conn)
		src := &countingSource{Source: f.source(t, f.conn)}
		store := memstore.New()
		t.Cleanup(func() { store.Close() })
		var mu sync.Mutex
		effects := map[string]int{}
		quiet := slog.New(slog.DiscardHandler)
		c, err := queue.NewConsumer(src, idem.New(store, idem.WithLogger(quiet)),
			func(m queue.Message) (idem.OperationKey, error) {
				order, _, _ := strings.Cut(string(m.Body), " ")
				return idem.Key("receipt", order), nil
			},
			func(_ context.Context, m queue.Message) ([]byte, error) {
				mu.Lock()
				defer mu.Unlock()
				order, _, _ := strings.Cut(string(m.Body), " ")
				effects[order]++
				return []byte("sent"), nil
			}, queue.WithBusyDelay(100*time.Millisecond), queue.WithLogger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		a := publish(t, p, queue.Outgoing{Body: []byte("order-42 alice@example.com"), DedupID: "order-42"})
		b := publish(t, p, queue.Outgoing{Body: []byte("order-42 alice@example.com"), DedupID: "order-42"})
		if a.Duplicate || b.Duplicate {
			t.Fatalf("RabbitMQ reported a duplicate: %+v %+v", a, b)
		}
		publish(t, p, queue.Outgoing{Body: []byte("order-43 bob@example.com")})

		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		deadline := time.Now().Add(30 * time.Second)
		for src.acked.Load() < 3 {
			if time.Now().After(deadline) {
				cancel()
				t.Fatalf("after 30s: %d received, %d acked, want 3 acked", src.received.Load(), src.acked.Load())
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		// Both copies of order-42 arrive (one may come back once more if it
		// found the other's attempt busy).
		if n := len(src.ids); n != 3 || !src.ids[a.ID] || !src.ids[b.ID] {
			t.Fatalf("the broker delivered %d distinct messages, want 3 (both copies of order-42)", n)
		}
		mu.Lock()
		defer mu.Unlock()
		if effects["order-42"] != 1 || effects["order-43"] != 1 {
			t.Fatalf("effects %v, want each order once", effects)
		}
		if err := src.Source.(*Source).Close(); err != nil {
			t.Fatal(err)
		}
		if n := f.count(t, f.cfg.Queue); n != 0 {
			t.Fatalf("%d messages left in the queue", n)
		}
	})
}
