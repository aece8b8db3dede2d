package idemtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// testClaim holds the Store contract of a claim and of the writes that end
// an attempt, called directly on the store: the record's life and the claim
// outcomes of docs/design.md.
func testClaim(t *testing.T, h Harness) {
	t.Run("get_absent", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		wantNotFound(t, s, "nobody")
	})

	t.Run("new_key", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		r := req(h, "k")
		r.Fingerprint = "fp-1"
		r.Policy = idem.AtMostOnce
		r.Retention = time.Hour
		before := now(t, s)
		cr := acquire(t, s, r)
		after := now(t, s)
		if cr.Takeover {
			t.Error("Takeover = true on a new key")
		}
		if cr.Now.Before(before.Add(-time.Millisecond)) || cr.Now.After(after.Add(time.Millisecond)) {
			t.Errorf("ClaimResult.Now = %v, not between the store's clock before (%v) and after (%v)", cr.Now, before, after)
		}
		for _, rec := range []idem.Record{cr.Record, get(t, s, "k")} {
			checkNewRecord(t, rec, r, cr.Now)
			if rec.Fence != cr.Record.Fence {
				t.Fatalf("stored fence %d, want the claim's %d", rec.Fence, cr.Record.Fence)
			}
		}
	})

	t.Run("busy", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		first := hold(t, h, s, "k")
		other := req(h, "k")
		other.Owner = "someone-else"
		cr := claim(t, s, other)
		if cr.Acquired {
			t.Fatal("second Claim while the lease runs: acquired, want not acquired")
		}
		if cr.Record.Status != idem.StatusInProgress || cr.Record.Fence != first.Record.Fence || cr.Record.Owner != first.Record.Owner ||
			cr.Record.AttemptID != first.Record.AttemptID {
			t.Fatalf("second Claim found {%s, fence %d, owner %q, attempt id %q}, want the holder's {in_progress, %d, %q, %q}",
				cr.Record.Status, cr.Record.Fence, cr.Record.Owner, cr.Record.AttemptID, first.Record.Fence, first.Record.Owner, first.Record.AttemptID)
		}
		wantTime(t, "found LeaseUntil", cr.Record.LeaseUntil, first.Record.LeaseUntil)
		rec := get(t, s, "k")
		if rec.Fence != first.Record.Fence || rec.Attempt != 1 || len(rec.Journal) != 1 || rec.Owner != first.Record.Owner || rec.AttemptID != first.Record.AttemptID {
			t.Fatalf("after a refused claim: fence %d, attempt %d, %d journal entries, owner %q, attempt id %q; want %d, 1, 1, %q, %q (nothing written)",
				rec.Fence, rec.Attempt, len(rec.Journal), rec.Owner, rec.AttemptID, first.Record.Fence, first.Record.Owner, first.Record.AttemptID)
		}
	})

	t.Run("complete", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		cr := acquire(t, s, req(h, "k"))
		ret := 2 * time.Hour
		before := now(t, s)
		noErr(t, "Complete", s.Finish(context.Background(), store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("result-1"), Retention: ret}))
		after := now(t, s)
		rec := get(t, s, "k")
		if rec.Status != idem.StatusCompleted {
			t.Fatalf("after Complete: status %s, want completed", rec.Status)
		}
		wantBytes(t, "Result", rec.Result, []byte("result-1"))
		wantBetween(t, "ExpiresAt", rec.ExpiresAt, before.Add(ret), after.Add(ret))
		if rec.Fence != cr.Record.Fence || rec.Attempt != 1 || rec.AttemptID != cr.Record.AttemptID {
			t.Fatalf("after Complete: fence %d, attempt %d, attempt id %q; want the claim's %d, 1, %q", rec.Fence, rec.Attempt, rec.AttemptID, cr.Record.Fence, cr.Record.AttemptID)
		}
		if len(rec.Journal) != 1 || rec.Journal[0].Outcome != store.OutcomeCompleted || rec.Journal[0].Ended.IsZero() {
			t.Fatalf("after Complete: journal %+v, want one entry with outcome completed and Ended set", rec.Journal)
		}

		// A completed key is never claimed again: the claim returns the result.
		again := req(h, "k")
		again.Owner = "duplicate"
		cr2 := claim(t, s, again)
		if cr2.Acquired {
			t.Fatal("Claim of a completed key: acquired, want not acquired")
		}
		if cr2.Record.Status != idem.StatusCompleted {
			t.Fatalf("Claim of a completed key found %s, want completed", cr2.Record.Status)
		}
		wantBytes(t, "found Result", cr2.Record.Result, []byte("result-1"))
		// Under AtMostOnce and with TakeLapsed too.
		again.Policy, again.TakeLapsed = idem.AtMostOnce, true
		if cr3 := claim(t, s, again); cr3.Acquired {
			t.Fatal("Claim(TakeLapsed) of a completed key: acquired, want not acquired")
		}
		if rec := get(t, s, "k"); rec.Fence != cr.Record.Fence || rec.Status != idem.StatusCompleted {
			t.Fatalf("after refused claims: %s fence %d, want completed at the claim's fence %d", rec.Status, rec.Fence, cr.Record.Fence)
		}
	})

	t.Run("complete_empty_result", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		for _, key := range []string{"nil", "empty"} {
			cr := acquire(t, s, req(h, key))
			var res []byte
			if key == "empty" {
				res = []byte{}
			}
			noErr(t, "Complete", s.Finish(context.Background(), store.FinishRequest{Key: key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: res, Retention: time.Hour}))
			rec := get(t, s, key)
			if rec.Status != idem.StatusCompleted || len(rec.Result) != 0 {
				t.Fatalf("%s result: record %s with %q, want completed with an empty result", key, rec.Status, rec.Result)
			}
		}
	})

	t.Run("release", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		cr := acquire(t, s, req(h, "k"))
		noErr(t, "Release", s.Finish(context.Background(), store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: "smtp refused"}))
		rec := get(t, s, "k")
		if rec.Status != idem.StatusReleased || rec.Reason != "smtp refused" || rec.Fence != cr.Record.Fence || rec.Attempt != 1 || rec.AttemptID != cr.Record.AttemptID {
			t.Fatalf("after Release: {%s, reason %q, fence %d, attempt %d, attempt id %q}, want {released, %q, %d, 1, %q} (the claim's fence and attempt id kept)",
				rec.Status, rec.Reason, rec.Fence, rec.Attempt, rec.AttemptID, "smtp refused", cr.Record.Fence, cr.Record.AttemptID)
		}
		if len(rec.Journal) != 1 || rec.Journal[0].Outcome != store.OutcomeReleased || rec.Journal[0].Reason != "smtp refused" {
			t.Fatalf("after Release: journal %+v, want one entry released with the reason", rec.Journal)
		}
		r2 := req(h, "k")
		r2.Owner = "second"
		cr2 := acquire(t, s, r2)
		if cr2.Takeover {
			t.Error("claim of a released key: Takeover = true, want false")
		}
		if cr2.Record.Fence != cr.Record.Fence+1 || cr2.Record.Attempt != 2 {
			t.Fatalf("claim of a released key: fence %d attempt %d, want %d 2 (numbering continues from the released attempt's fence %d)",
				cr2.Record.Fence, cr2.Record.Attempt, cr.Record.Fence+1, cr.Record.Fence)
		}
		if cr2.Record.Reason != "smtp refused" {
			t.Fatalf("claim of a released key: Reason %q, want the last reason %q kept", cr2.Record.Reason, "smtp refused")
		}
		rec = get(t, s, "k")
		if rec.Status != idem.StatusInProgress || rec.Owner != "second" || len(rec.Journal) != 2 {
			t.Fatalf("after the second claim: {%s, owner %q, %d journal entries}, want {in_progress, second, 2}", rec.Status, rec.Owner, len(rec.Journal))
		}
		if j := rec.Journal[1]; j.Attempt != 2 || j.Fence != cr2.Record.Fence || j.AttemptID != r2.AttemptID || j.Owner != "second" {
			t.Fatalf("second journal entry %+v, want attempt 2, fence %d, attempt id %q, owner second", j, cr2.Record.Fence, r2.AttemptID)
		}
	})

	t.Run("fail", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		cr := acquire(t, s, req(h, "k"))
		before := now(t, s)
		noErr(t, "Fail", s.Finish(context.Background(), store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeFailed, Reason: "card declined", Retention: 3 * time.Hour}))
		after := now(t, s)
		rec := get(t, s, "k")
		if rec.Status != idem.StatusFailed || rec.Reason != "card declined" || rec.Fence != cr.Record.Fence || rec.AttemptID != cr.Record.AttemptID {
			t.Fatalf("after Fail: {%s, %q, fence %d, attempt id %q}, want {failed, %q, %d, %q} (the claim's fence and attempt id kept)",
				rec.Status, rec.Reason, rec.Fence, rec.AttemptID, "card declined", cr.Record.Fence, cr.Record.AttemptID)
		}
		wantBetween(t, "ExpiresAt", rec.ExpiresAt, before.Add(3*time.Hour), after.Add(3*time.Hour))
		if rec.Journal[0].Outcome != store.OutcomeFailed {
			t.Fatalf("journal outcome %q, want failed", rec.Journal[0].Outcome)
		}
		cr2 := claim(t, s, req(h, "k"))
		if cr2.Acquired || cr2.Record.Status != idem.StatusFailed || cr2.Record.Reason != "card declined" {
			t.Fatalf("claim of a failed key: acquired %v, found {%s, %q}; want not acquired, {failed, %q}",
				cr2.Acquired, cr2.Record.Status, cr2.Record.Reason, "card declined")
		}
	})

	t.Run("finish_absent", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		wantErr(t, "Complete(absent)", s.Finish(ctx, store.FinishRequest{Key: "absent", Fence: 1, AttemptID: "no-such-attempt", Outcome: store.OutcomeCompleted, Result: nil, Retention: time.Hour}), idem.ErrLeaseLost)
		wantErr(t, "Release(absent)", s.Finish(ctx, store.FinishRequest{Key: "absent", Fence: 1, AttemptID: "no-such-attempt", Outcome: store.OutcomeReleased, Reason: ""}), idem.ErrLeaseLost)
		wantErr(t, "Fail(absent)", s.Finish(ctx, store.FinishRequest{Key: "absent", Fence: 1, AttemptID: "no-such-attempt", Outcome: store.OutcomeFailed, Reason: "", Retention: time.Hour}), idem.ErrLeaseLost)
		wantErr(t, "Abandon(absent)", s.Finish(ctx, store.FinishRequest{Key: "absent", Fence: 1, AttemptID: "no-such-attempt", Outcome: store.OutcomeAbandoned, Reason: ""}), idem.ErrLeaseLost)
		_, err := s.Extend(ctx, store.ExtendRequest{Key: "absent", Fence: 1, AttemptID: "no-such-attempt", Lease: time.Minute})
		wantErr(t, "Extend(absent)", err, idem.ErrLeaseLost)
		wantNotFound(t, s, "absent")
	})

	t.Run("finish_twice", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		cr := acquire(t, s, req(h, "k"))
		noErr(t, "Complete", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("one"), Retention: time.Hour}))
		wantErr(t, "second Complete", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("two"), Retention: time.Hour}), idem.ErrLeaseLost)
		wantErr(t, "Release after Complete", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: ""}), idem.ErrLeaseLost)
		wantErr(t, "Fail after Complete", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeFailed, Reason: "", Retention: time.Hour}), idem.ErrLeaseLost)
		wantErr(t, "Abandon after Complete", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeAbandoned, Reason: ""}), idem.ErrLeaseLost)
		_, err := s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Lease: time.Minute})
		wantErr(t, "Extend after Complete", err, idem.ErrLeaseLost)
		rec := get(t, s, "k")
		if rec.Status != idem.StatusCompleted {
			t.Fatalf("status %s, want completed", rec.Status)
		}
		wantBytes(t, "Result", rec.Result, []byte("one"))
	})

	t.Run("results_are_copies", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		cr := acquire(t, s, req(h, "k"))
		buf := []byte("original")
		noErr(t, "Complete", s.Finish(context.Background(), store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: buf, Retention: time.Hour}))
		copy(buf, "XXXXXXXX")
		rec := get(t, s, "k")
		wantBytes(t, "Result after the caller reused its buffer", rec.Result, []byte("original"))
		copy(rec.Result, "YYYYYYYY")
		wantBytes(t, "Result after the caller modified a returned record", get(t, s, "k").Result, []byte("original"))
	})

	t.Run("batch", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		bc, ok := s.(store.BatchClaimer)
		if !ok {
			t.Skip("the store does not implement store.BatchClaimer")
		}
		done := acquire(t, s, req(h, "done"))
		noErr(t, "Complete", s.Finish(context.Background(), store.FinishRequest{Key: "done", Fence: done.Record.Fence, AttemptID: done.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: time.Hour}))
		keys := []string{"b", "a", "done", "b", "c"}
		reqs := make([]store.ClaimRequest, len(keys))
		for i, k := range keys {
			reqs[i] = req(h, k)
		}
		res, err := bc.ClaimBatch(context.Background(), reqs)
		noErr(t, "ClaimBatch", err)
		if len(res) != len(keys) {
			t.Fatalf("ClaimBatch returned %d results for %d requests", len(res), len(keys))
		}
		want := []bool{true, true, false, false, true}
		for i, r := range res {
			if r.Record.Key != keys[i] {
				t.Fatalf("result %d is for key %q, want %q (request order)", i, r.Record.Key, keys[i])
			}
			if r.Acquired != want[i] {
				t.Fatalf("result %d (%q): Acquired %v, want %v", i, keys[i], r.Acquired, want[i])
			}
		}
		if res[2].Record.Status != idem.StatusCompleted {
			t.Fatalf("batch claim of a completed key found %s, want completed", res[2].Record.Status)
		}
		for _, i := range []int{0, 1, 4} {
			wantFirstFence(t, fmt.Sprintf("batch claim %d (%q)", i, keys[i]), res[i].Record.Fence, res[i].Now)
			if res[i].Record.AttemptID != reqs[i].AttemptID {
				t.Fatalf("batch claim %d (%q): record attempt id %q, want the request's %q", i, keys[i], res[i].Record.AttemptID, reqs[i].AttemptID)
			}
		}
		if r := res[3].Record; r.Status != idem.StatusInProgress || r.Fence != res[0].Record.Fence || r.AttemptID != reqs[0].AttemptID {
			t.Fatalf("second claim of %q in one batch found {%s, fence %d, attempt id %q}, want the first's {in_progress, %d, %q}",
				"b", r.Status, r.Fence, r.AttemptID, res[0].Record.Fence, reqs[0].AttemptID)
		}
		for k, i := range map[string]int{"b": 0, "a": 1, "c": 4} {
			if rec := get(t, s, k); rec.Status != idem.StatusInProgress || rec.Fence != res[i].Record.Fence || rec.AttemptID != reqs[i].AttemptID {
				t.Fatalf("after the batch %q is {%s, fence %d, attempt id %q}, want its claim's {in_progress, %d, %q}",
					k, rec.Status, rec.Fence, rec.AttemptID, res[i].Record.Fence, reqs[i].AttemptID)
			}
		}
		if res, err := bc.ClaimBatch(context.Background(), nil); err != nil || len(res) != 0 {
			t.Fatalf("ClaimBatch(nil) = %d results, %v; want none, nil", len(res), err)
		}
	})

	t.Run("batch_corrupt", func(t *testing.T) {
		// A record that cannot be decoded fails its own key in a batch,
		// not the batch: the other keys are claimed as they would be alone.
		t.Parallel()
		if h.Corrupt == nil {
			t.Skip("Harness.Corrupt is not set")
		}
		s := newStore(t, h)
		bc, ok := s.(store.BatchClaimer)
		if !ok {
			t.Skip("the store does not implement store.BatchClaimer")
		}
		bad := acquire(t, s, req(h, "bad"))
		noErr(t, "Complete", s.Finish(context.Background(), store.FinishRequest{Key: "bad", Fence: bad.Record.Fence, AttemptID: bad.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: time.Hour}))
		h.Corrupt(t, s, "bad")
		res, err := bc.ClaimBatch(context.Background(), []store.ClaimRequest{req(h, "a"), req(h, "bad"), req(h, "b")})
		noErr(t, "ClaimBatch with a corrupt record among its keys", err)
		if len(res) != 3 {
			t.Fatalf("ClaimBatch returned %d results for 3 requests", len(res))
		}
		if !errors.Is(res[1].Err, idem.ErrCorrupt) || res[1].Acquired {
			t.Fatalf("the corrupt key's result: acquired %v, Err %v; want ErrCorrupt", res[1].Acquired, res[1].Err)
		}
		for _, i := range []int{0, 2} {
			if res[i].Err != nil || !res[i].Acquired {
				t.Fatalf("result %d (%q) beside a corrupt key: acquired %v, Err %v; want acquired", i, res[i].Record.Key, res[i].Acquired, res[i].Err)
			}
		}
	})

	t.Run("finish_batch", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		bc, ok := s.(store.BatchFinisher)
		if !ok {
			t.Skip("the store does not implement store.BatchFinisher")
		}
		ctx := context.Background()
		a, b := acquire(t, s, req(h, "a")), acquire(t, s, req(h, "b"))
		stale := acquire(t, s, req(h, "stale"))
		lapse(t, h, s, "stale")
		taken := acquire(t, s, req(h, "stale")) // the takeover holds it now
		rel, ab := acquire(t, s, req(h, "rel")), acquire(t, s, req(h, "ab"))
		done := func(cr store.ClaimResult, result string) store.FinishRequest {
			return store.FinishRequest{Key: cr.Record.Key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID,
				Outcome: store.OutcomeCompleted, Result: []byte(result), Retention: time.Hour}
		}
		end := func(cr store.ClaimResult, o store.Outcome) store.FinishRequest {
			return store.FinishRequest{Key: cr.Record.Key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: o, Reason: "why"}
		}
		errs, err := bc.FinishBatch(ctx, []store.FinishRequest{
			done(b, "rb"),
			done(stale, "late"),
			{Key: "absent", Fence: 1, AttemptID: "none", Outcome: store.OutcomeCompleted, Result: []byte("x"), Retention: time.Hour},
			done(a, "ra"),
			end(rel, store.OutcomeReleased),
			end(ab, store.OutcomeAbandoned),
			end(ab, store.OutcomeAbandoned), // the same attempt again: it has ended
		})
		noErr(t, "FinishBatch", err)
		if len(errs) != 7 {
			t.Fatalf("FinishBatch returned %d answers for 7", len(errs))
		}
		for i, key := range []string{"b", "", "", "a"} {
			if key == "" {
				continue
			}
			noErr(t, "FinishBatch of "+key, errs[i])
			rec := get(t, s, key)
			if rec.Status != idem.StatusCompleted || string(rec.Result) != "r"+key {
				t.Fatalf("%q after FinishBatch: {%s, %q}, want {completed, %q}", key, rec.Status, rec.Result, "r"+key)
			}
		}
		if !errors.Is(errs[1], idem.ErrLeaseLost) {
			t.Fatalf("FinishBatch of a taken-over attempt: %v, want ErrLeaseLost", errs[1])
		}
		if !errors.Is(errs[2], idem.ErrLeaseLost) && !errors.Is(errs[2], store.ErrNotFound) {
			t.Fatalf("FinishBatch of an absent key: %v, want ErrLeaseLost or ErrNotFound", errs[2])
		}
		noErr(t, "FinishBatch release", errs[4])
		noErr(t, "FinishBatch abandon", errs[5])
		if !errors.Is(errs[6], idem.ErrLeaseLost) {
			t.Fatalf("FinishBatch: an attempt abandoned twice: %v, want ErrLeaseLost the second time", errs[6])
		}
		if rec := get(t, s, "rel"); rec.Status != idem.StatusReleased {
			t.Fatalf("released in a batch: %s, want released", rec.Status)
		}
		if rec := get(t, s, "ab"); rec.Status != idem.StatusInProgress || rec.AttemptID != "" || !rec.Lapsed(now(t, s)) {
			t.Fatalf("abandoned in a batch: {%s, attempt id %q, lapsed %v}, want in_progress, no attempt id, lapsed", rec.Status, rec.AttemptID, rec.Lapsed(now(t, s)))
		}
		if rec := get(t, s, "stale"); rec.Status != idem.StatusInProgress || rec.Fence != taken.Record.Fence {
			t.Fatalf("a stale completion changed the record: {%s, fence %d}, want {in_progress, %d}", rec.Status, rec.Fence, taken.Record.Fence)
		}
		wantNotFound(t, s, "absent")
		if errs, err := bc.FinishBatch(ctx, nil); err != nil || len(errs) != 0 {
			t.Fatalf("FinishBatch(nil) = %v, %v; want none, nil", errs, err)
		}
	})
}

// checkNewRecord checks the record a first claim of r made at now.
func checkNewRecord(t *testing.T, rec idem.Record, r store.ClaimRequest, now time.Time) {
	t.Helper()
	if rec.Key != r.Key || rec.Status != idem.StatusInProgress || rec.Attempt != 1 || rec.AttemptID != r.AttemptID {
		t.Fatalf("new claim: {key %q, %s, attempt %d, attempt id %q}, want {%q, in_progress, 1, %q}", rec.Key, rec.Status, rec.Attempt, rec.AttemptID, r.Key, r.AttemptID)
	}
	wantFirstFence(t, "new claim", rec.Fence, now)
	if rec.Owner != r.Owner || rec.Fingerprint != r.Fingerprint || rec.Policy != r.Policy {
		t.Fatalf("new claim: owner %q, fingerprint %q, policy %s; want %q, %q, %s", rec.Owner, rec.Fingerprint, rec.Policy, r.Owner, r.Fingerprint, r.Policy)
	}
	wantTime(t, "LeaseUntil", rec.LeaseUntil, now.Add(r.Lease))
	wantTime(t, "ExpiresAt", rec.ExpiresAt, now.Add(max(r.Lease, r.Retention)))
	wantTime(t, "CreatedAt", rec.CreatedAt, now)
	if len(rec.Journal) != 1 {
		t.Fatalf("new claim: %d journal entries, want 1", len(rec.Journal))
	}
	j := rec.Journal[0]
	if j.Attempt != 1 || j.Fence != rec.Fence || j.AttemptID != r.AttemptID || j.Owner != r.Owner || j.Correlation != r.Correlation || j.Takeover || j.Outcome != "" {
		t.Fatalf("journal entry %+v, want attempt 1, the record's fence %d, attempt id %q, owner %q, correlation %q, no takeover, no outcome",
			j, rec.Fence, r.AttemptID, r.Owner, r.Correlation)
	}
	wantTime(t, "journal Started", j.Started, now)
	wantTime(t, "journal LeaseUntil", j.LeaseUntil, now.Add(r.Lease))
	if len(rec.Result) != 0 || rec.Reason != "" {
		t.Fatalf("new claim: result %q, reason %q; want none", rec.Result, rec.Reason)
	}
}
