package idem_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/testobserve"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

func noOp(ctx context.Context, _ idem.Event) context.Context { return ctx }

// checkKinds fails t unless rec saw exactly want, each start ended once
// with its context.
func checkKinds(t *testing.T, rec *testobserve.Recorder, want ...idem.EventKind) {
	t.Helper()
	if got := rec.Kinds(); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if err := rec.Check(); err != nil {
		t.Fatal(err)
	}
}

func opEnd(t *testing.T, rec *testobserve.Recorder) testobserve.Recorded {
	t.Helper()
	e, ok := rec.Last(idem.OpEnd)
	if !ok {
		t.Fatal("no OpEnd")
	}
	return e
}

type marker struct{}

func TestObserverSeesAnExecutedCallAndItsAttempt(t *testing.T) {
	ctx := context.Background()
	rec := new(testobserve.Recorder)
	// A second observer marks the context OpStart returns: fn must get it.
	mark := idem.ObserverFunc(func(ctx context.Context, e idem.Event) context.Context {
		if e.Kind == idem.OpStart {
			return context.WithValue(ctx, marker{}, e.Key)
		}
		return ctx
	})
	l := idem.New(memstore.New(), quiet(), idem.WithObserver(idem.Observers(rec, nil, mark)), idem.WithPolicy(idem.AtMostOnce))
	var inFn idem.Attempt
	res, err := l.Do(ctx, idem.Key("receipt", 1), func(ctx context.Context) ([]byte, error) {
		if ctx.Value(marker{}) != "receipt:1" {
			t.Errorf("fn's context does not carry the one OpStart returned")
		}
		inFn, _ = idem.AttemptFromContext(ctx)
		return []byte("ok"), nil
	}, idem.WithCorrelationID("c-1"))
	if err != nil {
		t.Fatal(err)
	}
	checkKinds(t, rec, idem.OpStart, idem.OpEnd)
	start, end := rec.Events()[0], opEnd(t, rec)
	if start.Key != "receipt:1" || start.KeyHashed || start.Policy != idem.AtMostOnce || start.Correlation != "c-1" || start.Started.IsZero() {
		t.Errorf("OpStart %+v", start.Event)
	}
	if end.Outcome != "executed" || end.Fence != res.Fence || end.Attempt != 1 || end.AttemptID == "" || end.Takeover || end.Err != nil || end.Duration <= 0 {
		t.Errorf("OpEnd %+v, want executed with fence %d attempt 1", end.Event, res.Fence)
	}
	if inFn.Key != "receipt:1" || inFn.Fence != res.Fence || inFn.Number != 1 || inFn.ID != end.AttemptID {
		t.Errorf("AttemptFromContext in fn: %+v, want fence %d attempt 1 id %s", inFn, res.Fence, end.AttemptID)
	}
	if _, ok := idem.AttemptFromContext(ctx); ok {
		t.Error("AttemptFromContext outside fn: ok")
	}

	// A replay, from the store and then from a cache.
	rec.Reset()
	if _, err := l.Do(ctx, idem.Key("receipt", 1), nil); err != nil {
		t.Fatal(err)
	}
	checkKinds(t, rec, idem.OpStart, idem.OpEnd)
	if e := opEnd(t, rec); e.Outcome != "replayed" || e.Fence != res.Fence || e.Attempt != 1 {
		t.Errorf("replay's OpEnd %+v", e.Event)
	}
}

func TestObserverSeesACacheReplayAndMismatch(t *testing.T) {
	ctx := context.Background()
	rec := new(testobserve.Recorder)
	l := idem.New(memstore.New(), quiet(), idem.WithObserver(rec), idem.WithCache(8), idem.WithHashedKeysInLogs())
	key := idem.Key("hashed")
	res, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { return nil, nil }, idem.Fingerprint([]byte("a")))
	if err != nil {
		t.Fatal(err)
	}
	rec.Reset()
	if _, err := l.Do(ctx, key, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Do(ctx, key, nil, idem.Fingerprint([]byte("b"))); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("a cached key with another fingerprint: %v, want ErrMismatch", err)
	}
	checkKinds(t, rec, idem.OpStart, idem.OpEnd, idem.OpStart, idem.OpEnd)
	evs := rec.Events()
	hash, hashed := l.ObservedKey(key.String())
	for _, e := range evs {
		if e.Key != hash || !e.KeyHashed || !hashed || strings.Contains(e.Key, "hashed") {
			t.Errorf("%v carries key %q (hashed %v), want the hash %q", e.Kind, e.Key, e.KeyHashed, hash)
		}
	}
	if evs[1].Outcome != "replayed" || evs[1].Fence != res.Fence || evs[1].Err != nil {
		t.Errorf("cache replay's OpEnd %+v", evs[1].Event)
	}
	if evs[3].Outcome != "mismatch" || !errors.Is(evs[3].Err, idem.ErrMismatch) {
		t.Errorf("cache mismatch's OpEnd %+v", evs[3].Event)
	}
}

func TestObserverSeesBusyMismatchAndErrorsOfFn(t *testing.T) {
	ctx := context.Background()
	rec := new(testobserve.Recorder)
	l := idem.New(memstore.New(), quiet(), idem.WithObserver(rec))
	key := idem.Key("busy")
	entered, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { close(entered); <-release; return nil, nil }, idem.Fingerprint([]byte("a")))
		done <- err
	}()
	<-entered
	_, busyErr := l.Do(ctx, key, nil, idem.Fingerprint([]byte("a")))
	_, mismatchErr := l.Do(ctx, key, nil, idem.Fingerprint([]byte("b")))
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !errors.Is(busyErr, idem.ErrInProgress) || !errors.Is(mismatchErr, idem.ErrMismatch) {
		t.Fatalf("busy: %v; mismatch: %v", busyErr, mismatchErr)
	}
	var outcomes []string
	for _, e := range rec.Events() {
		if e.Kind == idem.OpEnd {
			outcomes = append(outcomes, e.Outcome)
			if e.Outcome == "busy" && (e.Fence == 0 || e.Attempt != 1 || !errors.Is(e.Err, idem.ErrInProgress)) {
				t.Errorf("busy OpEnd %+v: want the holder's fence and attempt, and the error", e.Event)
			}
		}
	}
	if !slices.Equal(outcomes, []string{"busy", "mismatch", "executed"}) {
		t.Errorf("outcomes %v", outcomes)
	}
	if err := rec.Check(); err != nil {
		t.Fatal(err)
	}

	// fn's error: released under AtLeastOnce, failed when Permanent.
	rec.Reset()
	boom := errors.New("boom")
	_, err1 := l.Do(ctx, idem.Key("e"), func(context.Context) ([]byte, error) { return nil, boom })
	_, err2 := l.Do(ctx, idem.Key("e"), func(context.Context) ([]byte, error) { return nil, idem.Permanent(boom) })
	_, err3 := l.Do(ctx, idem.Key("e"), nil)
	checkKinds(t, rec, idem.OpStart, idem.OpEnd, idem.OpStart, idem.OpEnd, idem.OpStart, idem.OpEnd)
	evs := rec.Events()
	for i, want := range []struct {
		outcome string
		attempt int
		err     error
	}{{"released", 1, err1}, {"failed", 2, err2}, {"failed", 2, err3}} {
		e := evs[2*i+1]
		if e.Outcome != want.outcome || e.Attempt != want.attempt || e.Err != want.err || e.Err == nil {
			t.Errorf("call %d: OpEnd %s attempt %d err %v, want %s attempt %d err %v", i, e.Outcome, e.Attempt, e.Err, want.outcome, want.attempt, want.err)
		}
	}
}

func TestObserverSeesATakeover(t *testing.T) {
	ctx := context.Background()
	clock := idemtest.NewClock(idemtest.ClockStart)
	s := memstore.New(memstore.WithClock(clock.Now))
	if cr, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "t", Owner: "crashed", Lease: time.Minute, Retention: time.Hour}); err != nil || !cr.Acquired {
		t.Fatalf("Claim: %+v, %v", cr, err)
	}
	clock.Advance(2 * time.Minute)
	rec := new(testobserve.Recorder)
	l := idem.New(s, quiet(), idem.WithObserver(rec))
	var inFn idem.Attempt
	res, err := l.Do(ctx, idem.RawKey("t"), func(ctx context.Context) ([]byte, error) { inFn, _ = idem.AttemptFromContext(ctx); return nil, nil })
	if err != nil || !res.Takeover {
		t.Fatalf("%+v, %v; want a takeover", res, err)
	}
	checkKinds(t, rec, idem.OpStart, idem.OpEnd)
	if e := opEnd(t, rec); e.Outcome != "executed" || !e.Takeover || e.Attempt != 2 || e.Fence != res.Fence {
		t.Errorf("OpEnd %+v, want executed by a takeover, attempt 2", e.Event)
	}
	if !inFn.Takeover || inFn.Number != 2 {
		t.Errorf("AttemptFromContext in fn: %+v, want attempt 2, a takeover", inFn)
	}
}

func TestObserverSeesStoreErrors(t *testing.T) {
	ctx := context.Background()
	fs := idemtest.NewFaultStore(memstore.New())
	rec := new(testobserve.Recorder)
	l := idem.New(fs, quiet(), idem.WithObserver(rec))
	down := errors.New("store down")

	fs.Inject(idemtest.OpClaim, idemtest.Fault{Err: down, Times: 1})
	_, err := l.Do(ctx, idem.Key("s"), func(context.Context) ([]byte, error) { return nil, nil })
	checkKinds(t, rec, idem.OpStart, idem.StoreFailed, idem.OpEnd)
	evs := rec.Events()
	if f := evs[1]; f.Op != "claim" || !errors.Is(f.Err, down) || f.Span != evs[0].Span {
		t.Errorf("StoreFailed %+v (span %d), want op claim in the call's span %d", f.Event, f.Span, evs[0].Span)
	}
	var se *idem.StoreError
	if e := evs[2]; e.Outcome != "store-error" || !errors.As(e.Err, &se) || e.Err != err {
		t.Errorf("OpEnd %+v, want store-error with the *StoreError Do returned", e.Event)
	}

	// A completion that fails for good after fn ran.
	rec.Reset()
	fs.Inject(idemtest.OpComplete, idemtest.Fault{Err: idem.ErrClosed})
	_, err = l.Do(ctx, idem.Key("s2"), func(context.Context) ([]byte, error) { return nil, nil })
	checkKinds(t, rec, idem.OpStart, idem.StoreFailed, idem.OpEnd)
	if f, _ := rec.Last(idem.StoreFailed); f.Op != "complete" || f.Attempt != 1 || f.Fence == 0 {
		t.Errorf("StoreFailed %+v, want op complete of attempt 1", f.Event)
	}
	if e := opEnd(t, rec); e.Outcome != "store-error" || e.Err != err || e.Attempt != 1 {
		t.Errorf("OpEnd %+v", e.Event)
	}
}

func TestObserverSeesLeaseExtendedAndLost(t *testing.T) {
	ctx := context.Background()
	fs := idemtest.NewFaultStore(memstore.New())
	rec := new(testobserve.Recorder)
	l := idem.New(fs, quiet(), idem.WithObserver(rec), idem.WithLease(60*time.Millisecond))

	// Heartbeats extend the lease while fn runs.
	_, err := l.Do(ctx, idem.Key("long"), func(ctx context.Context) ([]byte, error) {
		time.Sleep(90 * time.Millisecond)
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ext, ok := rec.Last(idem.LeaseExtended)
	if !ok || ext.Deadline.IsZero() || ext.Fence == 0 || ext.Span != rec.Events()[0].Span {
		t.Fatalf("no LeaseExtended in the call's span: %v", rec.Kinds())
	}
	if e := opEnd(t, rec); e.Outcome != "executed" {
		t.Errorf("OpEnd %+v", e.Event)
	}
	if err := rec.Check(); err != nil {
		t.Fatal(err)
	}

	// The store refuses the heartbeat: another attempt holds the key.
	rec.Reset()
	fs.Inject(idemtest.OpExtend, idemtest.Fault{Err: idem.ErrLeaseLost})
	_, err = l.Do(ctx, idem.Key("lost"), func(ctx context.Context) ([]byte, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Do: %v, want ErrLeaseLost", err)
	}
	checkKinds(t, rec, idem.OpStart, idem.LeaseLost, idem.OpEnd)
	if lost, _ := rec.Last(idem.LeaseLost); lost.Reason != "refused" || !errors.Is(lost.Err, idem.ErrLeaseLost) || lost.Attempt != 1 {
		t.Errorf("LeaseLost %+v", lost.Event)
	}
	if e := opEnd(t, rec); e.Outcome != "lease-lost" || e.Err != err {
		t.Errorf("OpEnd %+v", e.Event)
	}
}

// The observer sees a panicking fn's call end, before the panic goes on.
func TestObserverSeesTheEndOfACallWhoseFnPanics(t *testing.T) {
	rec := new(testobserve.Recorder)
	l := idem.New(memstore.New(), quiet(), idem.WithObserver(rec))
	func() {
		defer func() { _ = recover() }()
		_, _ = l.Do(context.Background(), idem.Key("p"), func(context.Context) ([]byte, error) { panic("boom") })
	}()
	checkKinds(t, rec, idem.OpStart, idem.OpEnd)
	if e := opEnd(t, rec); e.Outcome != "released" {
		t.Errorf("OpEnd %+v, want released", e.Event)
	}
}

// With no observer the cache replay allocates nothing, and a no-op
// observer adds nothing to it or to a claim and completion on memstore.
func TestObserverAllocatesNothing(t *testing.T) {
	ctx := context.Background()
	fn := func(context.Context) ([]byte, error) { return nil, nil }
	for _, o := range []idem.Observer{nil, idem.ObserverFunc(noOp)} {
		l := idem.New(memstore.New(), quiet(), idem.WithCache(8), idem.WithObserver(o))
		key := idem.Key("cached")
		if _, err := l.Do(ctx, key, fn); err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(100, func() { _, _ = l.Do(ctx, key, fn) }); n != 0 {
			t.Errorf("observer %v: a cache replay allocates %v times, want 0", o != nil, n)
		}
	}

	claimComplete := func(o idem.Observer) float64 {
		l := idem.New(memstore.New(), quiet(), idem.WithObserver(o), idem.WithRetention(time.Nanosecond))
		key := idem.Key("fresh")
		return testing.AllocsPerRun(200, func() {
			if _, err := l.Do(ctx, key, fn); err != nil {
				t.Fatal(err)
			}
		})
	}
	without, with := claimComplete(nil), claimComplete(idem.ObserverFunc(noOp))
	if with != without {
		t.Errorf("Do (claim and complete) allocates %v times with a no-op observer, %v without: the observer must add none", with, without)
	}
}

func TestContextLoggerAndLevels(t *testing.T) {
	var configured, fromCtx bytes.Buffer
	l := idem.New(memstore.New(), idem.WithLogger(slog.New(slog.NewTextHandler(&configured, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	ctx := idem.ContextWithLogger(context.Background(), slog.New(slog.NewTextHandler(&fromCtx, &slog.HandlerOptions{Level: slog.LevelDebug})))
	fn := func(context.Context) ([]byte, error) { return nil, nil }
	for range 2 {
		if _, err := l.Do(ctx, idem.Key("k"), fn); err != nil {
			t.Fatal(err)
		}
	}
	if configured.Len() != 0 {
		t.Errorf("the configured logger got lines of a call whose context has a logger:\n%s", configured.String())
	}
	lines := strings.Split(strings.TrimSpace(fromCtx.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `level=INFO msg="idem executed"`) || !strings.Contains(lines[1], `level=DEBUG msg="idem replayed"`) {
		t.Errorf("lines:\n%s\nwant executed at INFO, then replayed at DEBUG", fromCtx.String())
	}
	if got := idem.LoggerFromContext(context.Background(), nil); got != nil {
		t.Errorf("LoggerFromContext of a bare context: %v, want the fallback", got)
	}
}

// BenchmarkDoObserver measures Ledger.Do (claim and complete of a new key
// on memstore) with no observer and with a no-op one.
func BenchmarkDoObserver(b *testing.B) {
	fn := func(context.Context) ([]byte, error) { return nil, nil }
	for _, bc := range []struct {
		name string
		o    idem.Observer
	}{{"none", nil}, {"noop", idem.ObserverFunc(noOp)}} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			l := idem.New(memstore.New(), quiet(), idem.WithObserver(bc.o), idem.WithRetention(time.Nanosecond))
			key := idem.Key("bench")
			b.ReportAllocs()
			for b.Loop() {
				if _, err := l.Do(ctx, key, fn); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Under coalescing, each call still has its own OpStart and OpEnd, with
// its own attempt, however its claim and completion went to the store.
func TestObserverUnderCoalescing(t *testing.T) {
	ctx := context.Background()
	rec := new(testobserve.Recorder)
	l := idem.New(memstore.New(), quiet(), idem.WithObserver(rec), idem.WithCoalescing(8), idem.WithCoalescingFrom(1))
	const n = 32
	fences := make(chan int64, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := l.Do(ctx, idem.Key("co", i), func(context.Context) ([]byte, error) { return nil, nil })
			if err != nil {
				t.Error(err)
			}
			fences <- res.Fence
		}()
	}
	wg.Wait()
	close(fences)
	if err := rec.Check(); err != nil {
		t.Fatal(err)
	}
	byFence := map[int64]bool{}
	for _, e := range rec.Events() {
		if e.Kind == idem.OpEnd {
			if e.Outcome != "executed" || e.AttemptID == "" {
				t.Errorf("OpEnd %+v", e.Event)
			}
			byFence[e.Fence] = true
		}
	}
	for f := range fences {
		if !byFence[f] {
			t.Errorf("no OpEnd with fence %d", f)
		}
	}
	if len(rec.Kinds()) != 2*n {
		t.Errorf("%d events for %d calls, want %d", len(rec.Kinds()), n, 2*n)
	}
}
