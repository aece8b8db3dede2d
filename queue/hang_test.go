package queue_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/memqueue"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

// A handler that ignores its cancelled context does not hold its message
// for as long as it hangs: past its timeout and the margin, the delivery is
// no longer extended, and once its visibility lapses the message is
// delivered again. The ledger's lease, extended while the hung handler
// runs, keeps the effect from running twice: the second delivery finds the
// key busy, and once the hung handler ends, a third finds it done.
func TestHungHandlerLosesItsDelivery(t *testing.T) {
	const (
		visibility     = 300 * time.Millisecond
		handlerTimeout = 50 * time.Millisecond
		margin         = 50 * time.Millisecond
	)
	q := memqueue.New(memqueue.WithVisibility(visibility))
	var logs testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logs, debugLevel))
	l := idem.New(memstore.New(), idem.WithLease(time.Second), idem.WithLogger(log))
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	var calls atomic.Int32
	started := make(chan time.Time, 1)
	c, err := queue.NewConsumer(q, l, queue.MessageIDKey("m"), func(context.Context, queue.Message) ([]byte, error) {
		if calls.Add(1) == 1 {
			started <- time.Now()
			<-release // ignores its context
		}
		// A second run (the key taken over: a failure below) returns at
		// once, so that the test fails instead of hanging until -timeout.
		return []byte("sent"), nil
	}, queue.WithHandlerTimeout(handlerTimeout), queue.WithExtendEvery(visibility/6), queue.WithOverrunMargin(margin),
		queue.WithBusyDelay(10*time.Millisecond), queue.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := q.Publish(ctx, queue.Outgoing{Body: []byte("receipt 42")}); err != nil {
		t.Fatal(err)
	}
	receive := func(within time.Duration) []queue.Delivery {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		ds, err := q.Receive(rctx, 1)
		if err != nil {
			t.Fatalf("the message was not delivered again within %v while its handler hung past its timeout (%v) and margin (%v): "+
				"its delivery is still extended: %v", within, handlerTimeout, margin, err)
		}
		return ds
	}
	first := receive(time.Second)
	hung := make(chan struct{})
	go func() {
		defer close(hung)
		c.HandleBatch(ctx, first)
	}()
	began := <-started

	second := receive(5 * time.Second)
	if took := time.Since(began); took < handlerTimeout+margin {
		t.Fatalf("delivered again %v after the handler started, before its timeout and margin (%v)", took, handlerTimeout+margin)
	}
	c.HandleBatch(ctx, second)
	if n := calls.Load(); n != 1 {
		t.Fatalf("the handler ran %d times while the first attempt held the key, want 1", n)
	}
	if s := logs.String(); !strings.Contains(s, `msg="queue message busy"`) || !strings.Contains(s, "queue: handler outlived its timeout") {
		t.Fatalf("want a busy line for the second delivery and a line for the hung handler's delivery; logs:\n%s", s)
	}

	unblock()
	select {
	case <-hung:
	case <-time.After(5 * time.Second):
		t.Fatal("the first HandleBatch did not return 5s after its handler did")
	}
	c.HandleBatch(ctx, receive(5*time.Second)) // the busy retry: now done
	if n := calls.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
	if ready, held := q.Len(); ready+held != 0 {
		t.Fatalf("the queue holds %d ready and %d held messages, want none (acked as replayed); logs:\n%s", ready, held, logs.String())
	}
}

// slowComplete is a store whose Complete takes delay (or until its context
// ends): a store under load.
type slowComplete struct {
	store.Store
	delay time.Duration
}

func (s slowComplete) Finish(ctx context.Context, r store.FinishRequest) error {
	if r.Outcome != store.OutcomeCompleted {
		return s.Store.Finish(ctx, r)
	}
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Store.Finish(ctx, r)
}

// A handler that honours its context, run to its timeout, and then a
// completion write slower than the source's visibility: the delivery stays
// invisible until the outcome is recorded and the message acked. The bound
// on a hung handler's extensions leaves it room for the ledger's closing
// writes: no other receiver gets the message.
func TestSlowCompletionKeepsDeliveryInvisible(t *testing.T) {
	const (
		visibility     = 300 * time.Millisecond
		handlerTimeout = 50 * time.Millisecond
		completeDelay  = 2 * visibility
	)
	q := memqueue.New(memqueue.WithVisibility(visibility))
	var logs testlog.Buffer
	log := slog.New(slog.NewTextHandler(&logs, debugLevel))
	l := idem.New(slowComplete{Store: memstore.New(), delay: completeDelay}, idem.WithLease(time.Second), idem.WithLogger(log))
	var calls atomic.Int32
	c, err := queue.NewConsumer(q, l, queue.MessageIDKey("m"), func(ctx context.Context, _ queue.Message) ([]byte, error) {
		calls.Add(1)
		<-ctx.Done() // runs to its timeout, then ends as asked
		return []byte("sent"), nil
	}, queue.WithHandlerTimeout(handlerTimeout), queue.WithExtendEvery(visibility/6), queue.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := q.Publish(ctx, queue.Outgoing{Body: []byte("receipt 42")}); err != nil {
		t.Fatal(err)
	}
	ds, err := q.Receive(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}

	// Another worker, receiving all along.
	wctx, stop := context.WithCancel(ctx)
	var stolen atomic.Int32
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		for wctx.Err() == nil {
			if got, _ := q.Receive(wctx, 1); len(got) > 0 {
				stolen.Add(1)
			}
		}
	}()
	began := time.Now()
	c.HandleBatch(ctx, ds)
	took := time.Since(began)
	stop()
	<-watching

	if n := stolen.Load(); n != 0 {
		t.Fatalf("another receiver got the message %d times while its completion was being written; logs:\n%s", n, logs.String())
	}
	if took < handlerTimeout+completeDelay {
		t.Fatalf("HandleBatch took %v, less than the handler timeout and the completion's delay: the store was not slow", took)
	}
	if s := logs.String(); !strings.Contains(s, `msg="queue message executed"`) || strings.Contains(s, "settle_error") ||
		strings.Contains(s, "outlived its timeout") {
		t.Fatalf("want the message executed and acked, with no settle error and no overrun; logs:\n%s", s)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
	if ready, held := q.Len(); ready+held != 0 {
		t.Fatalf("the queue holds %d ready and %d held messages, want none", ready, held)
	}
}
