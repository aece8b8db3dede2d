package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

// gatedStore is a memstore whose claims wait at a gate and whose batch
// calls are counted, so tests can make batches form on purpose.
type gatedStore struct {
	*memstore.Store
	gate      atomic.Pointer[chan struct{}] // claims wait until it is closed
	inClaim   atomic.Int32                  // claims (single or batch) waiting at the gate
	mu        sync.Mutex
	waiting   map[string]int // keys of the claims waiting at the gate
	single    atomic.Int32
	batches   atomic.Int32
	batched   atomic.Int32 // requests sent in batches
	completes atomic.Int32 // FinishBatch calls
	failBatch error        // ClaimBatch and FinishBatch fail with it
}

func newGatedStore() *gatedStore {
	g := &gatedStore{Store: memstore.New()}
	g.shut()
	return g
}

// shut puts up a new closed gate for the claims that come next.
func (g *gatedStore) shut() {
	ch := make(chan struct{})
	g.gate.Store(&ch)
}

// isWaiting reports whether a claim of key waits at the gate.
func (g *gatedStore) isWaiting(key string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiting[key] > 0
}

// open lets the claims waiting at the gate, and those that come, through.
func (g *gatedStore) open() { close(*g.gate.Load()) }

func (g *gatedStore) wait(ctx context.Context, keys ...string) error {
	g.inClaim.Add(1)
	defer g.inClaim.Add(-1)
	g.mu.Lock()
	if g.waiting == nil {
		g.waiting = map[string]int{}
	}
	for _, k := range keys {
		g.waiting[k]++
	}
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		for _, k := range keys {
			g.waiting[k]--
		}
		g.mu.Unlock()
	}()
	select {
	case <-*g.gate.Load():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gatedStore) Claim(ctx context.Context, r store.ClaimRequest) (store.ClaimResult, error) {
	g.single.Add(1)
	if err := g.wait(ctx, r.Key); err != nil {
		return store.ClaimResult{}, err
	}
	return g.Store.Claim(ctx, r)
}

func (g *gatedStore) ClaimBatch(ctx context.Context, rs []store.ClaimRequest) ([]store.ClaimResult, error) {
	g.batches.Add(1)
	g.batched.Add(int32(len(rs)))
	keys := make([]string, len(rs))
	for i, r := range rs {
		keys[i] = r.Key
	}
	if err := g.wait(ctx, keys...); err != nil {
		return nil, err
	}
	if g.failBatch != nil {
		return nil, g.failBatch
	}
	return g.Store.ClaimBatch(ctx, rs)
}

func (g *gatedStore) FinishBatch(ctx context.Context, rs []store.FinishRequest) ([]error, error) {
	g.completes.Add(1)
	if g.failBatch != nil {
		return nil, g.failBatch
	}
	errs := make([]error, len(rs))
	for i, r := range rs {
		errs[i] = g.Store.Finish(ctx, r)
	}
	return errs, nil
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// occupy starts CoalescingFlights calls that wait at the store's gate, so
// that every later call queues for a batch. It returns a WaitGroup for them.
func occupy(t *testing.T, l *idem.Ledger, g *gatedStore, fn func(context.Context) ([]byte, error)) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	for i := range idem.CoalescingFlights {
		wg.Go(func() {
			if _, err := l.Do(context.Background(), idem.Key("lone", fmt.Sprint(i)), fn); err != nil {
				t.Errorf("lone call %d: %v", i, err)
			}
		})
	}
	waitFor(t, "the lone calls to reach the store", func() bool { return g.inClaim.Load() == int32(idem.CoalescingFlights) })
	return &wg
}

func quietLedger(s store.Store, opts ...idem.Option) *idem.Ledger {
	return idem.New(s, append([]idem.Option{idem.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
}

// coalescingLedger is a quietLedger that coalesces at any load
// (WithCoalescingFrom(1)), so that a few calls make batches
// (TestCoalescingOnlyUnderLoad tests the load that starts and stops
// coalescing).
func coalescingLedger(s store.Store, opts ...idem.Option) *idem.Ledger {
	return quietLedger(s, append(opts, idem.WithCoalescingFrom(1))...)
}

// Calls made while every flight is busy go to the store together, each
// call keeps its own outcome, and a lone call is sent as a plain Claim.
func TestCoalescingBatchesCallsMadeWhileTheStoreIsBusy(t *testing.T) {
	g := newGatedStore()
	l := coalescingLedger(g, idem.WithCoalescing(8))
	ctx := context.Background()

	// A completed key, so one queued call is a replay.
	g.open()
	if _, err := l.Do(ctx, idem.Key("done"), func(context.Context) ([]byte, error) { return []byte("first"), nil }); err != nil {
		t.Fatal(err)
	}
	if g.single.Load() != 1 || g.batches.Load() != 0 {
		t.Fatalf("a lone call: %d claims, %d batches; want 1 claim", g.single.Load(), g.batches.Load())
	}
	g.shut()

	var runs atomic.Int32
	fn := func(context.Context) ([]byte, error) { runs.Add(1); return []byte("ok"), nil }
	lone := occupy(t, l, g, fn)
	const queued = 20
	results := make([]idem.Result, queued)
	errs := make([]error, queued)
	var wg sync.WaitGroup
	for i := range queued {
		key := idem.Key("k", fmt.Sprint(i%19)) // keys 0 and 19 share a key
		if i == 5 {
			key = idem.Key("done")
		}
		wg.Go(func() { results[i], errs[i] = l.Do(ctx, key, fn) })
	}
	waitFor(t, "the calls to queue", func() bool { return idem.CoalescingQueued(l) == queued })
	g.open()
	wg.Wait()
	lone.Wait()

	if got := g.batched.Load(); got != queued {
		t.Errorf("%d requests went in batches, want %d", got, queued)
	}
	if b := g.batches.Load(); b < 3 || b > 4 { // 20 in batches of at most 8
		t.Errorf("%d batches for %d queued calls of at most 8, want 3 (or 4)", b, queued)
	}
	if !results[5].Replayed || string(results[5].Value) != "first" || errs[5] != nil {
		t.Errorf("the completed key in a batch: %+v, %v; want a replay of \"first\"", results[5], errs[5])
	}
	// Keys 0 and 19 are the same key in one batch: one ran, the other
	// found it running (busy) or done.
	a, b := errs[0], errs[19]
	if (a == nil) == (b == nil) && !(results[0].Replayed || results[19].Replayed) {
		t.Errorf("the same key twice in a batch: %v / %v, results %+v / %+v; want one run, one busy or replay", a, b, results[0], results[19])
	}
	for _, err := range []error{a, b} {
		if err != nil && !errors.Is(err, idem.ErrInProgress) {
			t.Errorf("the same key twice in a batch: %v, want ErrInProgress", err)
		}
	}
	if want := int32(idem.CoalescingFlights + 19 - 1); runs.Load() != want { // 19 distinct new keys, one a replay
		t.Errorf("fn ran %d times, want %d", runs.Load(), want)
	}
	for i := range queued {
		if i == 5 || i == 0 || i == 19 {
			continue
		}
		if errs[i] != nil || string(results[i].Value) != "ok" || results[i].Replayed || results[i].Attempt != 1 || results[i].Takeover {
			t.Errorf("call %d: %+v, %v; want a fresh first attempt", i, results[i], errs[i])
		}
	}
}

// A batch the store fails is every waiting call's store error, never an
// outcome, and fn does not run.
func TestCoalescingBatchFailureIsEveryCallersStoreError(t *testing.T) {
	g := newGatedStore()
	g.failBatch = errors.New("connection reset")
	l := coalescingLedger(g, idem.WithCoalescing(16))
	var runs atomic.Int32
	fn := func(context.Context) ([]byte, error) { runs.Add(1); return nil, nil }
	lone := occupy(t, l, g, fn)
	const queued = 5
	errs := make([]error, queued)
	var wg sync.WaitGroup
	for i := range queued {
		wg.Go(func() { _, errs[i] = l.Do(context.Background(), idem.Key("k", fmt.Sprint(i)), fn) })
	}
	waitFor(t, "the calls to queue", func() bool { return idem.CoalescingQueued(l) == queued })
	g.open()
	wg.Wait()
	lone.Wait()
	var se *idem.StoreError
	for i, err := range errs {
		if !errors.As(err, &se) || se.Op != "claim" {
			t.Errorf("call %d: %v, want a *StoreError of the claim", i, err)
		}
	}
	if runs.Load() != int32(idem.CoalescingFlights) {
		t.Errorf("fn ran %d times, want only the %d lone calls", runs.Load(), idem.CoalescingFlights)
	}
}

// A caller whose context ends while its claim waits in the queue is not
// sent; one whose context ends after its batch left gets its claim
// released, so the key is free at once, even under AtMostOnce.
func TestCoalescingCallerThatLeaves(t *testing.T) {
	g := newGatedStore()
	l := coalescingLedger(g, idem.WithCoalescing(16), idem.WithPolicy(idem.AtMostOnce))
	fn := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
	lone := occupy(t, l, g, fn)

	// Queued, then leaves before any flight lands: never sent.
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() {
		_, err := l.Do(ctx, idem.Key("queued"), fn)
		left <- err
	}()
	waitFor(t, "the call to queue", func() bool { return idem.CoalescingQueued(l) == 1 })
	cancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("a queued call whose context ended: %v, want context.Canceled", err)
	}
	if n := idem.CoalescingQueued(l); n != 0 {
		t.Fatalf("%d calls still queued after the caller left", n)
	}

	// Sent in a batch, then leaves while the store holds the batch.
	ctx2, cancel2 := context.WithCancel(context.Background())
	go func() {
		_, err := l.Do(ctx2, idem.Key("sent"), fn)
		left <- err
	}()
	var stay sync.WaitGroup
	stay.Go(func() { _, _ = l.Do(context.Background(), idem.Key("stays"), fn) })
	waitFor(t, "two calls to queue", func() bool { return idem.CoalescingQueued(l) == 2 })
	// Let one lone flight land: it sends the queued two as a batch, which
	// waits at the gate again.
	g.gate2(t, func() {
		waitFor(t, "the batch to reach the store", func() bool { return g.batches.Load() == 1 })
	})
	cancel2()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("a sent call whose context ended: %v, want context.Canceled", err)
	}
	g.open()
	stay.Wait()
	lone.Wait()
	waitFor(t, "the orphaned claim to be released", func() bool {
		rec, err := g.Get(context.Background(), "sent")
		return err == nil && rec.Status == idem.StatusReleased
	})
	res, err := l.Do(context.Background(), idem.Key("sent"), fn)
	if err != nil || res.Replayed || string(res.Value) != "ok" {
		t.Fatalf("the key of a caller that left: %+v, %v; want it to run (fn never ran before)", res, err)
	}
}

// gate2 wakes the calls waiting at the gate (the lone calls, whose flights
// then land and send the queued calls as a batch) and shuts a new gate for
// the batch to wait at, then runs then.
func (g *gatedStore) gate2(t *testing.T, then func()) {
	t.Helper()
	old := *g.gate.Load()
	g.shut()
	close(old)
	then()
}

// poisonedBatches is a gatedStore whose batch claims fail one key alone,
// as a store does for a record it cannot decode.
type poisonedBatches struct {
	*gatedStore
	poison string
}

func (p *poisonedBatches) ClaimBatch(ctx context.Context, rs []store.ClaimRequest) ([]store.ClaimResult, error) {
	var clean []store.ClaimRequest
	for _, r := range rs {
		if r.Key != p.poison {
			clean = append(clean, r)
		}
	}
	res, err := p.gatedStore.ClaimBatch(ctx, clean)
	if err != nil {
		return nil, err
	}
	out := make([]store.ClaimResult, 0, len(rs))
	for _, r := range rs {
		if r.Key == p.poison {
			out = append(out, store.ClaimResult{Record: idem.Record{Key: r.Key}, Err: &idem.CorruptError{Key: r.Key, Detail: "test"}})
			continue
		}
		out = append(out, res[0])
		res = res[1:]
	}
	return out, nil
}

// A key the store fails alone in a batch (store.ClaimResult.Err) fails only its
// own call; the batch's other calls run.
func TestCoalescingPerKeyFailure(t *testing.T) {
	g := newGatedStore()
	p := &poisonedBatches{gatedStore: g, poison: "poison"}
	l := coalescingLedger(p, idem.WithCoalescing(16))
	var runs atomic.Int32
	fn := func(context.Context) ([]byte, error) { runs.Add(1); return []byte("ok"), nil }
	lone := occupy(t, l, g, fn)
	keys := []string{"a", "poison", "b"}
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() { _, errs[i] = l.Do(context.Background(), idem.Key(k), fn) })
	}
	waitFor(t, "the calls to queue", func() bool { return idem.CoalescingQueued(l) == len(keys) })
	g.open()
	wg.Wait()
	lone.Wait()
	if g.batches.Load() == 0 {
		t.Fatal("the queued calls were not sent as a batch")
	}
	if !errors.Is(errs[1], idem.ErrCorrupt) {
		t.Errorf("the failed key's call: %v, want ErrCorrupt", errs[1])
	}
	if errs[0] != nil || errs[2] != nil {
		t.Errorf("the other calls of the batch: %v, %v; want both run", errs[0], errs[2])
	}
	if want := int32(idem.CoalescingFlights + 2); runs.Load() != want {
		t.Errorf("fn ran %d times, want %d", runs.Load(), want)
	}
}

// cancelOnClaim is a gatedStore that ends a caller's context as the store
// answers that caller's claim: the caller left while its claim was on its
// way, and the answer lands before the caller looks at it.
type cancelOnClaim struct {
	*gatedStore
	mu      sync.Mutex
	cancels map[string]context.CancelFunc
}

func (c *cancelOnClaim) cancelFor(rs ...store.ClaimRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range rs {
		if f := c.cancels[r.Key]; f != nil {
			f()
		}
	}
}

func (c *cancelOnClaim) Claim(ctx context.Context, r store.ClaimRequest) (store.ClaimResult, error) {
	res, err := c.gatedStore.Claim(ctx, r)
	c.cancelFor(r)
	return res, err
}

func (c *cancelOnClaim) ClaimBatch(ctx context.Context, rs []store.ClaimRequest) ([]store.ClaimResult, error) {
	res, err := c.gatedStore.ClaimBatch(ctx, rs)
	c.cancelFor(rs...)
	return res, err
}

// A caller whose context ended while its coalesced claim was on its way
// gets the context's error and its acquired claim released, even when the
// answer reached the batcher before the caller did: fn never runs on a
// context that is already over, which under AtMostOnce would leave the key
// indeterminate though nothing was attempted.
func TestCoalescingCallerThatLeftAsTheAnswerCame(t *testing.T) {
	g := newGatedStore()
	s := &cancelOnClaim{gatedStore: g, cancels: map[string]context.CancelFunc{}}
	l := coalescingLedger(s, idem.WithCoalescing(16), idem.WithPolicy(idem.AtMostOnce))
	var ran atomic.Int32
	fn := func(ctx context.Context) ([]byte, error) {
		ran.Add(1)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return []byte("ok"), nil
	}
	lone := occupy(t, l, g, func(context.Context) ([]byte, error) { return []byte("ok"), nil })
	const callers = 10
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		key := idem.Key("left", fmt.Sprint(i))
		s.mu.Lock()
		s.cancels[key.String()] = cancel
		s.mu.Unlock()
		wg.Go(func() { _, errs[i] = l.Do(ctx, key, fn) })
	}
	waitFor(t, "the calls to queue", func() bool { return idem.CoalescingQueued(l) == callers })
	g.open()
	wg.Wait()
	lone.Wait()
	if n := ran.Load(); n != 0 {
		t.Errorf("fn ran %d times for callers whose context had ended", n)
	}
	for i, err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("caller %d: %v, want context.Canceled", i, err)
		}
		key := idem.Key("left", fmt.Sprint(i)).String()
		waitFor(t, "the claim of "+key+" to be released", func() bool {
			rec, err := g.Get(context.Background(), key)
			return err == nil && rec.Status == idem.StatusReleased
		})
	}
}

// panickingRelease is a gatedStore whose release panics.
type panickingRelease struct{ *gatedStore }

func (p panickingRelease) Finish(ctx context.Context, r store.FinishRequest) error {
	if r.Outcome == store.OutcomeReleased {
		panic("store bug in Finish(released)")
	}
	return p.gatedStore.Finish(ctx, r)
}

// A store that panics while an orphaned claim is released, on the flight's
// goroutine where no caller could recover it, does not bring the process
// down: the release failed, and the key waits for its lease.
func TestCoalescingOrphanReleaseThatPanics(t *testing.T) {
	g := newGatedStore()
	l := coalescingLedger(panickingRelease{g}, idem.WithCoalescing(16), idem.WithLease(time.Minute))
	fn := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
	lone := occupy(t, l, g, fn)

	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() {
		_, err := l.Do(ctx, idem.Key("sent"), fn)
		left <- err
	}()
	waitFor(t, "the call to queue", func() bool { return idem.CoalescingQueued(l) == 1 })
	g.gate2(t, func() {
		// Not inClaim == 1: a lone call let through may not have left
		// wait yet, while "sent" has not been sent.
		waitFor(t, "the claim of sent to reach the store", func() bool { return g.isWaiting(idem.Key("sent").String()) })
	})
	cancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("a sent call whose context ended: %v, want context.Canceled", err)
	}
	g.open()
	lone.Wait()
	waitFor(t, "the orphaned claim to be acquired", func() bool {
		rec, err := g.Get(context.Background(), "sent")
		return err == nil && rec.Status == idem.StatusInProgress
	})
	// The flight lands before its orphans are released: a later call
	// finds the flight free again.
	if _, err := l.Do(context.Background(), idem.Key("after"), fn); err != nil {
		t.Fatalf("a call after the orphan's release panicked: %v", err)
	}
	time.Sleep(50 * time.Millisecond) // let the release run, and panic
	_, err := l.Do(context.Background(), idem.Key("sent"), fn)
	if !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("the orphan's key after its release failed: %v, want ErrInProgress (it waits for its lease)", err)
	}
}

// Below DefaultCoalescingFrom calls at once, every call sends its own
// claim, even while the store holds the others. The call that makes
// DefaultCoalescingFrom starts coalescing: it and the calls after it wait, and go in a batch
// when the calls sent on their own have landed. When calls come one at a
// time again, coalescing stops.
func TestCoalescingOnlyUnderLoad(t *testing.T) {
	g := newGatedStore()
	l := quietLedger(g, idem.WithCoalescing(64))
	ctx := context.Background()
	fn := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
	const own, queued = idem.DefaultCoalescingFrom - 1, 5
	errs := make([]error, own+queued)
	var wg sync.WaitGroup
	for i := range own {
		wg.Go(func() { _, errs[i] = l.Do(ctx, idem.Key("own", fmt.Sprint(i)), fn) })
	}
	waitFor(t, "the calls to reach the store", func() bool { return g.inClaim.Load() == own })
	if g.single.Load() != own || idem.CoalescingQueued(l) != 0 || idem.Coalescing(l) {
		t.Fatalf("%d calls at once: %d claims sent, %d queued, coalescing %v; want each sent on its own",
			own, g.single.Load(), idem.CoalescingQueued(l), idem.Coalescing(l))
	}
	for i := range queued {
		wg.Go(func() { _, errs[own+i] = l.Do(ctx, idem.Key("queued", fmt.Sprint(i)), fn) })
	}
	waitFor(t, "the calls to queue", func() bool { return idem.CoalescingQueued(l) == queued })
	if !idem.Coalescing(l) {
		t.Fatalf("%d calls at once and not coalescing", own+queued)
	}
	g.open()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	if g.single.Load() != own || g.batched.Load() != queued {
		t.Errorf("%d claims sent on their own and %d in batches, want %d and %d", g.single.Load(), g.batched.Load(), own, queued)
	}

	// One call at a time: each is sent on its own, and coalescing stops.
	single, batches := g.single.Load(), g.batches.Load()
	const lone = 100
	for i := range lone {
		if _, err := l.Do(ctx, idem.Key("lone", fmt.Sprint(i)), fn); err != nil {
			t.Fatal(err)
		}
	}
	if idem.Coalescing(l) {
		t.Errorf("still coalescing after %d calls one at a time", lone)
	}
	if g.single.Load()-single != lone || g.batches.Load() != batches {
		t.Errorf("%d calls one at a time: %d claims sent on their own, %d batches; want all on their own",
			lone, g.single.Load()-single, g.batches.Load()-batches)
	}
}

// slowStore is a memstore whose claims and completions yield the
// processor a few times first, so that concurrent calls overlap.
type slowStore struct{ *memstore.Store }

func yieldSome() {
	for range 3 {
		runtime.Gosched()
	}
}

func (s slowStore) Claim(ctx context.Context, r store.ClaimRequest) (store.ClaimResult, error) {
	yieldSome()
	return s.Store.Claim(ctx, r)
}

func (s slowStore) ClaimBatch(ctx context.Context, rs []store.ClaimRequest) ([]store.ClaimResult, error) {
	yieldSome()
	return s.Store.ClaimBatch(ctx, rs)
}

func (s slowStore) Finish(ctx context.Context, r store.FinishRequest) error {
	yieldSome()
	return s.Store.Finish(ctx, r)
}

func (s slowStore) FinishBatch(ctx context.Context, rs []store.FinishRequest) ([]error, error) {
	yieldSome()
	errs := make([]error, len(rs))
	for i, r := range rs {
		errs[i] = s.Store.Finish(ctx, r)
	}
	return errs, nil
}

// Calls whose load starts and stops coalescing over and over (a low
// threshold, bursts and lulls) each run once and get their own result.
func TestCoalescingStartsAndStops(t *testing.T) {
	s := slowStore{memstore.New()}
	l := quietLedger(s, idem.WithCoalescing(8), idem.WithCoalescingFrom(4))
	ctx := context.Background()
	const goroutines, keys = 16, 200
	var runs [goroutines * keys]atomic.Int32
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for k := range keys {
				if k%50 == 0 {
					time.Sleep(time.Duration(g) * time.Millisecond) // lulls
				}
				i := g*keys + k
				res, err := l.Do(ctx, idem.Key("k", fmt.Sprint(i)), func(context.Context) ([]byte, error) {
					runs[i].Add(1)
					return []byte(fmt.Sprint(i)), nil
				})
				if err != nil || string(res.Value) != fmt.Sprint(i) {
					t.Errorf("key %d: %+v, %v", i, res, err)
					return
				}
			}
		})
	}
	wg.Wait()
	for i := range runs {
		if n := runs[i].Load(); n != 1 {
			t.Fatalf("key %d: fn ran %d times", i, n)
		}
	}
}

// WithCoalescingFrom(1) coalesces at any load: three calls made while the
// two flights are busy go in one batch, where the default would send each
// on its own.
func TestCoalescingFrom(t *testing.T) {
	for _, from := range []int{1, 0} {
		t.Run(fmt.Sprintf("from=%d", from), func(t *testing.T) {
			g := newGatedStore()
			l := quietLedger(g, idem.WithCoalescing(8), idem.WithCoalescingFrom(from))
			fn := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
			lone := occupy(t, l, g, fn)
			const more = 3
			var wg sync.WaitGroup
			for i := range more {
				wg.Go(func() {
					if _, err := l.Do(context.Background(), idem.Key("more", fmt.Sprint(i)), fn); err != nil {
						t.Errorf("call %d: %v", i, err)
					}
				})
			}
			if from == 1 {
				waitFor(t, "the calls to queue", func() bool { return idem.CoalescingQueued(l) == more })
			} else {
				waitFor(t, "the calls to reach the store", func() bool { return g.inClaim.Load() == idem.CoalescingFlights+more })
			}
			g.open()
			wg.Wait()
			lone.Wait()
			wantSingle, wantBatched := int32(idem.CoalescingFlights), int32(more)
			if from != 1 {
				wantSingle, wantBatched = idem.CoalescingFlights+more, 0
			}
			if g.single.Load() != wantSingle || g.batched.Load() != wantBatched {
				t.Errorf("%d claims sent on their own and %d in batches, want %d and %d", g.single.Load(), g.batched.Load(), wantSingle, wantBatched)
			}
		})
	}
}
