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

// testAttempts holds what attempt identity promises: a claim whose answer
// was lost is found and undone, not left to its lease; a write names its
// attempt by id as well as fence, and an attempt ends once; fences never
// repeat for a key, across delete, sweep and expiry.
func testAttempts(t *testing.T, h Harness) {
	// The claim landed but its answer was lost (a timeout after the
	// commit, a cut connection): fn did not run, so the key is given back
	// at once, under either policy; the next call runs fn, not busy and
	// not indeterminate.
	for _, p := range []idem.Policy{idem.AtLeastOnce, idem.AtMostOnce} {
		t.Run("claim_answer_lost/"+p.String(), func(t *testing.T) {
			t.Parallel()
			s := newStore(t, h)
			fs := NewFaultStore(s)
			l := ledger(h, fs, idem.WithPolicy(p))
			fs.Inject(OpClaim, Fault{Err: errInjected, After: true, Times: 1})
			var c counter
			_, err := l.Do(context.Background(), idem.Key("k"), c.fn([]byte("never")))
			wantStoreError(t, "Do whose claim's answer was lost", err)
			c.want(t, 0)
			rec := get(t, s, "k")
			if rec.Status != idem.StatusReleased || len(rec.Journal) != 1 || !rec.Journal[0].NotRun() {
				t.Fatalf("after a claim whose answer was lost: {%s, journal %+v}, want released, its one attempt marked not run", rec.Status, rec.Journal)
			}
			res := do(t, l, idem.Key("k"), c.fn([]byte("sent")))
			wantResult(t, res, []byte("sent"), false, 2)
			if res.Takeover {
				t.Fatal("the next call took over; want a fresh attempt (the lost claim was undone)")
			}
			c.want(t, 1)
		})
	}

	// A takeover whose answer was lost is undone as a takeover: abandoned,
	// so the attempt it took over (which may have done the effect) is met
	// again by the next call.
	t.Run("takeover_answer_lost", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		crashed := acquire(t, s, req(h, "k"))
		lapse(t, h, s, "k")
		fs := NewFaultStore(s)
		l := ledger(h, fs)
		fs.Inject(OpClaim, Fault{Err: errInjected, After: true, Times: 1})
		var c counter
		_, err := l.Do(context.Background(), idem.Key("k"), c.fn(nil))
		wantStoreError(t, "Do whose takeover's answer was lost", err)
		rec := get(t, s, "k")
		if rec.Status != idem.StatusInProgress || !rec.Lapsed(now(t, s)) || rec.AttemptID != "" || len(rec.Journal) != 2 || !rec.Journal[1].NotRun() {
			t.Fatalf("after a takeover whose answer was lost: {%s, lapsed %v, attempt id %q, journal %+v}, want the takeover abandoned as not run",
				rec.Status, rec.Lapsed(now(t, s)), rec.AttemptID, rec.Journal)
		}
		var asked *idem.Lapsed
		res, err := l.Do(context.Background(), idem.Key("k"), c.fn([]byte("sent")), idem.WithReconcile(func(_ context.Context, lp idem.Lapsed) ([]byte, bool, error) {
			asked = &lp
			return nil, false, nil
		}))
		noErr(t, "Do after the undone takeover", err)
		if !res.Takeover || asked == nil || asked.Fence != crashed.Record.Fence {
			t.Fatalf("Do after the undone takeover: takeover %v, hook asked about %+v; want a takeover whose hook is asked about the crashed attempt (fence %d)", res.Takeover, asked, crashed.Record.Fence)
		}
	})

	// The store accepts the claim and then cannot be reached at all: the
	// Ledger tries to read the key for its finish timeout, then leaves
	// the key to its lease and returns the store error.
	t.Run("claim_answer_lost_store_down", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		fs := NewFaultStore(s)
		l := ledger(h, fs, idem.WithLease(outageLease))
		fs.Inject(OpClaim, Fault{Err: errInjected, After: true})
		fs.Inject(OpGet, Fault{Err: errInjected})
		start := time.Now()
		_, err := l.Do(context.Background(), idem.Key("k"), func(context.Context) ([]byte, error) { return nil, nil })
		wantStoreError(t, "Do whose store went down after the claim", err)
		wantRetried(t, fs, OpGet, time.Since(start), l.FinishTimeout())
		if rec := get(t, s, "k"); rec.Status != idem.StatusInProgress {
			t.Fatalf("after the store stayed down: %s, want in_progress (left to its lease)", rec.Status)
		}
	})

	// A finishing write names its attempt by id and fence; a write with
	// the fence and another attempt's id is refused, and so is a write
	// with the id of an attempt that held the key before.
	t.Run("finish_names_the_attempt", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		cr := acquire(t, s, req(h, "k"))
		if cr.Record.AttemptID == "" || get(t, s, "k").AttemptID != cr.Record.AttemptID {
			t.Fatalf("claim: record attempt id %q (stored %q), want the request's", cr.Record.AttemptID, get(t, s, "k").AttemptID)
		}
		for _, o := range []store.Outcome{store.OutcomeCompleted, store.OutcomeFailed, store.OutcomeReleased, store.OutcomeAbandoned} {
			err := s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: store.NewAttemptID(), Outcome: o, Result: []byte("x"), Reason: "x", Retention: time.Hour})
			wantErr(t, "Finish("+string(o)+") with another attempt's id", err, idem.ErrLeaseLost)
		}
		_, err := s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: store.NewAttemptID(), Lease: time.Hour})
		wantErr(t, "Extend with another attempt's id", err, idem.ErrLeaseLost)
		if rec := get(t, s, "k"); rec.Status != idem.StatusInProgress || rec.AttemptID != cr.Record.AttemptID {
			t.Fatalf("after refused writes: {%s, attempt id %q}, want the holder's record unchanged", rec.Status, rec.AttemptID)
		}
		_, err = s.Claim(ctx, store.ClaimRequest{Key: "k2", Owner: "o", Lease: time.Minute, Retention: time.Hour})
		wantErr(t, "Claim without an attempt id", err, store.ErrInvalid)
		wantNotFound(t, s, "k2")
	})

	// An attempt ends once: of concurrent finishing writes of one attempt
	// (two abandons, say, by callers that both held its id), exactly one
	// succeeds and the others are refused.
	for _, o := range []store.Outcome{store.OutcomeAbandoned, store.OutcomeCompleted, store.OutcomeReleased} {
		t.Run("ends_once/"+string(o), func(t *testing.T) {
			t.Parallel()
			s := newStore(t, h)
			cr := acquire(t, s, req(h, "k"))
			const n = 8
			var (
				wg   sync.WaitGroup
				mu   sync.Mutex
				won  int
				errs []error
			)
			for range n {
				wg.Go(func() {
					err := s.Finish(context.Background(), store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID,
						Outcome: o, Result: []byte("r"), Reason: "gave up", Retention: time.Hour})
					mu.Lock()
					defer mu.Unlock()
					if err == nil {
						won++
					} else if !errors.Is(err, idem.ErrLeaseLost) {
						errs = append(errs, err)
					}
				})
			}
			wg.Wait()
			if won != 1 || len(errs) != 0 {
				t.Fatalf("%d concurrent %s writes of one attempt: %d succeeded, other errors %v; want exactly one, the rest ErrLeaseLost", n, o, won, errs)
			}
			rec := get(t, s, "k")
			if e, ok := rec.EntryOf(cr.Record.AttemptID); !ok || e.Outcome != o || !e.LateFinish.IsZero() {
				t.Fatalf("the attempt's journal entry %+v (found %v), want ended %s once, no late finish", e, ok, o)
			}
			if o == store.OutcomeAbandoned && rec.AttemptID != "" {
				t.Fatalf("after abandon: record attempt id %q, want none (an abandoned attempt gives it up)", rec.AttemptID)
			}
		})
	}

	// Fences never repeat for a key: a record deleted, swept or expired
	// and claimed anew starts above every fence the key had.
	for _, how := range []string{"delete", "sweep", "expiry"} {
		t.Run("fence_after_"+how, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, h)
			ctx := context.Background()
			// Raise the key's fence over a few attempts and a resolution.
			first := acquire(t, s, req(h, "k"))
			lapse(t, h, s, "k")
			taken := acquire(t, s, req(h, "k"))
			noErr(t, "Release", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: taken.Record.Fence, AttemptID: taken.Record.AttemptID, Outcome: store.OutcomeReleased}))
			last := acquire(t, s, req(h, "k"))
			r := req(h, "k")
			rec, err := s.Resolve(ctx, store.ResolveRequest{Key: "k", Fence: last.Record.Fence, Done: true, Result: []byte("r"), Retention: retention(h), By: "op"})
			noErr(t, "Resolve", err)
			if rec.Fence != first.Record.Fence+3 {
				t.Fatalf("fences %d, %d, %d, resolved at %d; want each one more than the last", first.Record.Fence, taken.Record.Fence, last.Record.Fence, rec.Fence)
			}
			switch how {
			case "delete":
				noErr(t, "Delete", s.Delete(ctx, "k"))
			case "sweep":
				pass(t, h, s, retention(h)+time.Millisecond)
				n, err := s.Sweep(ctx, 100)
				noErr(t, "Sweep", err)
				if n != 1 {
					t.Fatalf("Sweep deleted %d records, want 1", n)
				}
			case "expiry":
				pass(t, h, s, retention(h)+time.Millisecond)
			}
			wantNotFound(t, s, "k")
			pass(t, h, s, time.Millisecond) // any clock moves between two calls
			again := acquire(t, s, r)
			if again.Record.Fence <= rec.Fence || again.Record.Attempt < 1 {
				t.Fatalf("claim after %s: fence %d, want above every earlier fence of the key (the last was %d)", how, again.Record.Fence, rec.Fence)
			}
			// A stale holder of the old record is refused, by fence or id.
			err = s.Finish(ctx, store.FinishRequest{Key: "k", Fence: last.Record.Fence, AttemptID: last.Record.AttemptID, Outcome: store.OutcomeCompleted, Retention: time.Hour})
			wantErr(t, "a holder of the old record's Finish", err, idem.ErrLeaseLost)
		})
	}

	// Resolve's conditions: an operator who inspected a lapsed attempt
	// does not decide one that a late heartbeat has since revived; a
	// reconciler decides only the attempt it holds.
	t.Run("resolve_conditions", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		r := req(h, "k")
		r.Policy = idem.AtMostOnce
		cr := acquire(t, s, r)
		lapse(t, h, s, "k")
		// The holder was only slow: its heartbeat revives the lease.
		_, err := s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Lease: heldLease})
		noErr(t, "a late heartbeat", err)
		_, err = s.Resolve(ctx, store.ResolveRequest{Key: "k", Fence: cr.Record.Fence, Lapsed: true, Reason: "operator", By: "op"})
		wantErr(t, "Resolve(Lapsed) of a revived attempt", err, idem.ErrLeaseLost)
		_, err = s.Resolve(ctx, store.ResolveRequest{Key: "k", AttemptID: store.NewAttemptID(), Done: true, Retention: time.Hour, By: "hook"})
		wantErr(t, "Resolve with another attempt's id", err, idem.ErrLeaseLost)
		if rec := get(t, s, "k"); rec.Status != idem.StatusInProgress || rec.Fence != cr.Record.Fence {
			t.Fatalf("after refused resolutions: {%s, fence %d}, want the holder's {in_progress, %d}", rec.Status, rec.Fence, cr.Record.Fence)
		}
		rec, err := s.Resolve(ctx, store.ResolveRequest{Key: "k", AttemptID: cr.Record.AttemptID, Done: true, Result: []byte("found"), Retention: time.Hour, By: "hook"})
		noErr(t, "Resolve by the holder's attempt id", err)
		if rec.Status != idem.StatusCompleted || rec.Fence != cr.Record.Fence+1 {
			t.Fatalf("Resolve by attempt id: {%s, fence %d}, want {completed, %d}", rec.Status, rec.Fence, cr.Record.Fence+1)
		}
		_, err = s.Resolve(ctx, store.ResolveRequest{Key: "k", AttemptID: cr.Record.AttemptID, Done: false, By: "hook"})
		wantErr(t, "Resolve by the id of an attempt that ended", err, idem.ErrLeaseLost)

		// Lapsed and not revived: decided.
		r = req(h, "k2")
		r.Policy = idem.AtMostOnce
		cr = acquire(t, s, r)
		lapse(t, h, s, "k2")
		rec, err = s.Resolve(ctx, store.ResolveRequest{Key: "k2", Fence: cr.Record.Fence, Lapsed: true, Reason: "not in the provider's log", By: "op"})
		noErr(t, "Resolve(Lapsed) of a lapsed attempt", err)
		if rec.Status != idem.StatusReleased {
			t.Fatalf("Resolve(Lapsed, not done): %s, want released", rec.Status)
		}
		_, err = s.Resolve(ctx, store.ResolveRequest{Key: "k2", Lapsed: true, By: "op"})
		wantErr(t, "Resolve(Lapsed) of a released record", err, idem.ErrLeaseLost)
	})
}
