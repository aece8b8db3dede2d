package idemtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// errInjected is the error a FaultStore injects in the suite.
var errInjected = errors.New("idemtest: injected store failure")

// wantStoreError fails the test unless err is a store failure as a user
// must see it: a *idem.StoreError, never read as an outcome (not busy,
// indeterminate, mismatch, failed or lease-lost).
func wantStoreError(t testing.TB, what string, err error) *idem.StoreError {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want a store error", what)
	}
	for _, outcome := range []error{idem.ErrInProgress, idem.ErrIndeterminate, idem.ErrMismatch, idem.ErrFailed, idem.ErrInvalidKey} {
		if errors.Is(err, outcome) {
			t.Fatalf("%s: err = %v reads as the outcome %v, want a store error", what, err, outcome)
		}
	}
	var se *idem.StoreError
	if !errors.As(err, &se) {
		t.Fatalf("%s: err = %v (%T), want a *idem.StoreError", what, err, err)
	}
	return se
}

// testFaults holds store failures: closed and unreachable stores, failures
// injected on one operation, and corrupt records.
func testFaults(t *testing.T, h Harness) {
	t.Run("closed", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s)
		var c counter
		do(t, l, idem.Key("done"), c.fn([]byte("r")))
		noErr(t, "Close", s.Close())
		for _, key := range []string{"done", "new"} {
			res, err := l.Do(context.Background(), idem.Key(key), c.fn(nil))
			wantStoreError(t, "Do on a closed store", err)
			wantErr(t, "Do on a closed store", err, idem.ErrClosed)
			if res.Replayed || res.Value != nil {
				t.Fatalf("Do on a closed store returned a result %+v", res)
			}
		}
		c.want(t, 1)
		ctx := context.Background()
		_, err := s.Claim(ctx, req(h, "k"))
		wantErr(t, "Claim after Close", err, idem.ErrClosed)
		_, err = s.Get(ctx, "done")
		wantErr(t, "Get after Close", err, idem.ErrClosed)
		wantErr(t, "Complete after Close", s.Finish(ctx, store.FinishRequest{Key: "done", Fence: 1, AttemptID: "any", Outcome: store.OutcomeCompleted, Result: nil, Retention: time.Hour}), idem.ErrClosed)
		_, err = s.Extend(ctx, store.ExtendRequest{Key: "done", Fence: 1, AttemptID: "any", Lease: time.Hour})
		wantErr(t, "Extend after Close", err, idem.ErrClosed)
		_, err = s.List(ctx, store.ListQuery{})
		wantErr(t, "List after Close", err, idem.ErrClosed)
		_, err = s.Sweep(ctx, 10)
		wantErr(t, "Sweep after Close", err, idem.ErrClosed)
		_, err = s.Now(ctx)
		wantErr(t, "Now after Close", err, idem.ErrClosed)
	})

	t.Run("unreachable", func(t *testing.T) {
		t.Parallel()
		if h.Unreachable == nil {
			t.Skip("Harness.Unreachable is not set")
		}
		s := h.Unreachable(t)
		t.Cleanup(func() { _ = s.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var c counter
		// outageLease: a claim the store refuses is retried for the
		// lease's finish timeout, 30 s at the suite's fake-clock lease.
		_, err := ledger(h, s, idem.WithLease(outageLease)).Do(ctx, idem.Key("k"), c.fn(nil))
		wantStoreError(t, "Do on an unreachable store", err)
		c.want(t, 0)
		_, err = s.Get(ctx, "k")
		if err == nil || errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Get on an unreachable store: %v, want an error that is not ErrNotFound", err)
		}
	})

	t.Run("claim_fails", func(t *testing.T) {
		// Powertools persistence_exception_save_inprogress_error.
		t.Parallel()
		s := newStore(t, h)
		fs := NewFaultStore(s)
		fs.Inject(OpClaim, Fault{Err: errInjected})
		var c counter
		_, err := ledger(h, fs).Do(context.Background(), idem.Key("k"), c.fn(nil))
		se := wantStoreError(t, "Do whose claim fails", err)
		wantErr(t, "Do whose claim fails", err, errInjected)
		if se.Op != "claim" || se.Key != "k" {
			t.Fatalf("StoreError{Op %q, Key %q}, want {claim, k}", se.Op, se.Key)
		}
		c.want(t, 0)
		wantNotFound(t, s, "k")
	})

	t.Run("complete_fails", func(t *testing.T) {
		// Powertools persistence_exception_updating: fn ran, its result
		// could not be recorded while the store stayed out of reach. The
		// Ledger retries for its finish timeout, then reports a store
		// error: not a success; the key is left to its lease and policy.
		t.Parallel()
		s := newStore(t, h)
		fs := NewFaultStore(s)
		l := ledger(h, fs, idem.WithLease(outageLease))
		fs.Inject(OpComplete, Fault{Err: errInjected})
		var c counter
		start := time.Now()
		res, err := l.Do(context.Background(), idem.Key("k"), c.fn([]byte("sent")))
		took := time.Since(start)
		se := wantStoreError(t, "Do whose completion fails", err)
		wantErr(t, "Do whose completion fails", err, errInjected)
		if se.Op != "complete" {
			t.Fatalf("StoreError.Op = %q, want complete", se.Op)
		}
		if res.Value != nil {
			t.Fatalf("Do returned a value %q with a store error", res.Value)
		}
		wantRetried(t, fs, OpComplete, took, l.FinishTimeout())
		c.want(t, 1)
		fs.Heal(OpComplete)
		rec := get(t, s, "k")
		if rec.Status != idem.StatusInProgress {
			t.Fatalf("after a failed completion: %s, want in_progress (left to its lease)", rec.Status)
		}
		lapse(t, h, s, "k")
		res = do(t, l, idem.Key("k"), c.fn([]byte("sent again")))
		if !res.Takeover || res.Attempt != 2 {
			t.Fatalf("Do after the lease passed: Takeover %v, Attempt %d; want a takeover, attempt 2", res.Takeover, res.Attempt)
		}
		c.want(t, 2)
	})

	// A finishing write that fails once, or lands but loses its answer, is
	// sent again: the attempt ends as fn's outcome says, fn runs once, and
	// the caller gets fn's outcome, not a store error.
	for _, tc := range []struct {
		name   string
		op     Op
		policy idem.Policy
		fnErr  error
		status idem.Status
	}{
		{"complete", OpComplete, idem.AtLeastOnce, nil, idem.StatusCompleted},
		{"fail", OpFail, idem.AtLeastOnce, idem.Permanent(errBoom), idem.StatusFailed},
		{"release", OpRelease, idem.AtLeastOnce, errBoom, idem.StatusReleased},
		{"abandon", OpAbandon, idem.AtMostOnce, errBoom, idem.StatusInProgress},
	} {
		for _, lost := range []bool{false, true} {
			name := tc.name + "_cut_once"
			if lost {
				name = tc.name + "_answer_lost"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				s := newStore(t, h)
				fs := NewFaultStore(s)
				l := ledger(h, fs, idem.WithPolicy(tc.policy))
				fs.Inject(tc.op, Fault{Err: errInjected, After: lost, Times: 1})
				var c counter
				fn := c.fn([]byte("sent"))
				if tc.fnErr != nil {
					fn = c.fail(tc.fnErr)
				}
				res, err := l.Do(context.Background(), idem.Key("k"), fn)
				if errors.Is(err, errInjected) {
					t.Fatalf("Do whose %s failed once: %v; want the write sent again and fn's outcome", tc.op, err)
				}
				if tc.fnErr == nil {
					noErr(t, "Do", err)
					wantBytes(t, "Value", res.Value, []byte("sent"))
				} else if !errors.Is(err, errBoom) || errors.Is(err, idem.ErrLeaseLost) {
					t.Fatalf("Do = %v, want fn's error alone", err)
				}
				if n := fs.Calls(tc.op); n != 2 {
					t.Fatalf("%d %s calls, want 2 (the failed one and its retry)", n, tc.op)
				}
				c.want(t, 1)
				rec := get(t, s, "k")
				if rec.Status != tc.status || len(rec.Journal) != 1 || rec.Journal[0].Outcome != outcomeOf(tc.op) {
					t.Fatalf("after the retried %s: {%s, journal %+v}, want %s with one entry ended %s", tc.op, rec.Status, rec.Journal, tc.status, outcomeOf(tc.op))
				}
				if tc.status == idem.StatusCompleted {
					res := do(t, l, idem.Key("k"), c.fn(nil))
					wantResult(t, res, []byte("sent"), true, 1)
					c.want(t, 1)
				}
			})
		}
	}

	t.Run("release_fails", func(t *testing.T) {
		// Powertools persistence_exception_deleting: fn failed and the
		// release failed too, for the whole retry window. The caller sees
		// both.
		t.Parallel()
		s := newStore(t, h)
		fs := NewFaultStore(s)
		l := ledger(h, fs, idem.WithLease(outageLease))
		fs.Inject(OpRelease, Fault{Err: errInjected})
		var c counter
		start := time.Now()
		_, err := l.Do(context.Background(), idem.Key("k"), c.fail(errBoom))
		wantRetried(t, fs, OpRelease, time.Since(start), l.FinishTimeout())
		wantErr(t, "Do whose release fails", err, errBoom)
		wantErr(t, "Do whose release fails", err, errInjected)
		var se *idem.StoreError
		if !errors.As(err, &se) || se.Op != "release" {
			t.Fatalf("err = %v, want it to hold a *idem.StoreError for the release", err)
		}
		if rec := get(t, s, "k"); rec.Status != idem.StatusInProgress {
			t.Fatalf("after a failed release: %s, want in_progress (left to its lease)", rec.Status)
		}
		fs.Heal(OpRelease)
		lapse(t, h, s, "k")
		res := do(t, l, idem.Key("k"), c.fn([]byte("ok")))
		if !res.Takeover || res.Attempt != 2 {
			t.Fatalf("Do after the lease passed: Takeover %v, Attempt %d; want a takeover, attempt 2", res.Takeover, res.Attempt)
		}
	})

	for _, tc := range []struct {
		op     Op
		policy idem.Policy
		err    error
	}{
		{OpFail, idem.AtLeastOnce, idem.Permanent(errBoom)},
		{OpAbandon, idem.AtMostOnce, errBoom},
	} {
		t.Run(string(tc.op)+"_fails", func(t *testing.T) {
			t.Parallel()
			s := newStore(t, h)
			fs := NewFaultStore(s)
			fs.Inject(tc.op, Fault{Err: errInjected})
			var c counter
			_, err := ledger(h, fs, idem.WithPolicy(tc.policy), idem.WithLease(outageLease)).Do(context.Background(), idem.Key("k"), c.fail(tc.err))
			wantErr(t, "Do whose "+string(tc.op)+" fails", err, errBoom)
			wantErr(t, "Do whose "+string(tc.op)+" fails", err, errInjected)
			var se *idem.StoreError
			if !errors.As(err, &se) || se.Op != string(tc.op) {
				t.Fatalf("Do whose %s fails: err = %v, want it to hold a *idem.StoreError with Op %q", tc.op, err, tc.op)
			}
		})
	}

	t.Run("extend_fails", func(t *testing.T) {
		// Heartbeats cannot reach the store: once the lease has passed by
		// the local clock, fn is cancelled; no other attempt took the key,
		// so what fn returns is recorded under its fence.
		t.Parallel()
		fs, _ := loseLease(t, h, Fault{Err: errInjected})
		if fs.Calls(OpExtend) < 2 {
			t.Fatalf("%d heartbeats, want at least 2 before giving up", fs.Calls(OpExtend))
		}
	})

	t.Run("extend_hangs", func(t *testing.T) {
		// Heartbeats reach a store that never answers (each Extend waits
		// until its context ends): fn is cancelled when its lease runs out,
		// not an extension timeout later.
		t.Parallel()
		_, cancelledAfter := loseLease(t, h, Fault{Delay: time.Hour})
		if lease := h.hbLease(); cancelledAfter > 3*lease {
			t.Fatalf("fn cancelled after %v; want when its lease of %v ran out", cancelledAfter, lease)
		}
	})

	t.Run("extend_fails_once", func(t *testing.T) {
		// The first heartbeat fails, the second must keep the lease: fn
		// runs past the lease it claimed with. The second heartbeat, sent
		// at two thirds of the lease, has the last third to be answered:
		// the lease is three times the harness's, so that this is the
		// harness's whole heartbeat lease, not a third of it. A store
		// shared with the suite's race tests answered it late in CI at
		// 3 s (dynalite, 1 s to answer), and again at 6 s (2 s) with two
		// CI runs sharing the machine.
		t.Parallel()
		fs := NewFaultStore(newStore(t, h))
		fs.Inject(OpExtend, Fault{Err: errInjected, Times: 1})
		lease := 3 * h.hbLease()
		l := ledger(h, fs, idem.WithLease(lease))
		res, err := l.Do(context.Background(), idem.Key("k"), func(ctx context.Context) ([]byte, error) {
			select {
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			case <-time.After(lease + lease/3):
				return []byte("ok"), nil
			}
		})
		noErr(t, "Do with one failed heartbeat", err)
		wantBytes(t, "Value", res.Value, []byte("ok"))
		if n := fs.Calls(OpExtend); n < 2 {
			t.Fatalf("%d heartbeats, want the failed one and at least one more", n)
		}
	})

	t.Run("corrupt", func(t *testing.T) {
		t.Parallel()
		if h.Corrupt == nil {
			t.Skip("Harness.Corrupt is not set")
		}
		s := newStore(t, h)
		l := ledger(h, s)
		var c counter
		do(t, l, idem.Key("k"), c.fn([]byte("r")))
		h.Corrupt(t, s, "k")
		_, err := l.Do(context.Background(), idem.Key("k"), c.fn(nil))
		wantErr(t, "Do on a corrupt record", err, idem.ErrCorrupt)
		var ce *idem.CorruptError
		if !errors.As(err, &ce) {
			t.Fatalf("err = %T, want it to hold a *idem.CorruptError", err)
		}
		c.want(t, 1)
		_, err = s.Get(context.Background(), "k")
		wantErr(t, "Get of a corrupt record", err, idem.ErrCorrupt)
		// Never read as absent: a claim does not overwrite it.
		_, err = s.Claim(context.Background(), req(h, "k"))
		wantErr(t, "Claim of a corrupt record", err, idem.ErrCorrupt)
	})
}

// loseLease runs Do with a fn that waits for its context, on a store whose
// heartbeats suffer fault, and checks what a lease that runs out here must
// give: fn cancelled with ErrLeaseLost no sooner than its lease could have
// passed, and, as no other attempt took the key, fn's result recorded under
// its fence. It returns the store and how long fn ran.
func loseLease(t *testing.T, h Harness, fault Fault) (*FaultStore, time.Duration) {
	t.Helper()
	s := newStore(t, h)
	fs := NewFaultStore(s)
	fs.Inject(OpExtend, fault)
	lease := h.hbLease()
	l := ledger(h, fs, idem.WithLease(lease))
	var cancelledAfter time.Duration
	start := time.Now()
	_, err := l.Do(context.Background(), idem.Key("k"), func(ctx context.Context) ([]byte, error) {
		select {
		case <-ctx.Done():
			cancelledAfter = time.Since(start)
			if !errors.Is(context.Cause(ctx), idem.ErrLeaseLost) {
				t.Errorf("fn's context cause %v, want ErrLeaseLost", context.Cause(ctx))
			}
		case <-time.After(time.Minute): // only a failing store waits this long
			t.Error("fn was not cancelled although no heartbeat was granted")
		}
		return []byte("late"), nil
	})
	if err != nil {
		t.Fatalf("Do whose heartbeats were not granted: %v; want fn's result recorded (no other attempt took the key)", err)
	}
	if cancelledAfter < lease-lease/10 {
		t.Fatalf("fn cancelled after %v, before its lease (%v) could have passed", cancelledAfter, lease)
	}
	if rec := get(t, s, "k"); rec.Status != idem.StatusCompleted || string(rec.Result) != "late" || len(rec.Journal) != 1 || rec.Journal[0].Outcome != store.OutcomeCompleted {
		t.Fatalf("after the lease ran out here: {%s, result %q, journal %+v}, want completed with fn's result by its one attempt", rec.Status, rec.Result, rec.Journal)
	}
	return fs, cancelledAfter
}

// outageLease is the lease of the tests whose store stays out of reach for
// a whole finish timeout (the Ledger's floor, 5 s): no longer than that.
const outageLease = time.Second

// wantRetried fails the test unless a write of op that the store refused
// for a whole finish timeout was sent more than once and the call took
// about that timeout (the Ledger's retries are bounded by it).
func wantRetried(t testing.TB, fs *FaultStore, op Op, took, finishTimeout time.Duration) {
	t.Helper()
	if n := fs.Calls(op); n < 2 {
		t.Fatalf("%d %s calls, want the write retried while the store was out of reach", n, op)
	}
	if took > finishTimeout+5*time.Second {
		t.Fatalf("Do took %v, want its retries to stop after its finish timeout (%v)", took, finishTimeout)
	}
}

// outcomeOf is the journal outcome a finishing write of op records.
func outcomeOf(op Op) store.Outcome {
	switch op {
	case OpComplete:
		return store.OutcomeCompleted
	case OpFail:
		return store.OutcomeFailed
	case OpRelease:
		return store.OutcomeReleased
	case OpAbandon:
		return store.OutcomeAbandoned
	}
	return ""
}
