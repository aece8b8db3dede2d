package idemtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// crashed leaves key claimed by a holder that never finishes (as if its
// process died inside fn) and lets its lease pass. It returns the claim.
func crashed(t *testing.T, h Harness, s store.Store, key string, p idem.Policy) store.ClaimResult {
	t.Helper()
	r := req(h, key)
	r.Owner, r.Correlation, r.Policy = "crashed-worker", "corr-crashed", p
	cr := acquire(t, s, r)
	lapse(t, h, s, key)
	return cr
}

// testPolicy holds what a lapsed attempt means under each policy through
// idem.Ledger (see "Policies" in docs/design.md): takeover, indeterminate,
// operator resolution and the Reconcile hook.
func testPolicy(t *testing.T, h Harness) {
	t.Run("at_least_once/takeover", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		crashed(t, h, s, "k", idem.AtLeastOnce)
		var c counter
		res := do(t, ledger(h, s), idem.RawKey("k"), c.fn([]byte("second try")))
		c.want(t, 1)
		wantResult(t, res, []byte("second try"), false, 2)
		if !res.Takeover {
			t.Fatal("Do over a lapsed AtLeastOnce attempt: Takeover = false, want true")
		}
		rec := get(t, s, "k")
		if rec.Status != idem.StatusCompleted || len(rec.Journal) != 2 || rec.Journal[0].Outcome != store.OutcomeLapsed || !rec.Journal[1].Takeover {
			t.Fatalf("after the takeover: %s with journal %+v; want completed, [lapsed, takeover]", rec.Status, rec.Journal)
		}
	})

	t.Run("at_most_once/indeterminate", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		cr := crashed(t, h, s, "k", idem.AtMostOnce)
		var c counter
		for _, p := range []idem.Policy{idem.AtMostOnce, idem.AtLeastOnce} { // the record's policy decides
			_, err := ledger(h, s, idem.WithPolicy(p)).Do(context.Background(), idem.RawKey("k"), c.fn(nil))
			wantIndeterminate(t, err, cr.Record)
		}
		c.want(t, 0)
		if rec := get(t, s, "k"); rec.Fence != cr.Record.Fence || rec.AttemptID != cr.Record.AttemptID || rec.Status != idem.StatusInProgress {
			t.Fatalf("after indeterminate calls: {%s, fence %d, attempt id %q}, want the lapsed attempt's unchanged {in_progress, %d, %q}",
				rec.Status, rec.Fence, rec.AttemptID, cr.Record.Fence, cr.Record.AttemptID)
		}
	})

	t.Run("at_most_once/resolved_not_done", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s, idem.WithPolicy(idem.AtMostOnce))
		cr := crashed(t, h, s, "k", idem.AtMostOnce)
		var c counter
		_, err := l.Do(context.Background(), idem.RawKey("k"), c.fn(nil))
		wantIndeterminate(t, err, cr.Record)
		_, err = s.Resolve(context.Background(), store.ResolveRequest{Key: "k", Fence: cr.Record.Fence, Done: false, Reason: "not in the provider's log", By: "op"})
		noErr(t, "Resolve(not done)", err)
		res := do(t, l, idem.RawKey("k"), c.fn([]byte("sent")))
		c.want(t, 1)
		wantResult(t, res, []byte("sent"), false, 2)
		if res.Takeover {
			t.Fatal("Do after Resolve(not done): Takeover = true, want false (the key was released)")
		}
	})

	t.Run("at_most_once/resolved_done", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s, idem.WithPolicy(idem.AtMostOnce))
		cr := crashed(t, h, s, "k", idem.AtMostOnce)
		_, err := s.Resolve(context.Background(), store.ResolveRequest{Key: "k", Fence: cr.Record.Fence, Done: true, Result: []byte("msg-id-9"), Retention: time.Hour, By: "op"})
		noErr(t, "Resolve(done)", err)
		var c counter
		res := do(t, l, idem.RawKey("k"), c.fn([]byte("sent again")))
		c.want(t, 0)
		if !res.Replayed {
			t.Fatal("Do after Resolve(done): Replayed = false, want true")
		}
		wantBytes(t, "Value", res.Value, []byte("msg-id-9"))
	})

	for _, p := range []idem.Policy{idem.AtMostOnce, idem.AtLeastOnce} {
		t.Run("reconcile/done/"+p.String(), func(t *testing.T) {
			t.Parallel()
			s := newStore(t, h)
			l := ledger(h, s, idem.WithPolicy(p))
			cr := crashed(t, h, s, "k", p)
			var got []idem.Lapsed
			hook := idem.WithReconcile(func(_ context.Context, lp idem.Lapsed) ([]byte, bool, error) {
				got = append(got, lp)
				return []byte("found-in-provider"), true, nil
			})
			var c counter
			res := do(t, l, idem.RawKey("k"), c.fn([]byte("sent")), hook)
			c.want(t, 0)
			if !res.Reconciled || !res.Takeover || res.Replayed {
				t.Fatalf("reconciled Do: Reconciled %v, Takeover %v, Replayed %v; want true, true, false", res.Reconciled, res.Takeover, res.Replayed)
			}
			wantBytes(t, "Value", res.Value, []byte("found-in-provider"))
			if len(got) != 1 {
				t.Fatalf("Reconcile hook called %d times, want 1", len(got))
			}
			if lp := got[0]; lp.Key != "k" || lp.Fence != cr.Record.Fence || lp.Attempt != 1 || lp.Owner != "crashed-worker" || lp.Correlation != "corr-crashed" {
				t.Fatalf("hook got %+v, want the lapsed attempt {k, fence %d, attempt 1, crashed-worker, corr-crashed}", lp, cr.Record.Fence)
			}
			rec := get(t, s, "k")
			if rec.Status != idem.StatusCompleted {
				t.Fatalf("after reconcile(done): %s, want completed", rec.Status)
			}
			wantBytes(t, "stored Result", rec.Result, []byte("found-in-provider"))
			res = do(t, l, idem.RawKey("k"), c.fn([]byte("sent")), hook)
			c.want(t, 0)
			if !res.Replayed || len(got) != 1 {
				t.Fatalf("Do after reconcile: Replayed %v, hook calls %d; want a replay without the hook", res.Replayed, len(got))
			}
			wantBytes(t, "replayed Value", res.Value, []byte("found-in-provider"))
		})
	}

	// While the hook runs, an operator deletes the key and another caller
	// claims and completes it again. Its new record starts above every
	// fence the key had (fences never repeat), so it never names the
	// attempt the reconciling call holds, and the hook's "done" must not
	// overwrite its result.
	t.Run("reconcile/done_after_delete_and_recomplete", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s, idem.WithPolicy(idem.AtMostOnce))
		crashed(t, h, s, "k", idem.AtMostOnce)
		var held, theirs idem.Record
		hook := idem.WithReconcile(func(hctx context.Context, _ idem.Lapsed) ([]byte, bool, error) {
			// The operator and the other caller are not this call: the
			// ledger cancels hctx when its heartbeat finds the key taken
			// away (on a real clock, possibly midway through), which must
			// not stop them.
			ctx := context.WithoutCancel(hctx)
			var err error
			if held, err = s.Get(ctx, "k"); err != nil {
				return nil, false, err
			}
			if err := s.Delete(ctx, "k"); err != nil {
				return nil, false, err
			}
			pass(t, h, s, time.Millisecond) // as any clock does between two calls
			r := req(h, "k")
			r.Owner = "other"
			cr, err := s.Claim(ctx, r)
			if err != nil {
				return nil, false, err
			}
			if !cr.Acquired {
				return nil, false, fmt.Errorf("other's claim found %s at fence %d", cr.Record.Status, cr.Record.Fence)
			}
			theirs = cr.Record
			return []byte("found-in-provider"), true, s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("theirs"), Retention: longRetention})
		})
		var c counter
		_, err := l.Do(context.Background(), idem.RawKey("k"), c.fn([]byte("sent")), hook)
		c.want(t, 0)
		wantErr(t, "reconciled Do whose key was deleted and completed again", err, idem.ErrLeaseLost)
		if theirs.Fence <= held.Fence {
			t.Fatalf("other's claim after Delete: fence %d, want above the fence %d of the attempt the reconciling call held (fences never repeat)", theirs.Fence, held.Fence)
		}
		rec := get(t, s, "k")
		if rec.Status != idem.StatusCompleted || rec.Fence != theirs.Fence || rec.AttemptID != theirs.AttemptID || rec.Owner != "other" {
			t.Fatalf("after the refused reconcile: {%s, fence %d, attempt id %q, owner %q}, want the other caller's {completed, %d, %q, other}",
				rec.Status, rec.Fence, rec.AttemptID, rec.Owner, theirs.Fence, theirs.AttemptID)
		}
		wantBytes(t, "stored Result", rec.Result, []byte("theirs"))
	})

	t.Run("reconcile/not_done", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s, idem.WithPolicy(idem.AtMostOnce))
		crashed(t, h, s, "k", idem.AtMostOnce)
		hook := idem.WithReconcile(func(context.Context, idem.Lapsed) ([]byte, bool, error) { return nil, false, nil })
		var c counter
		res := do(t, l, idem.RawKey("k"), c.fn([]byte("sent")), hook)
		c.want(t, 1)
		wantResult(t, res, []byte("sent"), false, 2)
		if res.Reconciled || !res.Takeover {
			t.Fatalf("Reconciled %v Takeover %v, want false true", res.Reconciled, res.Takeover)
		}
	})

	t.Run("reconcile/error_leaves_key_lapsed", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s, idem.WithPolicy(idem.AtMostOnce))
		crashed(t, h, s, "k", idem.AtMostOnce)
		errProvider := errors.New("provider search unavailable")
		hook := idem.WithReconcile(func(context.Context, idem.Lapsed) ([]byte, bool, error) { return nil, false, errProvider })
		var c counter
		_, err := l.Do(context.Background(), idem.RawKey("k"), c.fn(nil), hook)
		c.want(t, 0)
		wantErr(t, "Do with a failing Reconcile hook", err, errProvider)
		rec := get(t, s, "k")
		if rec.Status != idem.StatusInProgress || !rec.Lapsed(now(t, s)) {
			t.Fatalf("after a failing Reconcile hook: {%s, lapsed %v}, want in_progress and lapsed", rec.Status, rec.Lapsed(now(t, s)))
		}
		_, err = l.Do(context.Background(), idem.RawKey("k"), c.fn(nil))
		wantErr(t, "Do without the hook after it failed", err, idem.ErrIndeterminate)
		c.want(t, 0)
	})

	// A handler that fails after its effect ("throw after the send") releases
	// the key under AtLeastOnce; the hook is asked before fn runs again.
	t.Run("reconcile/after_release_with_error", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s) // AtLeastOnce
		var c counter
		_, err := l.Do(context.Background(), idem.RawKey("k"), c.fail(errBoom), idem.WithCorrelationID("corr-1"))
		wantErr(t, "first Do", err, errBoom)
		released := get(t, s, "k") // a release keeps the attempt's fence
		var got []idem.Lapsed
		hook := idem.WithReconcile(func(_ context.Context, lp idem.Lapsed) ([]byte, bool, error) {
			got = append(got, lp)
			return []byte("found"), true, nil
		})
		res := do(t, l, idem.RawKey("k"), c.fn([]byte("sent-again")), hook)
		c.want(t, 1) // the first, failing call only
		if !res.Reconciled || res.Takeover || res.Replayed {
			t.Fatalf("Do after a release with an error: Reconciled %v, Takeover %v, Replayed %v; want true, false, false", res.Reconciled, res.Takeover, res.Replayed)
		}
		wantBytes(t, "Value", res.Value, []byte("found"))
		if len(got) != 1 || got[0].Outcome != store.OutcomeReleased || got[0].Attempt != 1 || got[0].Fence != released.Fence || got[0].Correlation != "corr-1" || !strings.Contains(got[0].Reason, errBoom.Error()) {
			t.Fatalf("hook got %+v, want one call about attempt 1 (released, fence %d, corr-1, reason %q)", got, released.Fence, errBoom)
		}
		if rec := get(t, s, "k"); rec.Status != idem.StatusCompleted {
			t.Fatalf("after reconcile(done): %s, want completed", rec.Status)
		}
		// Not done: fn runs.
		s2 := newStore(t, h)
		l2 := ledger(h, s2)
		_, _ = l2.Do(context.Background(), idem.RawKey("k"), c.fail(errBoom))
		res = do(t, l2, idem.RawKey("k"), c.fn([]byte("v")), idem.WithReconcile(func(context.Context, idem.Lapsed) ([]byte, bool, error) { return nil, false, nil }))
		if res.Reconciled || res.Replayed {
			t.Fatalf("reconcile(not done): Reconciled %v Replayed %v, want fn to run", res.Reconciled, res.Replayed)
		}
		c.want(t, 3)
	})

	t.Run("reconcile/not_called_without_takeover", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		calls := 0
		hook := idem.WithReconcile(func(context.Context, idem.Lapsed) ([]byte, bool, error) { calls++; return nil, true, nil })
		var c counter
		res := do(t, ledger(h, s), idem.Key("fresh"), c.fn([]byte("v")), hook)
		if calls != 0 || res.Reconciled {
			t.Fatalf("hook called %d times on a fresh key (Reconciled %v), want 0", calls, res.Reconciled)
		}
		c.want(t, 1)
	})

	t.Run("per_call_policy", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s) // AtLeastOnce by default
		var c counter
		_, err := l.Do(context.Background(), idem.Key("k"), c.fail(errBoom), idem.WithPolicy(idem.AtMostOnce))
		wantErr(t, "Do", err, errBoom)
		if rec := get(t, s, "k"); rec.Policy != idem.AtMostOnce || rec.Status != idem.StatusInProgress {
			t.Fatalf("record {%s, %s}, want {in_progress, at_most_once}", rec.Status, rec.Policy)
		}
		_, err = l.Do(context.Background(), idem.Key("k"), c.fn(nil))
		wantErr(t, "Do after an AtMostOnce error", err, idem.ErrIndeterminate)
	})
}

// wantIndeterminate fails the test unless err is an *idem.IndeterminateError
// about the lapsed attempt in held.
func wantIndeterminate(t testing.TB, err error, held idem.Record) {
	t.Helper()
	if !errors.Is(err, idem.ErrIndeterminate) {
		t.Fatalf("Do on a lapsed AtMostOnce key: err = %v, want ErrIndeterminate", err)
	}
	var ie *idem.IndeterminateError
	if !errors.As(err, &ie) {
		t.Fatalf("err = %T, want *idem.IndeterminateError", err)
	}
	if ie.Key != held.Key || ie.Fence != held.Fence || ie.Attempt != held.Attempt || ie.Owner != held.Owner {
		t.Fatalf("IndeterminateError = %+v, want key %q fence %d attempt %d owner %q", ie, held.Key, held.Fence, held.Attempt, held.Owner)
	}
	if ie.Since.IsZero() {
		t.Fatal("IndeterminateError.Since is zero, want when the lease ended")
	}
	if errors.Is(err, idem.ErrInProgress) {
		t.Fatal("an indeterminate key also reports ErrInProgress")
	}
}
