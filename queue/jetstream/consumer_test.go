package jetstream

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store/memstore"
)

// The stream's dedup window drops a republish with the same Nats-Msg-Id,
// but a copy without one (or after the window) is a second message: the
// ledger is what runs the effect once. Both copies are delivered and acked.
func TestConsumerLedgerBehindTheDedupWindow(t *testing.T) {
	_, js := connect(t, natsURL(t))
	f := newFixture(t, js, fixtureOpts{ackWait: 30 * time.Second})
	p, src := f.publisher(t, js), f.source(t, js)
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
	first := publish(t, p, queue.Outgoing{Body: []byte("order-42 alice@example.com"), DedupID: "order-42"})
	if dup := publish(t, p, queue.Outgoing{Body: []byte("order-42 alice@example.com"), DedupID: "order-42"}); !dup.Duplicate {
		t.Fatalf("republish inside the window: %+v, want Duplicate", dup)
	}
	second := publish(t, p, queue.Outgoing{Body: []byte("order-42 alice@example.com")}) // no dedup id: a new message
	if second.Duplicate || second.ID == first.ID {
		t.Fatalf("a publish without a dedup id: %+v, want a second message (first %+v)", second, first)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for f.streamMsgs(t) != 0 {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("after 30s the stream still holds %d messages", f.streamMsgs(t))
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if effects["order-42"] != 1 {
		t.Fatalf("effects %v, want order-42 once", effects)
	}
}
