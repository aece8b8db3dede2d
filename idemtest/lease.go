package idemtest

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// testLease holds the Store contract of leases: lapsing, abandoning,
// takeovers under each policy, extending, and fencing stale holders.
func testLease(t *testing.T, h Harness) {
	t.Run("lapsed/at_least_once_takeover", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		first := acquire(t, s, req(h, "k"))
		lapse(t, h, s, "k")
		if rec := get(t, s, "k"); !rec.Lapsed(now(t, s)) {
			t.Fatalf("after its lease passed the record is not lapsed: %s, lease until %v, now %v", rec.Status, rec.LeaseUntil, now(t, s))
		}
		r := req(h, "k")
		r.Owner = "taker"
		cr := acquire(t, s, r)
		if !cr.Takeover || cr.Record.Fence != first.Record.Fence+1 || cr.Record.Attempt != 2 || cr.Record.Owner != "taker" {
			t.Fatalf("claim of a lapsed key: takeover %v, fence %d, attempt %d, owner %q; want true, %d (the lapsed attempt's + 1), 2, taker",
				cr.Takeover, cr.Record.Fence, cr.Record.Attempt, cr.Record.Owner, first.Record.Fence+1)
		}
		wantTime(t, "LeaseUntil", cr.Record.LeaseUntil, cr.Now.Add(r.Lease))
		rec := get(t, s, "k")
		if len(rec.Journal) != 2 {
			t.Fatalf("journal has %d entries after a takeover, want 2", len(rec.Journal))
		}
		if old := rec.Journal[0]; old.Fence != first.Record.Fence || old.AttemptID != first.Record.AttemptID || old.Outcome != store.OutcomeLapsed {
			t.Fatalf("lapsed attempt's journal entry %+v, want fence %d, attempt id %q, outcome lapsed", old, first.Record.Fence, first.Record.AttemptID)
		}
		if nw := rec.Journal[1]; nw.Fence != cr.Record.Fence || nw.AttemptID != r.AttemptID || !nw.Takeover || nw.Owner != "taker" {
			t.Fatalf("takeover's journal entry %+v, want fence %d, attempt id %q, takeover, owner taker", nw, cr.Record.Fence, r.AttemptID)
		}
	})

	t.Run("lapsed/at_most_once_not_taken", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		r := req(h, "k")
		r.Policy = idem.AtMostOnce
		first := acquire(t, s, r)
		lapse(t, h, s, "k")
		// The record's policy decides, not the next caller's.
		for _, p := range []idem.Policy{idem.AtMostOnce, idem.AtLeastOnce} {
			r2 := req(h, "k")
			r2.Policy = p
			cr := claim(t, s, r2)
			if cr.Acquired {
				t.Fatalf("claim (%s) of a lapsed AtMostOnce key: acquired, want not acquired (indeterminate)", p)
			}
			if cr.Record.Status != idem.StatusInProgress || !cr.Record.Lapsed(cr.Now) || cr.Record.Fence != first.Record.Fence || cr.Record.AttemptID != first.Record.AttemptID {
				t.Fatalf("claim (%s) of a lapsed AtMostOnce key found {%s, lapsed %v, fence %d, attempt id %q}, want the lapsed attempt's {in_progress, true, %d, %q}",
					p, cr.Record.Status, cr.Record.Lapsed(cr.Now), cr.Record.Fence, cr.Record.AttemptID, first.Record.Fence, first.Record.AttemptID)
			}
		}
		r3 := req(h, "k")
		r3.Policy, r3.TakeLapsed = idem.AtMostOnce, true
		cr := acquire(t, s, r3)
		if !cr.Takeover || cr.Record.Fence != first.Record.Fence+1 || cr.Record.Attempt != 2 {
			t.Fatalf("claim with TakeLapsed: takeover %v, fence %d, attempt %d; want true, %d (the lapsed attempt's + 1), 2", cr.Takeover, cr.Record.Fence, cr.Record.Attempt, first.Record.Fence+1)
		}
	})

	t.Run("running/take_lapsed_does_not_take_a_running_lease", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		hold(t, h, s, "k")
		r := req(h, "k")
		r.TakeLapsed = true
		if cr := claim(t, s, r); cr.Acquired {
			t.Fatal("claim with TakeLapsed while the lease runs: acquired, want not acquired")
		}
	})

	for _, p := range []idem.Policy{idem.AtLeastOnce, idem.AtMostOnce} {
		t.Run("abandon/"+p.String(), func(t *testing.T) {
			t.Parallel()
			s := newStore(t, h)
			r := req(h, "k")
			r.Policy = p
			cr := acquire(t, s, r)
			noErr(t, "Abandon", s.Finish(context.Background(), store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeAbandoned, Reason: "connection reset after send"}))
			rec := get(t, s, "k")
			if rec.Status != idem.StatusInProgress || !rec.Lapsed(now(t, s)) {
				t.Fatalf("after Abandon: {%s, lapsed %v}, want {in_progress, lapsed at once}", rec.Status, rec.Lapsed(now(t, s)))
			}
			if rec.Reason != "connection reset after send" {
				t.Fatalf("after Abandon: Reason %q, want the reason given", rec.Reason)
			}
			if rec.Fence != cr.Record.Fence || rec.AttemptID != "" {
				t.Fatalf("after Abandon: fence %d, attempt id %q; want the claim's fence %d and no attempt id (an abandoned attempt gives it up)", rec.Fence, rec.AttemptID, cr.Record.Fence)
			}
			if j := rec.Journal[0]; j.Outcome != store.OutcomeAbandoned || j.AttemptID != cr.Record.AttemptID {
				t.Fatalf("after Abandon: journal entry %+v, want outcome abandoned, attempt id %q", j, cr.Record.AttemptID)
			}
			stuck, err := s.List(context.Background(), store.ListQuery{Stuck: true})
			noErr(t, "List(Stuck)", err)
			if len(stuck) != 1 || stuck[0].Key != "k" {
				t.Fatalf("List(Stuck) after Abandon = %v, want [k]", keysOf(stuck))
			}
			cr2 := claim(t, s, req(h, "k"))
			switch p {
			case idem.AtLeastOnce:
				if !cr2.Acquired || !cr2.Takeover || cr2.Record.Fence != cr.Record.Fence+1 || cr2.Record.Attempt != 2 {
					t.Fatalf("claim after Abandon: acquired %v, takeover %v, fence %d, attempt %d; want true, true, %d (the abandoned attempt's + 1), 2",
						cr2.Acquired, cr2.Takeover, cr2.Record.Fence, cr2.Record.Attempt, cr.Record.Fence+1)
				}
			case idem.AtMostOnce:
				if cr2.Acquired {
					t.Fatal("claim after Abandon under AtMostOnce: acquired, want not acquired")
				}
				if cr2.Record.Fence != cr.Record.Fence || cr2.Record.AttemptID != "" {
					t.Fatalf("claim after Abandon under AtMostOnce found fence %d, attempt id %q; want the abandoned record's %d, no attempt id", cr2.Record.Fence, cr2.Record.AttemptID, cr.Record.Fence)
				}
				r3 := req(h, "k")
				r3.TakeLapsed = true
				if cr3 := acquire(t, s, r3); !cr3.Takeover || cr3.Record.Fence != cr.Record.Fence+1 {
					t.Fatalf("claim with TakeLapsed after Abandon: takeover %v, fence %d; want true, %d (the abandoned attempt's + 1)", cr3.Takeover, cr3.Record.Fence, cr.Record.Fence+1)
				}
			}
		})
	}

	t.Run("extend", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		r := req(h, "k")
		cr := acquire(t, s, r)
		ext := 3*r.Lease + window(h) // the claim after the first lease must come before the extended one ends
		n := now(t, s)
		until, err := s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Lease: ext})
		noErr(t, "Extend", err)
		n2 := now(t, s)
		if until.Before(n.Add(ext).Add(-time.Millisecond)) || until.After(n2.Add(ext).Add(time.Millisecond)) {
			t.Fatalf("Extend returned %v, want the store's now + %v (between %v and %v)", until, ext, n.Add(ext), n2.Add(ext))
		}
		rec := get(t, s, "k")
		wantTime(t, "LeaseUntil after Extend", rec.LeaseUntil, until)
		wantTime(t, "journal LeaseUntil after Extend", rec.Journal[0].LeaseUntil, until)
		if rec.ExpiresAt.Before(until) {
			t.Fatalf("ExpiresAt %v is before the extended lease %v", rec.ExpiresAt, until)
		}
		// Past the first lease, before the extended one: still busy.
		passUntil(t, h, s, cr.Record.LeaseUntil.Add(time.Millisecond))
		if c := claim(t, s, req(h, "k")); c.Acquired {
			t.Fatal("claim after the first lease passed but before the extended one: acquired, want busy")
		}
		passUntil(t, h, s, until.Add(time.Millisecond))
		if c := claim(t, s, req(h, "k")); !c.Acquired || !c.Takeover {
			t.Fatalf("claim after the extended lease passed: acquired %v takeover %v, want a takeover", c.Acquired, c.Takeover)
		}
	})

	t.Run("extend_beyond_retention", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		r := req(h, "k")
		r.Retention = r.Lease // the in_progress record expires with its lease
		cr := acquire(t, s, r)
		until, err := s.Extend(context.Background(), store.ExtendRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Lease: 10 * r.Lease})
		noErr(t, "Extend", err)
		passUntil(t, h, s, cr.Record.ExpiresAt.Add(time.Millisecond))
		rec := get(t, s, "k") // the extended lease keeps the record
		wantTime(t, "LeaseUntil", rec.LeaseUntil, until)
		if c := claim(t, s, req(h, "k")); c.Acquired {
			t.Fatal("claim while an extended lease runs past the first expiry: acquired, want busy")
		}
	})

	t.Run("stale_heartbeat_marks_late", func(t *testing.T) {
		// A refused Extend proves the stale attempt was still running.
		t.Parallel()
		s := newStore(t, h)
		old := acquire(t, s, req(h, "k"))
		lapse(t, h, s, "k")
		acquire(t, s, req(h, "k"))
		before := get(t, s, "k")
		_, err := s.Extend(context.Background(), store.ExtendRequest{Key: "k", Fence: old.Record.Fence, AttemptID: old.Record.AttemptID, Lease: time.Hour})
		wantErr(t, "stale Extend", err, idem.ErrLeaseLost)
		after := get(t, s, "k")
		if after.Journal[0].LateFinish.IsZero() {
			t.Fatalf("stale Extend did not set LateFinish on the stale attempt's journal entry: %+v", after.Journal[0])
		}
		sameExceptLate(t, "after stale Extend", after, before)
	})

	t.Run("stale_holder", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		old := acquire(t, s, req(h, "k"))
		lapse(t, h, s, "k")
		r := req(h, "k")
		r.Owner = "new-holder"
		taken := acquire(t, s, r)
		before := get(t, s, "k")

		wantErr(t, "stale Complete", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: old.Record.Fence, AttemptID: old.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("stale"), Retention: time.Hour}), idem.ErrLeaseLost)
		after := get(t, s, "k")
		if after.Journal[0].LateFinish.IsZero() {
			t.Fatalf("stale Complete did not set LateFinish on the stale attempt's journal entry: %+v", after.Journal[0])
		}
		if !after.Journal[1].LateFinish.IsZero() {
			t.Fatalf("stale Complete set LateFinish on the new holder's entry: %+v", after.Journal[1])
		}
		sameExceptLate(t, "after stale Complete", after, before)

		wantErr(t, "stale Release", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: old.Record.Fence, AttemptID: old.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: "stale"}), idem.ErrLeaseLost)
		wantErr(t, "stale Fail", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: old.Record.Fence, AttemptID: old.Record.AttemptID, Outcome: store.OutcomeFailed, Reason: "stale", Retention: time.Hour}), idem.ErrLeaseLost)
		wantErr(t, "stale Abandon", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: old.Record.Fence, AttemptID: old.Record.AttemptID, Outcome: store.OutcomeAbandoned, Reason: "stale"}), idem.ErrLeaseLost)
		_, err := s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: old.Record.Fence, AttemptID: old.Record.AttemptID, Lease: time.Hour})
		wantErr(t, "stale Extend", err, idem.ErrLeaseLost)
		// A fence from the future is refused too, and so is the holder's
		// fence with another attempt's id, and another fence with the
		// holder's id: a write must name the attempt by both.
		wantErr(t, "Complete with a future fence", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: taken.Record.Fence + 99, AttemptID: taken.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("x"), Retention: time.Hour}), idem.ErrLeaseLost)
		wantErr(t, "Complete with the holder's fence and another attempt id", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: taken.Record.Fence, AttemptID: old.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("x"), Retention: time.Hour}), idem.ErrLeaseLost)
		wantErr(t, "Complete with the holder's fence and a made-up attempt id", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: taken.Record.Fence, AttemptID: store.NewAttemptID(), Outcome: store.OutcomeCompleted, Result: []byte("x"), Retention: time.Hour}), idem.ErrLeaseLost)
		_, err = s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: taken.Record.Fence, AttemptID: old.Record.AttemptID, Lease: time.Hour})
		wantErr(t, "Extend with the holder's fence and another attempt id", err, idem.ErrLeaseLost)
		sameExceptLate(t, "after stale writes", get(t, s, "k"), before)

		// The new holder is unaffected.
		noErr(t, "new holder's Complete", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: taken.Record.Fence, AttemptID: taken.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("fresh"), Retention: time.Hour}))
		rec := get(t, s, "k")
		wantBytes(t, "Result", rec.Result, []byte("fresh"))
		if rec.Owner != "new-holder" || rec.Fence != old.Record.Fence+1 {
			t.Fatalf("owner %q fence %d, want new-holder %d", rec.Owner, rec.Fence, old.Record.Fence+1)
		}
	})
}

// sameExceptLate fails the test unless got equals want in every field that a
// stale holder's refused write must leave alone (all but LateFinish).
func sameExceptLate(t *testing.T, what string, got, want idem.Record) {
	t.Helper()
	if got.Status != want.Status || got.Fence != want.Fence || got.Attempt != want.Attempt || got.AttemptID != want.AttemptID || got.Owner != want.Owner ||
		got.Reason != want.Reason || string(got.Result) != string(want.Result) || got.Policy != want.Policy ||
		got.Fingerprint != want.Fingerprint || !sameTime(got.LeaseUntil, want.LeaseUntil) || !sameTime(got.ExpiresAt, want.ExpiresAt) {
		t.Fatalf("%s: record changed:\n got  %+v\n want %+v", what, brief(got), brief(want))
	}
	if len(got.Journal) != len(want.Journal) {
		t.Fatalf("%s: journal has %d entries, want %d", what, len(got.Journal), len(want.Journal))
	}
	for i := range got.Journal {
		g, w := got.Journal[i], want.Journal[i]
		g.LateFinish, w.LateFinish = time.Time{}, time.Time{}
		if g.Attempt != w.Attempt || g.Fence != w.Fence || g.AttemptID != w.AttemptID || g.Outcome != w.Outcome || g.Reason != w.Reason || g.Owner != w.Owner ||
			!sameTime(g.Ended, w.Ended) || !sameTime(g.LeaseUntil, w.LeaseUntil) {
			t.Fatalf("%s: journal entry %d changed:\n got  %+v\n want %+v", what, i, g, w)
		}
	}
}

// brief is a record without its journal, for messages.
func brief(r idem.Record) idem.Record {
	r.Journal = nil
	return r
}

// keysOf returns the keys of recs, for messages and comparisons.
func keysOf(recs []idem.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.Key
	}
	return out
}
