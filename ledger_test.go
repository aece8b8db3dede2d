package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

// A fn that ends its goroutine (runtime.Goexit, as t.Fatal does) must not
// leave a heartbeat holding the key: the lease lapses as after a crash.
func TestGoexitInFnLetsTheLeaseLapse(t *testing.T) {
	ctx := context.Background()
	lease := 60 * time.Millisecond
	l := idem.New(memstore.New(), idem.WithLease(lease), idem.WithLogger(slog.New(slog.DiscardHandler)))
	key := idem.Key("goexit")
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = l.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
			runtime.Goexit()
			return nil, nil
		})
	}()
	<-done
	time.Sleep(4 * lease)
	res, err := l.Do(ctx, key, func(ctx context.Context) ([]byte, error) { return []byte("ran"), nil })
	if err != nil {
		t.Fatalf("Do after the Goexit attempt's lease: %v (its heartbeat still holds the key?)", err)
	}
	if !res.Takeover || res.Attempt != 2 {
		t.Fatalf("got %+v, want a takeover by attempt 2", res)
	}
}

// The caller owns a fresh Value: changing it must not change what the cache
// replays.
func TestCacheKeepsItsOwnCopyOfAFreshResult(t *testing.T) {
	ctx := context.Background()
	l := idem.New(memstore.New(), idem.WithCache(8), idem.WithLogger(slog.New(slog.DiscardHandler)))
	key := idem.Key("copy")
	res, err := l.Do(ctx, key, func(ctx context.Context) ([]byte, error) { return []byte("hello"), nil })
	if err != nil {
		t.Fatal(err)
	}
	res.Value[0] = 'X'
	again, err := l.Do(ctx, key, func(ctx context.Context) ([]byte, error) { return nil, nil })
	if err != nil || !again.Replayed || string(again.Value) != "hello" {
		t.Fatalf("replay after the caller changed its Value: %q replayed=%v err=%v, want \"hello\"", again.Value, again.Replayed, err)
	}
}

// hangingExtends is a memstore whose Extend ignores its context and
// answers only when released: a store client that hangs.
type hangingExtends struct {
	*memstore.Store
	release chan struct{}
	entered chan struct{}
}

func (h *hangingExtends) Extend(ctx context.Context, r store.ExtendRequest) (time.Time, error) {
	select {
	case h.entered <- struct{}{}:
	default:
	}
	<-h.release
	return h.Store.Extend(context.Background(), r)
}

// When an extension hangs past its context, fn is still cancelled when the
// lease runs out: the watchdog does not wait for the store to answer. No
// other attempt took the key, so what fn returns is still recorded.
func TestLeaseRunsOutWhileAnExtensionHangs(t *testing.T) {
	s := &hangingExtends{Store: memstore.New(), release: make(chan struct{}), entered: make(chan struct{}, 1)}
	lease := 90 * time.Millisecond
	l := idem.New(s, idem.WithLease(lease), idem.WithLogger(slog.New(slog.DiscardHandler)))
	var released atomic.Bool
	done := make(chan error, 1)
	go func() {
		_, err := l.Do(context.Background(), idem.Key("hang"), func(ctx context.Context) ([]byte, error) {
			select {
			case <-ctx.Done():
			case <-time.After(20 * lease):
				t.Error("fn was not cancelled when its lease ran out")
				return nil, nil
			}
			if released.Load() {
				t.Error("fn was cancelled only after the hanging extension answered")
			}
			if !errors.Is(context.Cause(ctx), idem.ErrLeaseLost) {
				t.Errorf("fn's context cause %v, want ErrLeaseLost", context.Cause(ctx))
			}
			return nil, nil
		})
		done <- err
	}()
	<-s.entered
	// fn must be cancelled while the extension still hangs.
	select {
	case err := <-done:
		t.Fatalf("Do returned %v while its heartbeat was still in the store", err)
	case <-time.After(30 * lease):
	}
	released.Store(true)
	close(s.release)
	if err := <-done; err != nil {
		t.Fatalf("Do = %v, want fn's result recorded (no other attempt took the key)", err)
	}
	if rec, err := s.Get(context.Background(), "hang"); err != nil || rec.Status != idem.StatusCompleted {
		t.Fatalf("record %+v, %v; want completed", rec, err)
	}
}

// unreachableExtends is a memstore whose Extend cannot reach the backend.
type unreachableExtends struct{ *memstore.Store }

func (unreachableExtends) Extend(context.Context, store.ExtendRequest) (time.Time, error) {
	return time.Time{}, errors.New("connection reset")
}

// Heartbeats fail for longer than the lease while fn does its effect, not
// watching its context. Nobody took the key, so the store still holds it
// under fn's fence: fn's result is recorded and the next call replays it
// instead of doing the effect again.
func TestLeaseRunOutHereStillRecords(t *testing.T) {
	lease := 90 * time.Millisecond
	l := idem.New(unreachableExtends{memstore.New()}, idem.WithLease(lease), idem.WithLogger(slog.New(slog.DiscardHandler)))
	sends := 0
	send := func(ctx context.Context) ([]byte, error) {
		sends++
		time.Sleep(lease + 30*time.Millisecond) // an SMTP call that does not watch ctx
		if !errors.Is(context.Cause(ctx), idem.ErrLeaseLost) {
			t.Errorf("fn's context cause %v, want ErrLeaseLost", context.Cause(ctx))
		}
		return []byte("250 OK"), nil
	}
	first, err := l.Do(context.Background(), idem.Key("email"), send)
	if err != nil || string(first.Value) != "250 OK" {
		t.Fatalf("first Do: %+v, %v; want fn's result recorded", first, err)
	}
	second, err := l.Do(context.Background(), idem.Key("email"), send)
	if err != nil || !second.Replayed || sends != 1 {
		t.Fatalf("second Do: %+v, %v; sent %d times; want a replay, one send", second, err, sends)
	}
}

// ownerChangedOnRead is a store whose Extend cannot reach the backend and
// whose Get returns the owner changed, as DynamoDB returns one that is not
// UTF-8: the attempt is still the one the store shows.
type ownerChangedOnRead struct{ unreachableExtends }

func (s ownerChangedOnRead) Get(ctx context.Context, key string) (idem.Record, error) {
	rec, err := s.Store.Get(ctx, key)
	rec.Owner = strings.ToValidUTF8(rec.Owner, "\uFFFD")
	return rec, err
}

// The late record after a lease that ran out here does not depend on the
// owner reading back unchanged.
func TestLeaseRunOutHereOwnerReadBackChanged(t *testing.T) {
	lease := 60 * time.Millisecond
	l := idem.New(ownerChangedOnRead{unreachableExtends{memstore.New()}}, idem.WithLease(lease), idem.WithOwner("worker-\xff"),
		idem.WithLogger(slog.New(slog.DiscardHandler)))
	res, err := l.Do(context.Background(), idem.Key("k"), func(ctx context.Context) ([]byte, error) {
		<-ctx.Done()
		return []byte("250 OK"), nil
	})
	if err != nil || string(res.Value) != "250 OK" {
		t.Fatalf("Do = %+v, %v; want fn's result recorded", res, err)
	}
}

// When the lease ran out here and another attempt took the key meanwhile,
// the store refuses the first attempt's result under its old fence: Do
// returns ErrLeaseLost and the new holder's record stands.
func TestLeaseRunOutHereThenTakenOver(t *testing.T) {
	lease := 60 * time.Millisecond
	s := memstore.New()
	quiet := idem.WithLogger(slog.New(slog.DiscardHandler))
	l := idem.New(unreachableExtends{s}, idem.WithLease(lease), quiet)
	other := idem.New(s, idem.WithLease(time.Minute), quiet)
	_, err := l.Do(context.Background(), idem.Key("k"), func(ctx context.Context) ([]byte, error) {
		<-ctx.Done()
		time.Sleep(10 * time.Millisecond) // the store's lease ends no earlier than this process's
		res, err := other.Do(context.Background(), idem.Key("k"), func(context.Context) ([]byte, error) { return []byte("second"), nil })
		if err != nil || !res.Takeover {
			t.Errorf("the other attempt: %+v, %v; want a takeover", res, err)
		}
		return []byte("first"), nil
	})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Do = %v, want ErrLeaseLost", err)
	}
	if rec, err := s.Get(context.Background(), "k"); err != nil || string(rec.Result) != "second" {
		t.Fatalf("record %+v, %v; want the other attempt's result", rec, err)
	}
}

// When the lease ran out here and the record was deleted meanwhile (an
// operator's idem delete, a sweep), a new attempt's record starts above
// every fence the old one had: the first attempt's result must not be
// recorded over the new attempt.
func TestLeaseRunOutHereThenDeletedAndClaimedAgain(t *testing.T) {
	lease := 60 * time.Millisecond
	s := memstore.New()
	quiet := idem.WithLogger(slog.New(slog.DiscardHandler))
	l := idem.New(unreachableExtends{s}, idem.WithLease(lease), quiet)
	other := idem.New(s, idem.WithLease(time.Minute), quiet) // the same owner: another goroutine of the process
	bStarted, aReturned := make(chan struct{}), make(chan struct{})
	bDone := make(chan error, 1)
	var aFence int64
	_, err := l.Do(context.Background(), idem.Key("k"), func(ctx context.Context) ([]byte, error) {
		<-ctx.Done()
		if rec, err := s.Get(context.Background(), "k"); err == nil {
			aFence = rec.Fence
		}
		if err := s.Delete(context.Background(), "k"); err != nil {
			t.Error(err)
		}
		go func() {
			res, err := other.Do(context.Background(), idem.Key("k"), func(context.Context) ([]byte, error) {
				close(bStarted)
				<-aReturned
				return []byte("from-B"), nil
			})
			if err == nil && (res.Attempt != 1 || res.Fence <= aFence) {
				err = fmt.Errorf("the new attempt: attempt %d at fence %d, want attempt 1 (a new record) above fence %d", res.Attempt, res.Fence, aFence)
			}
			bDone <- err
		}()
		<-bStarted
		return []byte("from-A"), nil
	})
	close(aReturned)
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("the first attempt's Do = %v, want ErrLeaseLost", err)
	}
	if err := <-bDone; err != nil {
		t.Fatalf("the new attempt: %v", err)
	}
	if rec, err := s.Get(context.Background(), "k"); err != nil || string(rec.Result) != "from-B" {
		t.Fatalf("record %+v, %v; want the new attempt's result", rec, err)
	}
}

// WithLeaseAtMost ends the lease no later than its bound after the call
// starts, heartbeats included (a Lambda killed at its deadline must not
// leave the key busy after it): fn is cancelled when it runs out.
func TestWithLeaseAtMostBoundsHeartbeats(t *testing.T) {
	s := memstore.New()
	l := idem.New(s, idem.WithLease(time.Hour), idem.WithLogger(slog.New(slog.DiscardHandler)))
	const bound = 150 * time.Millisecond
	start := time.Now()
	var latest time.Time
	_, err := l.Do(context.Background(), idem.Key("k"), func(ctx context.Context) ([]byte, error) {
		for ctx.Err() == nil && time.Since(start) < 8*bound {
			rec, err := s.Get(context.Background(), "k")
			if err != nil {
				return nil, err
			}
			if rec.LeaseUntil.After(latest) {
				latest = rec.LeaseUntil
			}
			time.Sleep(5 * time.Millisecond)
		}
		if !errors.Is(context.Cause(ctx), idem.ErrLeaseLost) {
			t.Errorf("fn's context cause %v after %v, want ErrLeaseLost", context.Cause(ctx), time.Since(start))
		}
		return nil, ctx.Err()
	}, idem.WithLeaseAtMost(bound))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Do = %v, want fn's context.Canceled", err)
	}
	if over := latest.Sub(start.Add(bound)); over > 20*time.Millisecond {
		t.Fatalf("lease held until %v past the bound", over)
	}
}

// WithLeaseAtMost bounds the lease whatever WithLease says, on the Ledger
// or the call, before or after it; a shorter lease stays as it is.
func TestWithLeaseAtMost(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ledger time.Duration
		opts   []idem.CallOption
		want   time.Duration
	}{
		{"ledger lease capped", time.Hour, []idem.CallOption{idem.WithLeaseAtMost(5 * time.Second)}, 5 * time.Second},
		{"cap before the call's lease", 10 * time.Second, []idem.CallOption{idem.WithLeaseAtMost(5 * time.Second), idem.WithLease(time.Hour)}, 5 * time.Second},
		{"cap after the call's lease", 10 * time.Second, []idem.CallOption{idem.WithLease(time.Hour), idem.WithLeaseAtMost(5 * time.Second)}, 5 * time.Second},
		{"the smaller of two caps", time.Hour, []idem.CallOption{idem.WithLeaseAtMost(5 * time.Second), idem.WithLeaseAtMost(20 * time.Second)}, 5 * time.Second},
		{"shorter lease kept", 2 * time.Second, []idem.CallOption{idem.WithLeaseAtMost(5 * time.Second)}, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := memstore.New()
			l := idem.New(s, idem.WithLease(tc.ledger), idem.WithLogger(slog.New(slog.DiscardHandler)))
			var lease time.Duration
			_, err := l.Do(context.Background(), idem.Key("k"), func(ctx context.Context) ([]byte, error) {
				rec, err := s.Get(ctx, "k")
				lease = rec.LeaseUntil.Sub(rec.Journal[0].Started)
				return nil, err
			}, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			if lease != tc.want {
				t.Fatalf("lease %v, want %v", lease, tc.want)
			}
		})
	}
}

// panickingExtends is a memstore whose Extend panics.
type panickingExtends struct{ *memstore.Store }

func (panickingExtends) Extend(context.Context, store.ExtendRequest) (time.Time, error) {
	panic("store bug in Extend")
}

// A store that panics in Extend, on the heartbeat's timer goroutine where no
// caller could recover it, does not bring the process down: the extension
// failed, and when the lease runs out fn is cancelled with ErrLeaseLost.
// Its error then releases the key (AtLeastOnce), which the store still
// held under its fence.
func TestHeartbeatExtendThatPanics(t *testing.T) {
	lease := 60 * time.Millisecond
	s := panickingExtends{memstore.New()}
	l := idem.New(s, idem.WithLease(lease), idem.WithLogger(slog.New(slog.DiscardHandler)))
	_, err := l.Do(context.Background(), idem.Key("hb-panic"), func(ctx context.Context) ([]byte, error) {
		select {
		case <-ctx.Done():
			if !errors.Is(context.Cause(ctx), idem.ErrLeaseLost) {
				t.Errorf("fn's context cause %v, want ErrLeaseLost", context.Cause(ctx))
			}
			return nil, ctx.Err()
		case <-time.After(50 * lease):
			t.Error("fn was not cancelled when its lease ran out")
			return []byte("ok"), nil
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Do = %v, want fn's context.Canceled", err)
	}
	if rec, err := s.Get(context.Background(), "hb-panic"); err != nil || rec.Status != idem.StatusReleased {
		t.Fatalf("record %+v, %v; want released", rec, err)
	}
}

// A Reconcile hook that panics decides nothing, as one that returns an
// error: the lapsed attempt stays lapsed (under AtLeastOnce too), so the
// next call is still a takeover and its hook is still asked about the
// attempt that may have done the effect. Do re-panics.
func TestReconcileHookThatPanicsLeavesTheKeyLapsed(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	l := idem.New(s, idem.WithLogger(slog.New(slog.DiscardHandler)))
	// An attempt that crashed: claimed, never finished, lease passed.
	crashed, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "crashed", Correlation: "first", Lease: time.Millisecond, Retention: time.Hour})
	if err != nil || !crashed.Acquired {
		t.Fatalf("claim: %+v, %v", crashed, err)
	}
	time.Sleep(5 * time.Millisecond)

	var ran atomic.Int32
	fn := func(context.Context) ([]byte, error) { ran.Add(1); return []byte("ran"), nil }
	func() {
		defer func() {
			if p := recover(); p != "hook bug" {
				t.Errorf("Do recovered %v, want the hook's panic", p)
			}
		}()
		_, _ = l.Do(ctx, idem.Key("k"), fn, idem.WithReconcile(func(context.Context, idem.Lapsed) ([]byte, bool, error) {
			panic("hook bug")
		}))
	}()
	if ran.Load() != 0 {
		t.Fatal("fn ran after the hook panicked")
	}
	rec, err := s.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	now, _ := s.Now(ctx)
	if rec.Status != idem.StatusInProgress || !rec.Lapsed(now) {
		t.Fatalf("after a panicking Reconcile hook: {%s, lapsed %v}, want in_progress and lapsed", rec.Status, rec.Lapsed(now))
	}
	res, err := l.Do(ctx, idem.Key("k"), fn)
	if err != nil || !res.Takeover {
		t.Fatalf("the next call: %+v, %v; want a takeover (the lapsed attempt may have done the effect)", res, err)
	}
}

// A claim the store acquires after the caller's context ended (its answer
// came late) does not run fn: Do returns the context's error and the key
// is released, so under AtMostOnce it is not left indeterminate for an
// attempt that never started.
func TestClaimAnsweredAfterTheCallerLeft(t *testing.T) {
	s := memstore.New()
	ctx, cancel := context.WithCancel(context.Background())
	l := idem.New(cancelAtAnswer{Store: s, cancel: cancel}, idem.WithLogger(slog.New(slog.DiscardHandler)))
	ran := false
	_, err := l.Do(ctx, idem.Key("k"), func(context.Context) ([]byte, error) { ran = true; return nil, nil },
		idem.WithPolicy(idem.AtMostOnce))
	if !errors.Is(err, context.Canceled) || ran {
		t.Fatalf("Do whose context ended as the claim was answered: %v, fn ran %v; want context.Canceled and fn not run", err, ran)
	}
	rec, err := s.Get(context.Background(), "k")
	if err != nil || rec.Status != idem.StatusReleased {
		t.Fatalf("record after: %+v %v; want released", rec, err)
	}
	res, err := idem.New(s, idem.WithLogger(slog.New(slog.DiscardHandler))).Do(context.Background(), idem.Key("k"),
		func(context.Context) ([]byte, error) { return []byte("ran"), nil }, idem.WithPolicy(idem.AtMostOnce))
	if err != nil || string(res.Value) != "ran" {
		t.Fatalf("the next call: %+v %v; want it to run", res, err)
	}
}

// cancelAtAnswer cancels the caller's context as the store answers a claim.
type cancelAtAnswer struct {
	store.Store
	cancel context.CancelFunc
}

func (c cancelAtAnswer) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	res, err := c.Store.Claim(ctx, req)
	c.cancel()
	return res, err
}

// FinishTimeout is a beat under way (a third of the call's lease) plus the
// writes' timeout (the call's lease, at least 5 s), for the lease the call
// gets: the ledger's, a WithLease of the call, capped by WithLeaseAtMost.
func TestFinishTimeout(t *testing.T) {
	l := idem.New(memstore.New(), idem.WithLease(30*time.Second))
	for _, tc := range []struct {
		opts []idem.CallOption
		want time.Duration
	}{
		{nil, 10*time.Second + 30*time.Second},
		{[]idem.CallOption{idem.WithLease(90 * time.Second)}, 30*time.Second + 90*time.Second},
		{[]idem.CallOption{idem.WithLeaseAtMost(3 * time.Second)}, time.Second + 5*time.Second},
		{[]idem.CallOption{idem.WithLease(60 * time.Millisecond)}, 20*time.Millisecond + 5*time.Second},
	} {
		if got := l.FinishTimeout(tc.opts...); got != tc.want {
			t.Errorf("FinishTimeout(%d options) = %v, want %v", len(tc.opts), got, tc.want)
		}
	}
}
