package idemtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// testAdmin holds the operator's calls: List, Resolve and Delete.
func testAdmin(t *testing.T, h Harness) {
	t.Run("list", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		// One record of each kind; "g" expires, "e" and "f" lapse.
		mk := func(key string, p idem.Policy) store.ClaimResult {
			r := req(h, key)
			r.Policy = p
			return acquire(t, s, r)
		}
		a := mk("a-completed", idem.AtLeastOnce)
		noErr(t, "Complete", s.Finish(ctx, store.FinishRequest{Key: a.Record.Key, Fence: a.Record.Fence, AttemptID: a.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: longRetention}))
		b := mk("b-failed", idem.AtLeastOnce)
		noErr(t, "Fail", s.Finish(ctx, store.FinishRequest{Key: b.Record.Key, Fence: b.Record.Fence, AttemptID: b.Record.AttemptID, Outcome: store.OutcomeFailed, Reason: "no", Retention: longRetention}))
		c := mk("c-released", idem.AtLeastOnce)
		noErr(t, "Release", s.Finish(ctx, store.FinishRequest{Key: c.Record.Key, Fence: c.Record.Fence, AttemptID: c.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: "retry"}))
		e := mk("e-lapsed-at-most-once", idem.AtMostOnce)
		f := mk("f-lapsed-at-least-once", idem.AtLeastOnce)
		g := mk("g-expired", idem.AtLeastOnce)
		noErr(t, "Complete", s.Finish(ctx, store.FinishRequest{Key: g.Record.Key, Fence: g.Record.Fence, AttemptID: g.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: time.Millisecond}))
		_ = e
		lapse(t, h, s, f.Record.Key) // claimed last, so e lapsed too
		r := req(h, "d-running")
		r.Lease = longRetention // still running after the others lapsed
		acquire(t, s, r)

		list := func(q store.ListQuery) []string {
			t.Helper()
			recs, err := s.List(ctx, q)
			noErr(t, fmt.Sprintf("List(%+v)", q), err)
			return keysOf(recs)
		}
		wantKeys := func(q store.ListQuery, want ...string) {
			t.Helper()
			if got := list(q); !slices.Equal(got, want) {
				t.Fatalf("List(%+v) = %q, want %q", q, got, want)
			}
		}
		all := []string{"a-completed", "b-failed", "c-released", "d-running", "e-lapsed-at-most-once", "f-lapsed-at-least-once"}
		wantKeys(store.ListQuery{}, all...)
		wantKeys(store.ListQuery{Status: idem.StatusCompleted}, "a-completed")
		wantKeys(store.ListQuery{Status: idem.StatusFailed}, "b-failed")
		wantKeys(store.ListQuery{Status: idem.StatusReleased}, "c-released")
		wantKeys(store.ListQuery{Status: idem.StatusInProgress}, "d-running", "e-lapsed-at-most-once", "f-lapsed-at-least-once")
		wantKeys(store.ListQuery{Stuck: true}, "e-lapsed-at-most-once", "f-lapsed-at-least-once")
		wantKeys(store.ListQuery{Stuck: true, Limit: 1}, "e-lapsed-at-most-once")
		wantKeys(store.ListQuery{Stuck: true, After: "e-lapsed-at-most-once"}, "f-lapsed-at-least-once")
		wantKeys(store.ListQuery{After: "b-failed"}, all[2:]...)
		wantKeys(store.ListQuery{After: "b"}, all[1:]...)
		wantKeys(store.ListQuery{Limit: 2}, all[:2]...)
		wantKeys(store.ListQuery{After: "b-failed", Limit: 2}, all[2:4]...)
		wantKeys(store.ListQuery{After: "z"})
		wantKeys(store.ListQuery{Indeterminate: true}, "e-lapsed-at-most-once")
		wantKeys(store.ListQuery{Indeterminate: true, Status: idem.StatusInProgress}, "e-lapsed-at-most-once")
		wantKeys(store.ListQuery{Indeterminate: true, Status: idem.StatusCompleted})
		wantKeys(store.ListQuery{Indeterminate: true, After: "e-lapsed-at-most-once"})
		wantKeys(store.ListQuery{Prefix: "d"}, "d-running")
		wantKeys(store.ListQuery{Prefix: "e-lapsed-at-most-once"}, "e-lapsed-at-most-once")
		wantKeys(store.ListQuery{Prefix: "e-lapsed-at-most-once-"})
		wantKeys(store.ListQuery{Prefix: "g"}) // expired
		wantKeys(store.ListQuery{Prefix: "b", Status: idem.StatusFailed}, "b-failed")
		wantKeys(store.ListQuery{Prefix: "b", Status: idem.StatusCompleted})
		wantKeys(store.ListQuery{Prefix: "f", Stuck: true}, "f-lapsed-at-least-once")
		wantKeys(store.ListQuery{Prefix: "f", Indeterminate: true})
		// d-running was claimed after the others lapsed: the last change.
		d := get(t, s, "d-running")
		others := all[:3:3]
		others = append(others, all[4:]...)
		wantKeys(store.ListQuery{UpdatedAfter: d.UpdatedAt.Add(-time.Nanosecond)}, "d-running")
		wantKeys(store.ListQuery{UpdatedAfter: d.UpdatedAt})
		wantKeys(store.ListQuery{UpdatedBefore: d.UpdatedAt}, others...)
		wantKeys(store.ListQuery{UpdatedBefore: d.UpdatedAt.Add(time.Nanosecond)}, all...)
		wantKeys(store.ListQuery{UpdatedBefore: d.UpdatedAt, Stuck: true, Limit: 1}, "e-lapsed-at-most-once")
		wantKeys(store.ListQuery{UpdatedAfter: d.UpdatedAt.Add(-time.Nanosecond), UpdatedBefore: d.UpdatedAt.Add(time.Nanosecond), Prefix: "d-"}, "d-running")
		if _, err := s.List(ctx, store.ListQuery{Status: "lapsed"}); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("List(Status %q) = %v, want ErrInvalid", "lapsed", err)
		}

		recs, err := s.List(ctx, store.ListQuery{Status: idem.StatusCompleted})
		noErr(t, "List", err)
		if len(recs) != 1 || string(recs[0].Result) != "r" || recs[0].Fence != a.Record.Fence || recs[0].AttemptID != a.Record.AttemptID || len(recs[0].Journal) != 1 {
			t.Fatalf("List returned %+v, want the whole record (result, fence %d, attempt id %q, journal)", recs, a.Record.Fence, a.Record.AttemptID)
		}
	})

	t.Run("list_pages", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		const n = 150
		var want []string
		for i := range n {
			k := fmt.Sprintf("key-%03d", i)
			want = append(want, k)
			acquire(t, s, req(h, k))
		}
		recs, err := s.List(context.Background(), store.ListQuery{})
		noErr(t, "List", err)
		if len(recs) != 100 {
			t.Fatalf("List with Limit 0 returned %d records, want the default 100", len(recs))
		}
		var got []string
		after := ""
		for range n {
			recs, err := s.List(context.Background(), store.ListQuery{After: after, Limit: 40})
			noErr(t, "List", err)
			if len(recs) == 0 {
				break
			}
			if len(recs) > 40 {
				t.Fatalf("List with Limit 40 returned %d records", len(recs))
			}
			got = append(got, keysOf(recs)...)
			after = recs[len(recs)-1].Key
		}
		if !slices.Equal(got, want) {
			t.Fatalf("paging with After returned %d keys %q..., want %d in order", len(got), got[:min(len(got), 3)], n)
		}
	})

	t.Run("list_filter_pages", func(t *testing.T) {
		t.Parallel()
		testListFilterPages(t, h)
	})

	t.Run("resolve_not_done", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		r := req(h, "k")
		r.Policy = idem.AtMostOnce
		cr := acquire(t, s, r)
		lapse(t, h, s, "k")
		rec, err := s.Resolve(ctx, store.ResolveRequest{Key: "k", Fence: cr.Record.Fence, Done: false, Reason: "no mail in the provider's log", By: "alice"})
		noErr(t, "Resolve(not done)", err)
		if rec.Status != idem.StatusReleased || rec.Fence != cr.Record.Fence+1 || rec.Reason != "no mail in the provider's log" {
			t.Fatalf("Resolve(not done) returned {%s, fence %d, reason %q}, want {released, %d (the resolved attempt's + 1), the reason}", rec.Status, rec.Fence, rec.Reason, cr.Record.Fence+1)
		}
		got := get(t, s, "k")
		if got.Status != idem.StatusReleased || got.Fence != cr.Record.Fence+1 {
			t.Fatalf("after Resolve(not done): {%s, fence %d}, want {released, %d}", got.Status, got.Fence, cr.Record.Fence+1)
		}
		if j := got.Journal[len(got.Journal)-1]; j.Outcome != store.OutcomeResolvedNotDone {
			t.Fatalf("after Resolve(not done): journal %+v, want the last entry resolved-not-done", got.Journal)
		}
		wantErr(t, "stale holder's Complete after Resolve", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("x"), Retention: time.Hour}), idem.ErrLeaseLost)
		cr2 := acquire(t, s, req(h, "k"))
		if cr2.Record.Fence != got.Fence+1 || cr2.Takeover {
			t.Fatalf("claim after Resolve(not done): fence %d takeover %v, want %d (the resolution's + 1) false", cr2.Record.Fence, cr2.Takeover, got.Fence+1)
		}
	})

	t.Run("resolve_done", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		r := req(h, "k")
		r.Policy = idem.AtMostOnce
		cr := acquire(t, s, r)
		lapse(t, h, s, "k")
		before := now(t, s)
		rec, err := s.Resolve(ctx, store.ResolveRequest{Key: "k", Fence: cr.Record.Fence, Done: true, Result: []byte("msg-id-42"), Reason: "found in provider log", Retention: 2 * time.Hour, By: "alice"})
		noErr(t, "Resolve(done)", err)
		after := now(t, s)
		if rec.Status != idem.StatusCompleted || rec.Fence != cr.Record.Fence+1 {
			t.Fatalf("Resolve(done) returned {%s, fence %d}, want {completed, %d (the resolved attempt's + 1)}", rec.Status, rec.Fence, cr.Record.Fence+1)
		}
		got := get(t, s, "k")
		if got.Status != idem.StatusCompleted || got.Fence != cr.Record.Fence+1 {
			t.Fatalf("after Resolve(done): {%s, fence %d}, want {completed, %d}", got.Status, got.Fence, cr.Record.Fence+1)
		}
		wantBytes(t, "Result", got.Result, []byte("msg-id-42"))
		wantBetween(t, "ExpiresAt", got.ExpiresAt, before.Add(2*time.Hour), after.Add(2*time.Hour))
		if j := got.Journal[len(got.Journal)-1]; j.Outcome != store.OutcomeResolvedDone {
			t.Fatalf("after Resolve(done): journal %+v, want the last entry resolved-done", got.Journal)
		}
		c := claim(t, s, req(h, "k"))
		if c.Acquired || c.Record.Status != idem.StatusCompleted {
			t.Fatalf("claim after Resolve(done): acquired %v, found %s; want the completed record", c.Acquired, c.Record.Status)
		}
		wantBytes(t, "claimed Result", c.Record.Result, []byte("msg-id-42"))
		wantErr(t, "stale holder's Complete after Resolve", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("x"), Retention: time.Hour}), idem.ErrLeaseLost)
		wantBytes(t, "Result after the stale Complete", get(t, s, "k").Result, []byte("msg-id-42"))
	})

	t.Run("resolve_running_holder", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		cr := acquire(t, s, req(h, "k"))
		rec, err := s.Resolve(ctx, store.ResolveRequest{Key: "k", Done: false, Reason: "operator", By: "bob"})
		noErr(t, "Resolve(fence 0) of a running attempt", err)
		if rec.Fence != cr.Record.Fence+1 {
			t.Fatalf("Resolve(fence 0) of a running attempt: fence %d, want %d (the holder's + 1)", rec.Fence, cr.Record.Fence+1)
		}
		_, err = s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Lease: time.Minute})
		wantErr(t, "holder's Extend after Resolve", err, idem.ErrLeaseLost)
		wantErr(t, "holder's Complete after Resolve", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("x"), Retention: time.Hour}), idem.ErrLeaseLost)
		if rec := get(t, s, "k"); rec.Status != idem.StatusReleased || rec.Fence != cr.Record.Fence+1 {
			t.Fatalf("after the holder's refused writes: {%s, fence %d}, want the resolution's {released, %d}", rec.Status, rec.Fence, cr.Record.Fence+1)
		}
	})

	t.Run("resolve_fence_mismatch", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		cr := acquire(t, s, req(h, "k"))
		_, err := s.Resolve(ctx, store.ResolveRequest{Key: "k", Fence: cr.Record.Fence + 1, Done: true, Result: []byte("x"), Retention: time.Hour})
		wantErr(t, "Resolve with another fence", err, idem.ErrLeaseLost)
		if rec := get(t, s, "k"); rec.Status != idem.StatusInProgress || rec.Fence != cr.Record.Fence || rec.AttemptID != cr.Record.AttemptID {
			t.Fatalf("after a refused Resolve: {%s, fence %d, attempt id %q}, want the holder's {in_progress, %d, %q}", rec.Status, rec.Fence, rec.AttemptID, cr.Record.Fence, cr.Record.AttemptID)
		}
		_, err = s.Resolve(ctx, store.ResolveRequest{Key: "absent"})
		wantErr(t, "Resolve of an absent key", err, store.ErrNotFound)
	})

	// InProgress: a caller deciding an attempt (a reconciler holding the
	// claim, an operator who inspected a lapsed one) resolves it whether its
	// lease runs or has passed.
	t.Run("resolve_in_progress", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		live := hold(t, h, s, "live")
		rec, err := s.Resolve(ctx, store.ResolveRequest{Key: "live", Fence: live.Record.Fence, Done: true, Result: []byte("found"), Retention: time.Hour, By: "op", InProgress: true})
		noErr(t, "Resolve(InProgress) of an attempt with a live lease", err)
		if rec.Status != idem.StatusCompleted || rec.Fence != live.Record.Fence+1 {
			t.Fatalf("Resolve(InProgress) of a live attempt returned {%s, fence %d}, want {completed, %d}", rec.Status, rec.Fence, live.Record.Fence+1)
		}
		wantBytes(t, "Result", get(t, s, "live").Result, []byte("found"))

		r := req(h, "lapsed")
		r.Policy = idem.AtMostOnce
		lapsed := acquire(t, s, r)
		r = req(h, "lapsed-any-fence")
		r.Policy = idem.AtMostOnce
		acquire(t, s, r)
		lapse(t, h, s, "lapsed-any-fence") // claimed last, so "lapsed" lapsed too
		rec, err = s.Resolve(ctx, store.ResolveRequest{Key: "lapsed", Fence: lapsed.Record.Fence, Done: false, Reason: "not in the provider's log", By: "op", InProgress: true})
		noErr(t, "Resolve(InProgress) of a lapsed attempt", err)
		if rec.Status != idem.StatusReleased || rec.Fence != lapsed.Record.Fence+1 {
			t.Fatalf("Resolve(InProgress) of a lapsed attempt returned {%s, fence %d}, want {released, %d}", rec.Status, rec.Fence, lapsed.Record.Fence+1)
		}
		_, err = s.Resolve(ctx, store.ResolveRequest{Key: "lapsed-any-fence", Done: false, By: "op", InProgress: true})
		noErr(t, "Resolve(fence 0, InProgress) of a lapsed attempt", err)
		if got := get(t, s, "lapsed-any-fence"); got.Status != idem.StatusReleased {
			t.Fatalf("after Resolve(fence 0, InProgress): %s, want released", got.Status)
		}
	})

	// InProgress refuses a record that is not in progress, even at its
	// fence; and after a Delete, the key's new record starts above every
	// fence the old one had, so a holder's fence never names it.
	t.Run("resolve_in_progress_refuses_finished", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		// unchanged fails the test unless key is still want, as it was
		// before a refused Resolve.
		unchanged := func(what, key string, want idem.Record) {
			t.Helper()
			got := get(t, s, key)
			if got.Status != want.Status || got.Fence != want.Fence || got.Attempt != want.Attempt || got.AttemptID != want.AttemptID || got.Reason != want.Reason || len(got.Journal) != len(want.Journal) {
				t.Fatalf("after %s: {%s, fence %d, attempt %d, attempt id %q, reason %q, %d journal entries}, want unchanged {%s, fence %d, attempt %d, attempt id %q, reason %q, %d journal entries}",
					what, got.Status, got.Fence, got.Attempt, got.AttemptID, got.Reason, len(got.Journal), want.Status, want.Fence, want.Attempt, want.AttemptID, want.Reason, len(want.Journal))
			}
			wantBytes(t, what+": Result", got.Result, want.Result)
		}
		refused := func(key string, fence int64) {
			t.Helper()
			before := get(t, s, key)
			for _, done := range []bool{true, false} {
				what := fmt.Sprintf("Resolve(%q, fence %d, Done %v, InProgress) of a %s record", key, fence, done, before.Status)
				_, err := s.Resolve(ctx, store.ResolveRequest{Key: key, Fence: fence, Done: done, Result: []byte("reconciled"), Retention: time.Hour, Reason: "reconciled", By: "holder", InProgress: true})
				wantErr(t, what, err, idem.ErrLeaseLost)
				unchanged(what, key, before)
			}
		}

		// The holder loses its record to a Delete; another caller claims
		// the key again and completes it.
		holder := acquire(t, s, req(h, "k"))
		noErr(t, "Delete", s.Delete(ctx, "k"))
		pass(t, h, s, time.Millisecond) // as any clock does between two calls
		other := req(h, "k")
		other.Owner = "other"
		again := acquire(t, s, other)
		if again.Record.Fence <= holder.Record.Fence {
			t.Fatalf("claim after Delete: fence %d, want above the deleted record's %d (fences never repeat)", again.Record.Fence, holder.Record.Fence)
		}
		noErr(t, "other's Complete", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: again.Record.Fence, AttemptID: again.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("theirs"), Retention: longRetention}))
		refused("k", holder.Record.Fence)
		refused("k", 0)
		wantBytes(t, "Result", get(t, s, "k").Result, []byte("theirs"))

		fin := func(key string, end store.FinishRequest) int64 {
			t.Helper()
			cr := acquire(t, s, req(h, key))
			end.Key, end.Fence, end.AttemptID = key, cr.Record.Fence, cr.Record.AttemptID
			noErr(t, "finishing "+key, s.Finish(ctx, end))
			return cr.Record.Fence
		}
		f := fin("failed", store.FinishRequest{Outcome: store.OutcomeFailed, Reason: "declined", Retention: longRetention})
		refused("failed", f)
		f = fin("released", store.FinishRequest{Outcome: store.OutcomeReleased, Reason: "retry"})
		refused("released", f)

		// Absent and expired stay ErrNotFound.
		_, err := s.Resolve(ctx, store.ResolveRequest{Key: "absent", Fence: 1, InProgress: true})
		wantErr(t, "Resolve(InProgress) of an absent key", err, store.ErrNotFound)
		f = fin("expired", store.FinishRequest{Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: retention(h)})
		pass(t, h, s, retention(h)+time.Millisecond)
		_, err = s.Resolve(ctx, store.ResolveRequest{Key: "expired", Fence: f, InProgress: true})
		wantErr(t, "Resolve(InProgress) of an expired key", err, store.ErrNotFound)
	})

	t.Run("delete", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		cr := acquire(t, s, req(h, "k"))
		noErr(t, "Complete", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: longRetention}))
		noErr(t, "Delete", s.Delete(ctx, "k"))
		wantNotFound(t, s, "k")
		wantErr(t, "second Delete", s.Delete(ctx, "k"), store.ErrNotFound)
		wantErr(t, "Delete of an absent key", s.Delete(ctx, "absent"), store.ErrNotFound)
		// The key claimed anew starts above every fence the deleted
		// record had.
		pass(t, h, s, time.Millisecond) // as any clock does between two calls
		again := acquire(t, s, req(h, "k"))
		if again.Record.Fence <= cr.Record.Fence {
			t.Fatalf("claim after Delete: fence %d, want above the deleted record's %d (fences never repeat)", again.Record.Fence, cr.Record.Fence)
		}
		// Delete works whatever the state: here in_progress.
		noErr(t, "Delete of an in_progress record", s.Delete(ctx, "k"))
		wantNotFound(t, s, "k")
		pass(t, h, s, time.Millisecond)
		if third := acquire(t, s, req(h, "k")); third.Record.Fence <= again.Record.Fence {
			t.Fatalf("claim after a Delete of an in_progress record: fence %d, want above the deleted record's %d (fences never repeat)", third.Record.Fence, again.Record.Fence)
		}
	})
}

// testListFilterPages pages through List under each filter, a few records
// at a time, and checks that the pages hold the records the filter
// selects by [store.ListQuery.Matches], in key order, each once. The keys
// share prefixes ("x-", "xz-", and "x." and "x" just around the key range
// of "x-"), so a prefix's range is checked at both its ends.
func testListFilterPages(t *testing.T, h Harness) {
	s := newStore(t, h)
	ctx := context.Background()
	finish := func(cr store.ClaimResult, o store.Outcome) {
		noErr(t, "Finish", s.Finish(ctx, store.FinishRequest{Key: cr.Record.Key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID,
			Outcome: o, Result: []byte("r"), Reason: "why", Retention: longRetention}))
	}
	var last string
	for i := range 72 {
		k := fmt.Sprintf("%s%03d", []string{"x-", "y-", "xz-"}[i%3], i)
		r := req(h, k)
		switch i % 4 {
		case 0:
			finish(acquire(t, s, r), store.OutcomeCompleted)
		case 1:
			finish(acquire(t, s, r), store.OutcomeFailed)
		case 2:
			r.Policy = idem.AtMostOnce
			acquire(t, s, r)
		case 3:
			acquire(t, s, r)
		}
		last = k
	}
	for _, k := range []string{"x", "x-", "x.", "x-\U0010FFFF"} {
		finish(acquire(t, s, req(h, k)), store.OutcomeCompleted)
	}
	lapse(t, h, s, last)
	// Claimed after the others lapsed, with a lease that outlives the test.
	hold(t, h, s, "x-running")
	running := get(t, s, "x-running")

	var recs []idem.Record
	for after := ""; ; {
		page, err := s.List(ctx, store.ListQuery{After: after, Limit: 1000})
		noErr(t, "List", err)
		if len(page) == 0 {
			break
		}
		recs = append(recs, page...)
		after = page[len(page)-1].Key
	}
	if len(recs) != 77 {
		t.Fatalf("List returned %d records, want 77", len(recs))
	}
	at := now(t, s)
	for _, c := range []struct {
		q    store.ListQuery
		want int // how many records match, so that no case checks an empty list
	}{
		{store.ListQuery{Prefix: "x-"}, 27},
		{store.ListQuery{Prefix: "x-\U0010FFFF"}, 1},
		{store.ListQuery{Prefix: "x"}, 53},
		{store.ListQuery{Prefix: "x-", Status: idem.StatusFailed}, 6},
		{store.ListQuery{Prefix: "xz-", Status: idem.StatusCompleted}, 6},
		{store.ListQuery{Status: idem.StatusInProgress}, 37},
		{store.ListQuery{Stuck: true}, 36},
		{store.ListQuery{Indeterminate: true}, 18},
		{store.ListQuery{Indeterminate: true, Prefix: "y-"}, 6},
		{store.ListQuery{Stuck: true, Prefix: "x-"}, 12},
		{store.ListQuery{UpdatedAfter: running.UpdatedAt.Add(-time.Nanosecond)}, 1},
		{store.ListQuery{UpdatedBefore: running.UpdatedAt, Prefix: "x-"}, 26},
		{store.ListQuery{UpdatedBefore: running.UpdatedAt, Stuck: true, Prefix: "y-"}, 12},
	} {
		var want []string
		for i := range recs {
			if c.q.Matches(&recs[i], at) {
				want = append(want, recs[i].Key)
			}
		}
		if len(want) != c.want {
			t.Fatalf("%d of the records match %+v, want %d: %q", len(want), c.q, c.want, want)
		}
		for _, limit := range []int{1, 5, 100} {
			q := c.q
			q.Limit = limit
			var got []string
			for range len(recs) + 1 {
				page, err := s.List(ctx, q)
				noErr(t, fmt.Sprintf("List(%+v)", q), err)
				if len(page) > limit {
					t.Fatalf("List(%+v) returned %d records", q, len(page))
				}
				if len(page) == 0 {
					break
				}
				got = append(got, keysOf(page)...)
				q.After = page[len(page)-1].Key
			}
			if !slices.Equal(got, want) {
				t.Fatalf("pages of %d of List(%+v) = %q, want %q", limit, c.q, got, want)
			}
		}
	}
}
