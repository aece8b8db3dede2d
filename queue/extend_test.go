package queue_test

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"sync"
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

// brokerDelivery keeps a visibility deadline as a broker does: Receive set
// it, Extend moves it, and an Extend after the delivery is settled is
// refused.
type brokerDelivery struct {
	*fakeDelivery
	vmu   sync.Mutex
	until time.Time
	done  bool
	late  int // extensions asked after the delivery was settled
}

func (d *brokerDelivery) Extend(_ context.Context, by time.Duration) error {
	d.vmu.Lock()
	defer d.vmu.Unlock()
	if d.done {
		d.late++
		return queue.ErrSettled
	}
	d.until = time.Now().Add(by)
	return nil
}

func (d *brokerDelivery) settle(f func() error) error {
	d.vmu.Lock()
	d.done = true
	d.vmu.Unlock()
	return f()
}

func (d *brokerDelivery) Ack(ctx context.Context) error {
	return d.settle(func() error { return d.fakeDelivery.Ack(ctx) })
}

func (d *brokerDelivery) Retry(ctx context.Context, delay time.Duration) error {
	return d.settle(func() error { return d.fakeDelivery.Retry(ctx, delay) })
}

// left is how long d stays invisible from now (negative once it lapsed).
func (d *brokerDelivery) left() time.Duration {
	d.vmu.Lock()
	defer d.vmu.Unlock()
	return time.Until(d.until)
}

type secondVisibility struct{ fakeSource }

func (*secondVisibility) Visibility() time.Duration { return time.Second }

// The messages of a FIFO group received in one batch (SQS FIFO hands out
// up to ten of a group at once) wait for the earlier ones; while they wait
// they are extended as the running one is. Unextended, the fourth one here
// would start half a visibility after it lapsed: meanwhile the broker hands
// it to another worker, which may run it before the third is done, and
// every such receive counts toward the dead letter. A message held back
// after an earlier one failed is extended until it is handed back, and no
// message is extended after it is settled.
func TestWaitingMessagesOfAGroupStayInvisible(t *testing.T) {
	byID := map[string]*brokerDelivery{}
	var (
		mu   sync.Mutex
		left = map[string]time.Duration{} // visibility left when its handler started
	)
	c, err := queue.NewConsumer(&secondVisibility{}, idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler))),
		queue.MessageIDKey("m"), func(_ context.Context, m queue.Message) ([]byte, error) {
			mu.Lock()
			left[m.ID] = byID[m.ID].left()
			mu.Unlock()
			time.Sleep(500 * time.Millisecond)
			if m.ID == "g4" {
				return nil, errors.New("transient")
			}
			return nil, nil
		},
		queue.WithHandlerTimeout(900*time.Millisecond), queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	received := time.Now()
	var ds []queue.Delivery
	for _, id := range []string{"g1", "g2", "g3", "g4", "g5", "g6"} {
		d := &brokerDelivery{fakeDelivery: &fakeDelivery{m: queue.Message{ID: id, GroupID: "g", ReceiveCount: 1}}, until: received.Add(time.Second)}
		byID[id] = d
		ds = append(ds, d)
	}
	c.HandleBatch(context.Background(), ds)
	// Handlers start at 0, 0.5s, 1s and 1.5s; g4 fails at 2s and g5, g6
	// are held back then. Extended every third of a second by a second, a
	// message always has more than half a second left.
	for _, id := range []string{"g1", "g2", "g3", "g4"} {
		if l, ok := left[id]; !ok || l < 300*time.Millisecond {
			t.Errorf("%s's handler started with %v of visibility left (ran %v), want it kept invisible while it waited", id, l, ok)
		}
	}
	want := map[string]string{"g1": "ack", "g2": "ack", "g3": "ack", "g4": "retry", "g5": "retry", "g6": "retry"}
	for _, id := range []string{"g5", "g6"} {
		d := byID[id]
		d.vmu.Lock()
		if over := d.until.Sub(received); over < 1500*time.Millisecond {
			t.Errorf("%s was last made invisible until %v after the receive, want it extended while it waited (2s)", id, over)
		}
		d.vmu.Unlock()
	}
	time.Sleep(500 * time.Millisecond) // an extension that was due after the settle would have come
	for id, d := range byID {
		if got, _ := d.settled(); len(got) != 1 || got[0] != want[id] {
			t.Errorf("%s settled %v, want [%s]", id, got, want[id])
		}
		d.vmu.Lock()
		if d.late > 0 {
			t.Errorf("%s extended %d times after it was settled", id, d.late)
		}
		d.vmu.Unlock()
	}
}
