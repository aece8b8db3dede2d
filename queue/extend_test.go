package queue_test

import (
	"context"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store/memstore"
)

// hangingExtend is a delivery whose Extend does not return until its
// context ends (a broker call with no timeout of its own, a blackholed
// connection).
type hangingExtend struct {
	*fakeDelivery
	extending chan struct{}
}

func (d *hangingExtend) Extend(ctx context.Context, _ time.Duration) error {
	select {
	case d.extending <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}

type shortVisibility struct{ fakeSource }

func (*shortVisibility) Visibility() time.Duration { return 300 * time.Millisecond }

// An extension that hangs does not hold up the settlement of a message
// whose handler has finished: the message is acked once its outcome is
// recorded, not when (if ever) the broker answers the extension.
func TestHangingExtendDoesNotBlockSettlement(t *testing.T) {
	c, err := queue.NewConsumer(&shortVisibility{}, idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler))),
		queue.MessageIDKey("m"), func(context.Context, queue.Message) ([]byte, error) {
			time.Sleep(100 * time.Millisecond) // past the first extension
			return nil, nil
		},
		queue.WithHandlerTimeout(200*time.Millisecond), queue.WithExtendEvery(20*time.Millisecond),
		queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	d := &hangingExtend{fakeDelivery: &fakeDelivery{m: queue.Message{ID: "1", ReceiveCount: 1}}, extending: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		c.HandleBatch(context.Background(), []queue.Delivery{d})
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("HandleBatch did not return 5s after the handler finished: settling waits for an extension that hangs")
	}
	if got, _ := d.settled(); len(got) != 1 || got[0] != "ack" {
		t.Fatalf("settled %v, want [ack]", got)
	}
}

// countingExtend counts extensions.
type countingExtend struct {
	*fakeDelivery
	extends atomic.Int32
}

func (d *countingExtend) Extend(context.Context, time.Duration) error {
	d.extends.Add(1)
	return nil
}

// A handler that ends its goroutine (runtime.Goexit, t.FailNow in a test
// handler) leaves its message as a crash would: the delivery is no longer
// extended, so it comes back when its visibility lapses. Extended for as
// long as the consumer runs, it would never come back, and its FIFO group
// would wait behind it for good.
func TestHandlerGoexitStopsExtending(t *testing.T) {
	c, err := queue.NewConsumer(&shortVisibility{}, idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler))),
		queue.MessageIDKey("m"), func(context.Context, queue.Message) ([]byte, error) {
			time.Sleep(50 * time.Millisecond) // past the first extension
			runtime.Goexit()
			return nil, nil
		},
		queue.WithHandlerTimeout(200*time.Millisecond), queue.WithExtendEvery(20*time.Millisecond),
		queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	d := &countingExtend{fakeDelivery: &fakeDelivery{m: queue.Message{ID: "1", ReceiveCount: 1}}}
	c.HandleBatch(context.Background(), []queue.Delivery{d})
	time.Sleep(50 * time.Millisecond)
	n := d.extends.Load()
	time.Sleep(200 * time.Millisecond)
	if m := d.extends.Load(); m != n {
		t.Fatalf("the delivery was extended %d more times after its handler's goroutine ended", m-n)
	}
}
