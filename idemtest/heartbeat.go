package idemtest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// realTime makes the store's clock move with real time until the returned
// stop is called: with a frozen fake clock it advances the clock in small
// steps; with a clock that moves by itself it does nothing.
func realTime(t *testing.T, h Harness, s store.Store) (stop func()) {
	t.Helper()
	if h.Advance == nil {
		return func() {}
	}
	a := now(t, s)
	time.Sleep(5 * time.Millisecond)
	if now(t, s).After(a) {
		return func() {} // the harness's clock moves by itself
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		const step = 5 * time.Millisecond
		tk := time.NewTicker(step)
		defer tk.Stop()
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case n := <-tk.C:
				h.Advance(t, n.Sub(last))
				last = n
			}
		}
	})
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// testHeartbeat holds the Ledger's heartbeats: a slow fn keeps its key,
// and an fn whose key another attempt or an operator took is cancelled
// and records nothing.
func testHeartbeat(t *testing.T, h Harness) {
	t.Run("slow_fn_keeps_its_key", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		fs := NewFaultStore(s)
		l := ledger(h, fs, idem.WithLease(h.hbLease()))
		other := ledger(h, s, idem.WithLease(h.hbLease()), idem.WithOwner("other"))
		stop := realTime(t, h, s)
		defer stop()
		key := idem.Key("slow")
		inside := make(chan struct{})
		var runErr error
		fnDone := make(chan struct{})
		go func() {
			defer close(fnDone)
			var res idem.Result
			res, runErr = l.Do(context.Background(), key, func(ctx context.Context) ([]byte, error) {
				close(inside)
				select {
				case <-time.After(3 * h.hbLease()):
					return []byte("slow result"), nil
				case <-ctx.Done():
					return nil, context.Cause(ctx)
				}
			})
			if runErr == nil && (res.Attempt != 1 || res.Takeover || string(res.Value) != "slow result") {
				runErr = errors.New("slow Do finished with an unexpected result")
			}
		}()
		<-inside
		var c counter
		for probes := 0; ; probes++ {
			select {
			case <-fnDone:
				if probes < 5 {
					t.Fatalf("only %d concurrent calls probed the key while fn ran", probes)
				}
				noErr(t, "Do with a fn that runs 3 leases", runErr)
				stop()
				c.want(t, 0)
				if n := fs.Calls(OpExtend); n < 3 {
					t.Fatalf("%d heartbeats (Extend calls) during 3 leases, want at least 3", n)
				}
				res := do(t, other, key, c.fn(nil))
				wantResult(t, res, []byte("slow result"), true, 1)
				return
			case <-time.After(h.hbLease() / 6):
			}
			res, err := other.Do(context.Background(), key, c.fn([]byte("intruder")))
			if err == nil && res.Replayed && string(res.Value) == "slow result" {
				// The slow attempt recorded its result an instant before its
				// Do returned: replaying it is right.
				<-fnDone
				continue
			}
			if !errors.Is(err, idem.ErrInProgress) {
				t.Fatalf("concurrent Do while a heartbeating fn runs: %+v, %v; want ErrInProgress", res, err)
			}
		}
	})

	t.Run("lease_lost/resolved_while_running", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s, idem.WithLease(h.hbLease()))
		testLeaseLost(t, s, l, func(t *testing.T, rec idem.Record) {
			_, err := s.Resolve(context.Background(), store.ResolveRequest{Key: rec.Key, Fence: rec.Fence, Done: false, Reason: "operator", By: "op"})
			noErr(t, "Resolve", err)
		}, func(t *testing.T, rec, lost idem.Record) {
			if rec.Status != idem.StatusReleased || len(rec.Result) != 0 || rec.Fence != lost.Fence+1 {
				t.Fatalf("after the lost attempt: {%s, result %q, fence %d}, want the resolution {released, none, %d (the lost attempt's + 1)}", rec.Status, rec.Result, rec.Fence, lost.Fence+1)
			}
		})
	})

	t.Run("lease_lost/taken_over_while_running", func(t *testing.T) {
		t.Parallel()
		if h.Advance == nil {
			t.Skip("needs Harness.Advance: on the real clock the heartbeats keep the lease")
		}
		s := newStore(t, h)
		l := ledger(h, s, idem.WithLease(h.hbLease()))
		var taker store.ClaimResult
		testLeaseLost(t, s, l, func(t *testing.T, rec idem.Record) {
			taker = takeOver(t, h, s, rec.Key)
		}, func(t *testing.T, rec, lost idem.Record) {
			if taker.Record.Fence != lost.Fence+1 {
				t.Fatalf("the takeover of the running attempt: fence %d, want %d (the lost attempt's + 1)", taker.Record.Fence, lost.Fence+1)
			}
			if rec.Status != idem.StatusInProgress || rec.Owner != "taker" || rec.Fence != taker.Record.Fence || rec.AttemptID != taker.Record.AttemptID || len(rec.Result) != 0 {
				t.Fatalf("after the lost attempt: {%s, owner %q, fence %d, attempt id %q, result %q}, want the taker's {in_progress, taker, %d, %q, none}",
					rec.Status, rec.Owner, rec.Fence, rec.AttemptID, rec.Result, taker.Record.Fence, taker.Record.AttemptID)
			}
		})
	})

	t.Run("lease_lost/complete_refused", func(t *testing.T) {
		// fn finishes after its lease was taken over but before a heartbeat
		// noticed: the completion is refused and marks the late finish.
		t.Parallel()
		if h.Advance == nil {
			t.Skip("needs Harness.Advance to take over a lease within one heartbeat")
		}
		s := newStore(t, h)
		l := ledger(h, s, idem.WithLease(time.Hour))
		var lost idem.Record
		var taker store.ClaimResult
		res, err := l.Do(context.Background(), idem.Key("k"), func(ctx context.Context) ([]byte, error) {
			lost = get(t, s, "k")
			taker = takeOver(t, h, s, "k")
			return []byte("stale"), nil
		})
		wantErr(t, "Do whose completion found the lease lost", err, idem.ErrLeaseLost)
		if res.Value != nil {
			t.Fatalf("Do returned a value %q with ErrLeaseLost", res.Value)
		}
		rec := get(t, s, "k")
		if rec.Status != idem.StatusInProgress || rec.Owner != "taker" || rec.Fence != taker.Record.Fence || rec.AttemptID != taker.Record.AttemptID || len(rec.Result) != 0 {
			t.Fatalf("after the refused completion: {%s, owner %q, fence %d, attempt id %q, result %q}, want the taker's in_progress record (fence %d, attempt id %q)",
				rec.Status, rec.Owner, rec.Fence, rec.AttemptID, rec.Result, taker.Record.Fence, taker.Record.AttemptID)
		}
		if taker.Record.Fence != lost.Fence+1 {
			t.Fatalf("the takeover: fence %d, want %d (the running attempt's + 1)", taker.Record.Fence, lost.Fence+1)
		}
		if e := rec.Journal[0]; e.Fence != lost.Fence || e.AttemptID != lost.AttemptID || e.LateFinish.IsZero() {
			t.Fatalf("the stale attempt's journal entry %+v, want fence %d, attempt id %q, with a LateFinish", e, lost.Fence, lost.AttemptID)
		}
	})
}

// takeOver lets the lease of key pass and claims it as "taker", retrying
// while a heartbeat renews the lease in between. It returns the claim.
func takeOver(t *testing.T, h Harness, s store.Store, key string) store.ClaimResult {
	t.Helper()
	r := req(h, key)
	r.Owner, r.TakeLapsed = "taker", true
	for range 50 {
		lapse(t, h, s, key)
		if cr := claim(t, s, r); cr.Acquired {
			if !cr.Takeover || cr.Record.AttemptID != r.AttemptID {
				t.Fatalf("claim over a lapsed lease: Takeover %v, attempt id %q; want a takeover with the request's %q", cr.Takeover, cr.Record.AttemptID, r.AttemptID)
			}
			return cr
		}
	}
	t.Fatal("could not take over a lapsed lease in 50 tries")
	return store.ClaimResult{}
}

// testLeaseLost runs fn under l, makes it lose its lease with lose while it
// runs, and checks that fn's context is cancelled with ErrLeaseLost, that
// Do returns ErrLeaseLost, and (with check) that nothing was recorded.
// lose gets the record as fn's attempt held it; check gets the record
// after Do returned, and that one.
func testLeaseLost(t *testing.T, s store.Store, l *idem.Ledger, lose func(t *testing.T, held idem.Record), check func(t *testing.T, rec, held idem.Record)) {
	t.Helper()
	inside := make(chan struct{})
	cancelled := make(chan error, 1)
	type out struct {
		res idem.Result
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := l.Do(context.Background(), idem.Key("k"), func(ctx context.Context) ([]byte, error) {
			close(inside)
			select {
			case <-ctx.Done():
				cancelled <- context.Cause(ctx)
			case <-time.After(time.Minute): // only a failing store waits this long
				cancelled <- nil
			}
			return []byte("stale"), nil // ignores the cancellation: must not be recorded
		})
		done <- out{res, err}
	}()
	<-inside
	held := get(t, s, "k")
	lose(t, held)
	if cause := <-cancelled; !errors.Is(cause, idem.ErrLeaseLost) {
		t.Fatalf("fn's context after its lease was lost: cause %v, want ErrLeaseLost (fn must be cancelled)", cause)
	}
	o := <-done
	wantErr(t, "Do whose lease was lost", o.err, idem.ErrLeaseLost)
	if o.res.Value != nil {
		t.Fatalf("Do returned a value %q with ErrLeaseLost", o.res.Value)
	}
	check(t, get(t, s, "k"), held)
}
