package idemtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// testClaim holds the Store contract of a claim and of the writes that end
// an attempt (DESIGN.md §2 and §3), called directly on the store.
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
		if cr.Record.Status != idem.StatusInProgress || cr.Record.Fence != 1 || cr.Record.Owner != first.Record.Owner {
			t.Fatalf("second Claim found {%s, fence %d, owner %q}, want {in_progress, 1, %q}",
				cr.Record.Status, cr.Record.Fence, cr.Record.Owner, first.Record.Owner)
		}
		wantTime(t, "found LeaseUntil", cr.Record.LeaseUntil, first.Record.LeaseUntil)
		rec := get(t, s, "k")
		if rec.Fence != 1 || rec.Attempt != 1 || len(rec.Journal) != 1 || rec.Owner != first.Record.Owner {
			t.Fatalf("after a refused claim: fence %d, attempt %d, %d journal entries, owner %q; want 1, 1, 1, %q (nothing written)",
				rec.Fence, rec.Attempt, len(rec.Journal), rec.Owner, first.Record.Owner)
		}
	})

	t.Run("complete", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		cr := acquire(t, s, req(h, "k"))
		ret := 2 * time.Hour
		before := now(t, s)
		noErr(t, "Complete", s.Complete(context.Background(), "k", cr.Record.Fence, []byte("result-1"), ret))
		after := now(t, s)
		rec := get(t, s, "k")
		if rec.Status != idem.StatusCompleted {
			t.Fatalf("after Complete: status %s, want completed", rec.Status)
		}
		wantBytes(t, "Result", rec.Result, []byte("result-1"))
		wantBetween(t, "ExpiresAt", rec.ExpiresAt, before.Add(ret), after.Add(ret))
		if rec.Fence != 1 || rec.Attempt != 1 {
			t.Fatalf("after Complete: fence %d attempt %d, want 1 1", rec.Fence, rec.Attempt)
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
		if rec := get(t, s, "k"); rec.Fence != 1 || rec.Status != idem.StatusCompleted {
			t.Fatalf("after refused claims: %s fence %d, want completed fence 1", rec.Status, rec.Fence)
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
			noErr(t, "Complete", s.Complete(context.Background(), key, cr.Record.Fence, res, time.Hour))
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
		noErr(t, "Release", s.Release(context.Background(), "k", cr.Record.Fence, "smtp refused"))
		rec := get(t, s, "k")
		if rec.Status != idem.StatusReleased || rec.Reason != "smtp refused" || rec.Fence != 1 || rec.Attempt != 1 {
			t.Fatalf("after Release: {%s, reason %q, fence %d, attempt %d}, want {released, %q, 1, 1}",
				rec.Status, rec.Reason, rec.Fence, rec.Attempt, "smtp refused")
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
		if cr2.Record.Fence != 2 || cr2.Record.Attempt != 2 {
			t.Fatalf("claim of a released key: fence %d attempt %d, want 2 2 (numbering continues)", cr2.Record.Fence, cr2.Record.Attempt)
		}
		if cr2.Record.Reason != "smtp refused" {
			t.Fatalf("claim of a released key: Reason %q, want the last reason %q kept", cr2.Record.Reason, "smtp refused")
		}
		rec = get(t, s, "k")
		if rec.Status != idem.StatusInProgress || rec.Owner != "second" || len(rec.Journal) != 2 {
			t.Fatalf("after the second claim: {%s, owner %q, %d journal entries}, want {in_progress, second, 2}", rec.Status, rec.Owner, len(rec.Journal))
		}
		if j := rec.Journal[1]; j.Attempt != 2 || j.Fence != 2 || j.Owner != "second" {
			t.Fatalf("second journal entry %+v, want attempt 2, fence 2, owner second", j)
		}
	})

	t.Run("fail", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		cr := acquire(t, s, req(h, "k"))
		before := now(t, s)
		noErr(t, "Fail", s.Fail(context.Background(), "k", cr.Record.Fence, "card declined", 3*time.Hour))
		after := now(t, s)
		rec := get(t, s, "k")
		if rec.Status != idem.StatusFailed || rec.Reason != "card declined" {
			t.Fatalf("after Fail: {%s, %q}, want {failed, %q}", rec.Status, rec.Reason, "card declined")
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
		wantErr(t, "Complete(absent)", s.Complete(ctx, "absent", 1, nil, time.Hour), idem.ErrLeaseLost)
		wantErr(t, "Release(absent)", s.Release(ctx, "absent", 1, ""), idem.ErrLeaseLost)
		wantErr(t, "Fail(absent)", s.Fail(ctx, "absent", 1, "", time.Hour), idem.ErrLeaseLost)
		wantErr(t, "Abandon(absent)", s.Abandon(ctx, "absent", 1, ""), idem.ErrLeaseLost)
		_, err := s.Extend(ctx, "absent", 1, time.Minute)
		wantErr(t, "Extend(absent)", err, idem.ErrLeaseLost)
		wantNotFound(t, s, "absent")
	})

	t.Run("finish_twice", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		cr := acquire(t, s, req(h, "k"))
		noErr(t, "Complete", s.Complete(ctx, "k", cr.Record.Fence, []byte("one"), time.Hour))
		wantErr(t, "second Complete", s.Complete(ctx, "k", cr.Record.Fence, []byte("two"), time.Hour), idem.ErrLeaseLost)
		wantErr(t, "Release after Complete", s.Release(ctx, "k", cr.Record.Fence, ""), idem.ErrLeaseLost)
		wantErr(t, "Fail after Complete", s.Fail(ctx, "k", cr.Record.Fence, "", time.Hour), idem.ErrLeaseLost)
		wantErr(t, "Abandon after Complete", s.Abandon(ctx, "k", cr.Record.Fence, ""), idem.ErrLeaseLost)
		_, err := s.Extend(ctx, "k", cr.Record.Fence, time.Minute)
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
		noErr(t, "Complete", s.Complete(context.Background(), "k", cr.Record.Fence, buf, time.Hour))
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
		noErr(t, "Complete", s.Complete(context.Background(), "done", done.Record.Fence, []byte("r"), time.Hour))
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
		if res[3].Record.Status != idem.StatusInProgress || res[3].Record.Fence != 1 {
			t.Fatalf("second claim of %q in one batch found {%s, fence %d}, want {in_progress, 1}", "b", res[3].Record.Status, res[3].Record.Fence)
		}
		for _, k := range []string{"a", "b", "c"} {
			if rec := get(t, s, k); rec.Status != idem.StatusInProgress || rec.Fence != 1 {
				t.Fatalf("after the batch %q is {%s, fence %d}, want {in_progress, 1}", k, rec.Status, rec.Fence)
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
		noErr(t, "Complete", s.Complete(context.Background(), "bad", bad.Record.Fence, []byte("r"), time.Hour))
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

	t.Run("complete_batch", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		bc, ok := s.(store.BatchCompleter)
		if !ok {
			t.Skip("the store does not implement store.BatchCompleter")
		}
		ctx := context.Background()
		a, b := acquire(t, s, req(h, "a")), acquire(t, s, req(h, "b"))
		stale := acquire(t, s, req(h, "stale"))
		lapse(t, h, s, "stale")
		taken := acquire(t, s, req(h, "stale")) // fence 2 holds it now
		errs, err := bc.CompleteBatch(ctx, []store.Completion{
			{Key: "b", Fence: b.Record.Fence, Result: []byte("rb"), Retention: time.Hour},
			{Key: "stale", Fence: stale.Record.Fence, Result: []byte("late"), Retention: time.Hour},
			{Key: "absent", Fence: 1, Result: []byte("x"), Retention: time.Hour},
			{Key: "a", Fence: a.Record.Fence, Result: []byte("ra"), Retention: time.Hour},
		})
		noErr(t, "CompleteBatch", err)
		if len(errs) != 4 {
			t.Fatalf("CompleteBatch returned %d answers for 4", len(errs))
		}
		for i, key := range []string{"b", "", "", "a"} {
			if key == "" {
				continue
			}
			noErr(t, "CompleteBatch of "+key, errs[i])
			rec := get(t, s, key)
			if rec.Status != idem.StatusCompleted || string(rec.Result) != "r"+key {
				t.Fatalf("%q after CompleteBatch: {%s, %q}, want {completed, %q}", key, rec.Status, rec.Result, "r"+key)
			}
		}
		if !errors.Is(errs[1], idem.ErrLeaseLost) {
			t.Fatalf("CompleteBatch of a taken-over attempt: %v, want ErrLeaseLost", errs[1])
		}
		if !errors.Is(errs[2], idem.ErrLeaseLost) && !errors.Is(errs[2], store.ErrNotFound) {
			t.Fatalf("CompleteBatch of an absent key: %v, want ErrLeaseLost or ErrNotFound", errs[2])
		}
		if rec := get(t, s, "stale"); rec.Status != idem.StatusInProgress || rec.Fence != taken.Record.Fence {
			t.Fatalf("a stale completion changed the record: {%s, fence %d}, want {in_progress, %d}", rec.Status, rec.Fence, taken.Record.Fence)
		}
		wantNotFound(t, s, "absent")
		if errs, err := bc.CompleteBatch(ctx, nil); err != nil || len(errs) != 0 {
			t.Fatalf("CompleteBatch(nil) = %v, %v; want none, nil", errs, err)
		}
	})
}

// checkNewRecord checks the record a first claim of r made at now.
func checkNewRecord(t *testing.T, rec idem.Record, r store.ClaimRequest, now time.Time) {
	t.Helper()
	if rec.Key != r.Key || rec.Status != idem.StatusInProgress || rec.Fence != 1 || rec.Attempt != 1 {
		t.Fatalf("new claim: {key %q, %s, fence %d, attempt %d}, want {%q, in_progress, 1, 1}", rec.Key, rec.Status, rec.Fence, rec.Attempt, r.Key)
	}
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
	if j.Attempt != 1 || j.Fence != 1 || j.Owner != r.Owner || j.Correlation != r.Correlation || j.Takeover || j.Outcome != "" {
		t.Fatalf("journal entry %+v, want attempt 1, fence 1, owner %q, correlation %q, no takeover, no outcome", j, r.Owner, r.Correlation)
	}
	wantTime(t, "journal Started", j.Started, now)
	wantTime(t, "journal LeaseUntil", j.LeaseUntil, now.Add(r.Lease))
	if len(rec.Result) != 0 || rec.Reason != "" {
		t.Fatalf("new claim: result %q, reason %q; want none", rec.Result, rec.Reason)
	}
}
