package idemtest

import (
	"context"
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
		noErr(t, "Complete", s.Complete(ctx, a.Record.Key, a.Record.Fence, []byte("r"), longRetention))
		b := mk("b-failed", idem.AtLeastOnce)
		noErr(t, "Fail", s.Fail(ctx, b.Record.Key, b.Record.Fence, "no", longRetention))
		c := mk("c-released", idem.AtLeastOnce)
		noErr(t, "Release", s.Release(ctx, c.Record.Key, c.Record.Fence, "retry"))
		e := mk("e-lapsed-at-most-once", idem.AtMostOnce)
		f := mk("f-lapsed-at-least-once", idem.AtLeastOnce)
		g := mk("g-expired", idem.AtLeastOnce)
		noErr(t, "Complete", s.Complete(ctx, g.Record.Key, g.Record.Fence, []byte("r"), time.Millisecond))
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

		recs, err := s.List(ctx, store.ListQuery{Status: idem.StatusCompleted})
		noErr(t, "List", err)
		if len(recs) != 1 || string(recs[0].Result) != "r" || recs[0].Fence != 1 || len(recs[0].Journal) != 1 {
			t.Fatalf("List returned %+v, want the whole record (result, fence, journal)", recs)
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

	t.Run("resolve_not_done", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		r := req(h, "k")
		r.Policy = idem.AtMostOnce
		cr := acquire(t, s, r)
		lapse(t, h, s, "k")
		rec, err := s.Resolve(ctx, "k", cr.Record.Fence, store.Resolution{Done: false, Reason: "no mail in the provider's log", By: "alice"})
		noErr(t, "Resolve(not done)", err)
		if rec.Status != idem.StatusReleased || rec.Fence != 2 || rec.Reason != "no mail in the provider's log" {
			t.Fatalf("Resolve(not done) returned {%s, fence %d, reason %q}, want {released, 2, the reason}", rec.Status, rec.Fence, rec.Reason)
		}
		got := get(t, s, "k")
		if got.Status != idem.StatusReleased || got.Fence != 2 {
			t.Fatalf("after Resolve(not done): {%s, fence %d}, want {released, 2}", got.Status, got.Fence)
		}
		if j := got.Journal[len(got.Journal)-1]; j.Outcome != store.OutcomeResolvedNotDone {
			t.Fatalf("after Resolve(not done): journal %+v, want the last entry resolved-not-done", got.Journal)
		}
		wantErr(t, "stale holder's Complete after Resolve", s.Complete(ctx, "k", cr.Record.Fence, []byte("x"), time.Hour), idem.ErrLeaseLost)
		cr2 := acquire(t, s, req(h, "k"))
		if cr2.Record.Fence != 3 || cr2.Takeover {
			t.Fatalf("claim after Resolve(not done): fence %d takeover %v, want 3 false", cr2.Record.Fence, cr2.Takeover)
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
		rec, err := s.Resolve(ctx, "k", cr.Record.Fence, store.Resolution{Done: true, Result: []byte("msg-id-42"), Reason: "found in provider log", Retention: 2 * time.Hour, By: "alice"})
		noErr(t, "Resolve(done)", err)
		after := now(t, s)
		if rec.Status != idem.StatusCompleted || rec.Fence != 2 {
			t.Fatalf("Resolve(done) returned {%s, fence %d}, want {completed, 2}", rec.Status, rec.Fence)
		}
		got := get(t, s, "k")
		if got.Status != idem.StatusCompleted || got.Fence != 2 {
			t.Fatalf("after Resolve(done): {%s, fence %d}, want {completed, 2}", got.Status, got.Fence)
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
		wantErr(t, "stale holder's Complete after Resolve", s.Complete(ctx, "k", cr.Record.Fence, []byte("x"), time.Hour), idem.ErrLeaseLost)
		wantBytes(t, "Result after the stale Complete", get(t, s, "k").Result, []byte("msg-id-42"))
	})

	t.Run("resolve_running_holder", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		cr := acquire(t, s, req(h, "k"))
		_, err := s.Resolve(ctx, "k", 0, store.Resolution{Done: false, Reason: "operator", By: "bob"})
		noErr(t, "Resolve(fence 0) of a running attempt", err)
		_, err = s.Extend(ctx, "k", cr.Record.Fence, time.Minute)
		wantErr(t, "holder's Extend after Resolve", err, idem.ErrLeaseLost)
		wantErr(t, "holder's Complete after Resolve", s.Complete(ctx, "k", cr.Record.Fence, []byte("x"), time.Hour), idem.ErrLeaseLost)
		if rec := get(t, s, "k"); rec.Status != idem.StatusReleased {
			t.Fatalf("after the holder's refused writes: %s, want released", rec.Status)
		}
	})

	t.Run("resolve_fence_mismatch", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		cr := acquire(t, s, req(h, "k"))
		_, err := s.Resolve(ctx, "k", cr.Record.Fence+1, store.Resolution{Done: true, Result: []byte("x"), Retention: time.Hour})
		wantErr(t, "Resolve with another fence", err, idem.ErrLeaseLost)
		if rec := get(t, s, "k"); rec.Status != idem.StatusInProgress || rec.Fence != 1 {
			t.Fatalf("after a refused Resolve: {%s, fence %d}, want {in_progress, 1}", rec.Status, rec.Fence)
		}
		_, err = s.Resolve(ctx, "absent", 0, store.Resolution{})
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
		rec, err := s.Resolve(ctx, "live", live.Record.Fence, store.Resolution{Done: true, Result: []byte("found"), Retention: time.Hour, By: "op", InProgress: true})
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
		rec, err = s.Resolve(ctx, "lapsed", lapsed.Record.Fence, store.Resolution{Done: false, Reason: "not in the provider's log", By: "op", InProgress: true})
		noErr(t, "Resolve(InProgress) of a lapsed attempt", err)
		if rec.Status != idem.StatusReleased || rec.Fence != lapsed.Record.Fence+1 {
			t.Fatalf("Resolve(InProgress) of a lapsed attempt returned {%s, fence %d}, want {released, %d}", rec.Status, rec.Fence, lapsed.Record.Fence+1)
		}
		_, err = s.Resolve(ctx, "lapsed-any-fence", 0, store.Resolution{Done: false, By: "op", InProgress: true})
		noErr(t, "Resolve(fence 0, InProgress) of a lapsed attempt", err)
		if got := get(t, s, "lapsed-any-fence"); got.Status != idem.StatusReleased {
			t.Fatalf("after Resolve(fence 0, InProgress): %s, want released", got.Status)
		}
	})

	// InProgress refuses a record that is not in progress at the fence,
	// even though the fence matches: fences start again at 1 after Delete,
	// so a holder's fence can name a record that others claimed and
	// finished since.
	t.Run("resolve_in_progress_refuses_finished", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		// unchanged fails the test unless key is still want, as it was
		// before a refused Resolve.
		unchanged := func(what, key string, want idem.Record) {
			t.Helper()
			got := get(t, s, key)
			if got.Status != want.Status || got.Fence != want.Fence || got.Attempt != want.Attempt || got.Reason != want.Reason || len(got.Journal) != len(want.Journal) {
				t.Fatalf("after %s: {%s, fence %d, attempt %d, reason %q, %d journal entries}, want unchanged {%s, fence %d, attempt %d, reason %q, %d journal entries}",
					what, got.Status, got.Fence, got.Attempt, got.Reason, len(got.Journal), want.Status, want.Fence, want.Attempt, want.Reason, len(want.Journal))
			}
			wantBytes(t, what+": Result", got.Result, want.Result)
		}
		refused := func(key string, fence int64) {
			t.Helper()
			before := get(t, s, key)
			for _, done := range []bool{true, false} {
				what := fmt.Sprintf("Resolve(%q, fence %d, Done %v, InProgress) of a %s record", key, fence, done, before.Status)
				_, err := s.Resolve(ctx, key, fence, store.Resolution{Done: done, Result: []byte("reconciled"), Retention: time.Hour, Reason: "reconciled", By: "holder", InProgress: true})
				wantErr(t, what, err, idem.ErrLeaseLost)
				unchanged(what, key, before)
			}
		}

		// The holder of fence 1 loses its record to a Delete; another
		// caller claims the key again and completes it at fence 1.
		holder := acquire(t, s, req(h, "k"))
		noErr(t, "Delete", s.Delete(ctx, "k"))
		other := req(h, "k")
		other.Owner = "other"
		again := acquire(t, s, other)
		if again.Record.Fence != holder.Record.Fence {
			t.Fatalf("claim after Delete: fence %d, want %d (fences start again)", again.Record.Fence, holder.Record.Fence)
		}
		noErr(t, "other's Complete", s.Complete(ctx, "k", again.Record.Fence, []byte("theirs"), longRetention))
		refused("k", holder.Record.Fence)
		refused("k", 0)
		wantBytes(t, "Result", get(t, s, "k").Result, []byte("theirs"))

		fin := func(key string, end func(fence int64) error) int64 {
			t.Helper()
			cr := acquire(t, s, req(h, key))
			noErr(t, "finishing "+key, end(cr.Record.Fence))
			return cr.Record.Fence
		}
		f := fin("failed", func(f int64) error { return s.Fail(ctx, "failed", f, "declined", longRetention) })
		refused("failed", f)
		f = fin("released", func(f int64) error { return s.Release(ctx, "released", f, "retry") })
		refused("released", f)

		// Absent and expired stay ErrNotFound.
		_, err := s.Resolve(ctx, "absent", 1, store.Resolution{InProgress: true})
		wantErr(t, "Resolve(InProgress) of an absent key", err, store.ErrNotFound)
		f = fin("expired", func(f int64) error { return s.Complete(ctx, "expired", f, []byte("r"), retention(h)) })
		pass(t, h, s, retention(h)+time.Millisecond)
		_, err = s.Resolve(ctx, "expired", f, store.Resolution{InProgress: true})
		wantErr(t, "Resolve(InProgress) of an expired key", err, store.ErrNotFound)
	})

	t.Run("delete", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		cr := acquire(t, s, req(h, "k"))
		noErr(t, "Complete", s.Complete(ctx, "k", cr.Record.Fence, []byte("r"), longRetention))
		noErr(t, "Delete", s.Delete(ctx, "k"))
		wantNotFound(t, s, "k")
		wantErr(t, "second Delete", s.Delete(ctx, "k"), store.ErrNotFound)
		wantErr(t, "Delete of an absent key", s.Delete(ctx, "absent"), store.ErrNotFound)
		acquire(t, s, req(h, "k"))
		// Delete works whatever the state: here in_progress.
		noErr(t, "Delete of an in_progress record", s.Delete(ctx, "k"))
		wantNotFound(t, s, "k")
	})
}
