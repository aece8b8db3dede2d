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
	"github.com/idemkit/idem/queue/memqueue"
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

// rival is another worker on the same queue: it takes every message that
// becomes visible and keeps it, recording what it got.
type rival struct {
	cancel context.CancelFunc
	done   chan struct{}
	got    []queue.Message
}

func startRival(q *memqueue.Queue) *rival {
	ctx, cancel := context.WithCancel(context.Background())
	r := &rival{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			ds, err := q.Receive(ctx, 10)
			if err != nil {
				return
			}
			for _, d := range ds {
				r.got = append(r.got, d.Message())
			}
		}
	}()
	return r
}

// stop stops r and returns the messages it received.
func (r *rival) stop() []queue.Message {
	r.cancel()
	<-r.done
	return r.got
}

// slowWork is a handler slower than a third of the queue's visibility that
// records, per message, the receive counts its calls saw.
type slowWork struct {
	mu    sync.Mutex
	calls map[string][]int
}

func (w *slowWork) handle(ctx context.Context, m queue.Message) ([]byte, error) {
	w.mu.Lock()
	w.calls[m.ID] = append(w.calls[m.ID], m.ReceiveCount)
	w.mu.Unlock()
	time.Sleep(300 * time.Millisecond)
	return nil, nil
}

func (w *slowWork) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, c := range w.calls {
		n += len(c)
	}
	return n
}

// check holds that each of the ids ran once, on its first receive, that
// nobody else received any while the consumer held it, and that every one
// was acked (none dead-lettered).
func (w *slowWork) check(t *testing.T, q *memqueue.Queue, stolen []queue.Message, ids []string) {
	t.Helper()
	for _, m := range stolen {
		t.Errorf("another worker received message %s (receive %d) while the consumer held it", m.ID, m.ReceiveCount)
	}
	w.mu.Lock()
	for _, id := range ids {
		if got := w.calls[id]; len(got) != 1 || got[0] != 1 {
			t.Errorf("message %s: handler calls saw receive counts %v, want one call on receive 1", id, got)
		}
	}
	w.mu.Unlock()
	if ready, held := q.Len(); ready+held != 0 {
		t.Errorf("after handling: ready %d held %d, want every message acked", ready, held)
	}
	if dl := q.DeadLetters(); len(dl) != 0 {
		t.Errorf("dead letters %+v, want none", dl)
	}
}

// publish puts n messages on q and returns their ids.
func publish(t *testing.T, q *memqueue.Queue, n int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		p, err := q.Publish(context.Background(), queue.Outgoing{Body: []byte{byte('a' + i)}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, p.ID)
	}
	return ids
}

// A batch of more messages than the concurrency runs a few at a time; the
// others wait for a free handler slot, and they are extended while they
// wait, as the running ones are. Unextended, the third message here lapses
// before its handler starts: another worker receives it (a receive counted
// toward the dead letter), and the consumer's ack of the copy it held fails,
// so the message comes back although it is done.
func TestMessagesWaitingForASlotStayInvisible(t *testing.T) {
	q := memqueue.New(memqueue.WithVisibility(400 * time.Millisecond))
	ids := publish(t, q, 3)
	w := &slowWork{calls: map[string][]int{}}
	c, err := queue.NewConsumer(q, idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler))),
		queue.MessageIDKey("m"), w.handle, queue.WithConcurrency(1), queue.WithHandlerTimeout(350*time.Millisecond),
		queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	ds, err := q.Receive(context.Background(), 3)
	if err != nil || len(ds) != 3 {
		t.Fatalf("received %d messages (%v), want 3", len(ds), err)
	}
	r := startRival(q)
	c.HandleBatch(context.Background(), ds)
	w.check(t, q, r.stop(), ids)
}

// The messages a source returns beyond what Run asked for wait for a free
// handler slot; they are extended while they wait, as the running ones are.
func TestMessagesBeyondTheAskStayInvisible(t *testing.T) {
	q := memqueue.New(memqueue.WithVisibility(400 * time.Millisecond))
	ids := publish(t, q, 3)
	w := &slowWork{calls: map[string][]int{}}
	c, err := queue.NewConsumer(greedySource{q}, idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler))),
		queue.MessageIDKey("m"), w.handle, queue.WithConcurrency(1), queue.WithHandlerTimeout(350*time.Millisecond),
		queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for { // the consumer holds all three: asked for one, got three
		if _, held := q.Len(); held == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the consumer did not receive the messages")
		}
		time.Sleep(time.Millisecond)
	}
	r := startRival(q)
	for w.count() < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel() // Run lets the last handler finish
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	w.check(t, q, r.stop(), ids)
}

// Messages waiting for a slot when Run stops are handed back at once, and
// no longer extended from then on; until then they were extended.
func TestWaitingMessagesHandedBackWhenRunStops(t *testing.T) {
	received := time.Now()
	var ds []queue.Delivery
	var bds []*brokerDelivery
	for _, id := range []string{"1", "2", "3"} {
		d := &brokerDelivery{fakeDelivery: &fakeDelivery{m: queue.Message{ID: id, ReceiveCount: 1}}, until: received.Add(time.Second)}
		ds, bds = append(ds, d), append(bds, d)
	}
	src := &scriptedSource{visibility: time.Second, answers: []scriptedAnswer{{ds: ds}}}
	c, err := queue.NewConsumer(src, idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler))),
		queue.MessageIDKey("m"), func(context.Context, queue.Message) ([]byte, error) {
			time.Sleep(400 * time.Millisecond)
			return nil, nil
		}, queue.WithConcurrency(1), queue.WithHandlerTimeout(500*time.Millisecond), queue.WithExtendEvery(50*time.Millisecond), queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	time.Sleep(200 * time.Millisecond)
	cancel()
	stopped := time.Now()
	for _, d := range bds[1:] {
		for { // handed back at once, not after the running handler
			if got, _ := d.settled(); len(got) > 0 || time.Since(stopped) > 150*time.Millisecond {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if got, _ := d.settled(); len(got) != 1 || got[0] != "retry" {
			t.Errorf("message %s waiting for a slot when Run stopped: settled %v 150ms later, want [retry]", d.m.ID, got)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond) // an extension due after a settle would have come
	for i, d := range bds {
		want := []string{"ack", "retry", "retry"}[i]
		if got, _ := d.settled(); len(got) != 1 || got[0] != want {
			t.Errorf("message %s settled %v, want [%s]", d.m.ID, got, want)
		}
		d.vmu.Lock()
		if !d.until.After(received.Add(time.Second + 100*time.Millisecond)) {
			t.Errorf("message %s was never extended while the consumer held it", d.m.ID)
		}
		if d.late > 0 {
			t.Errorf("message %s extended %d times after it was settled", d.m.ID, d.late)
		}
		d.vmu.Unlock()
	}
}

// HandleBatch extends the messages waiting for a slot until its context's
// deadline (an invocation's end), not after, and hands them back then.
func TestWaitingMessagesStopExtendingAtTheDeadline(t *testing.T) {
	received := time.Now()
	var ds []queue.Delivery
	var bds []*brokerDelivery
	for _, id := range []string{"1", "2", "3"} {
		d := &brokerDelivery{fakeDelivery: &fakeDelivery{m: queue.Message{ID: id, ReceiveCount: 1}}, until: received.Add(time.Second)}
		ds, bds = append(ds, d), append(bds, d)
	}
	c, err := queue.NewConsumer(&secondVisibility{}, idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler))),
		queue.MessageIDKey("m"), func(ctx context.Context, _ queue.Message) ([]byte, error) {
			select {
			case <-time.After(400 * time.Millisecond):
				return nil, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}, queue.WithConcurrency(1), queue.WithHandlerTimeout(500*time.Millisecond), queue.WithExtendEvery(50*time.Millisecond), queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	deadline, _ := ctx.Deadline()
	c.HandleBatch(ctx, ds)
	time.Sleep(150 * time.Millisecond) // an extension due after the deadline would have come
	for i, d := range bds {
		want := []string{"ack", "retry", "retry"}[i]
		if got, _ := d.settled(); len(got) != 1 || got[0] != want {
			t.Errorf("message %s settled %v, want [%s]", d.m.ID, got, want)
		}
		d.vmu.Lock()
		last := d.until.Add(-time.Second) // extended by the visibility, a second
		switch {
		case i == 2 && !last.After(received.Add(300*time.Millisecond)):
			t.Errorf("message %s was last extended %v after the receive, want it extended while it waited (until the deadline, 600ms)", d.m.ID, last.Sub(received))
		case last.After(deadline.Add(20 * time.Millisecond)):
			t.Errorf("message %s was extended %v past the deadline", d.m.ID, last.Sub(deadline))
		}
		if d.late > 0 {
			t.Errorf("message %s extended %d times after it was settled", d.m.ID, d.late)
		}
		d.vmu.Unlock()
	}
}
