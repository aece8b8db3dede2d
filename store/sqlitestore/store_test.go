package sqlitestore

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/store"
)

// fakeClock is a clock that moves only when told to.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func openTest(t testing.TB, opts ...Option) (*Store, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	path := filepath.Join(t.TempDir(), "idem.db")
	s, err := Open(context.Background(), path, append([]Option{WithClock(clk.Now)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, clk
}

func req(key string) store.ClaimRequest {
	return store.ClaimRequest{AttemptID: store.NewAttemptID(),
		Key: key, Owner: "w1", Correlation: "msg-1", Policy: store.AtLeastOnce,
		Lease: 30 * time.Second, Retention: time.Hour,
	}
}

func mustClaim(t testing.TB, s *Store, r store.ClaimRequest) store.ClaimResult {
	t.Helper()
	res, err := s.Claim(context.Background(), r)
	if err != nil {
		t.Fatalf("claim %q: %v", r.Key, err)
	}
	return res
}

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	s, clk := openTest(t)

	first := req("k")
	res := mustClaim(t, s, first)
	// A new record's first fence is the clock's microseconds (nothing was
	// deleted, so the floor is below it).
	f0 := res.Record.Fence
	if !res.Acquired || res.Takeover || f0 != clk.Now().UnixMicro() || res.Record.Attempt != 1 ||
		res.Record.AttemptID != first.AttemptID || res.Record.Journal[0].AttemptID != first.AttemptID ||
		res.Record.Status != store.StatusInProgress || !res.Now.Equal(clk.Now()) ||
		!res.Record.LeaseUntil.Equal(clk.Now().Add(30*time.Second)) ||
		!res.Record.ExpiresAt.Equal(clk.Now().Add(time.Hour)) || len(res.Record.Journal) != 1 {
		t.Fatalf("first claim: %+v", res)
	}
	got, err := s.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if !recordsEqual(got, res.Record) {
		t.Fatalf("Get after claim:\n got %+v\nwant %+v", got, res.Record)
	}

	busy := mustClaim(t, s, req("k"))
	if busy.Acquired || busy.Record.Fence != f0 || busy.Record.AttemptID != first.AttemptID {
		t.Fatalf("second claim: %+v", busy)
	}

	// The right fence with another attempt id is not the holder.
	if err := s.Finish(ctx, store.FinishRequest{Key: "k", Fence: f0, AttemptID: busy.Record.AttemptID + "x", Outcome: store.OutcomeCompleted, Result: []byte("other"), Retention: time.Hour}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("complete by another attempt id: %v", err)
	}
	if err := s.Finish(ctx, store.FinishRequest{Key: "k", Fence: f0, AttemptID: first.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("ok"), Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, store.FinishRequest{Key: "k", Fence: f0, AttemptID: first.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("again"), Retention: time.Hour}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("second complete: %v", err)
	}
	dup := mustClaim(t, s, req("k"))
	if dup.Acquired || dup.Record.Status != store.StatusCompleted || string(dup.Record.Result) != "ok" ||
		dup.Record.AttemptID != first.AttemptID || len(dup.Record.Journal) != 1 || dup.Record.Journal[0].AttemptID != first.AttemptID {
		t.Fatalf("duplicate: %+v", dup)
	}

	clk.Advance(time.Hour)
	if _, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get after retention: %v", err)
	}
	again := mustClaim(t, s, req("k"))
	// An expired record still present counts on from its fence.
	if !again.Acquired || again.Record.Fence != f0+1 || !again.Record.Journal[len(again.Record.Journal)-1].AfterExpiry {
		t.Fatalf("claim after expiry: %+v", again)
	}

	// Lapse and take over.
	clk.Advance(31 * time.Second)
	to := mustClaim(t, s, req("k"))
	if !to.Acquired || !to.Takeover || to.Record.Fence != again.Record.Fence+1 || to.Record.Attempt != 3 {
		t.Fatalf("takeover: %+v", to)
	}
	if err := s.Finish(ctx, store.FinishRequest{Key: "k", Fence: again.Record.Fence, AttemptID: again.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: "late"}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("stale release: %v", err)
	}
	rec, _ := s.Get(ctx, "k")
	var late bool
	for _, e := range rec.Journal {
		if e.Fence == again.Record.Fence && e.AttemptID == again.Record.AttemptID && !e.LateFinish.IsZero() {
			late = true
		}
	}
	if !late {
		t.Fatalf("late finish not annotated: %+v", rec.Journal)
	}

	until, err := s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: to.Record.Fence, AttemptID: to.Record.AttemptID, Lease: time.Minute})
	if err != nil || !until.Equal(clk.Now().Add(time.Minute)) {
		t.Fatalf("extend: %v %v", until, err)
	}
	if err := s.Finish(ctx, store.FinishRequest{Key: "k", Fence: to.Record.Fence, AttemptID: to.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: "try later"}); err != nil {
		t.Fatal(err)
	}
	rel := mustClaim(t, s, req("k"))
	if !rel.Acquired || rel.Record.Fence != to.Record.Fence+1 || rel.Record.Reason != "try later" {
		t.Fatalf("claim after release: %+v", rel)
	}
	if err := s.Finish(ctx, store.FinishRequest{Key: "k", Fence: rel.Record.Fence, AttemptID: rel.Record.AttemptID, Outcome: store.OutcomeFailed, Reason: "boom", Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	f := mustClaim(t, s, req("k"))
	if f.Acquired || f.Record.Status != store.StatusFailed || f.Record.Reason != "boom" {
		t.Fatalf("failed: %+v", f)
	}

	// AtMostOnce: abandon, then indeterminate until resolved.
	amo := req("m")
	amo.Policy = store.AtMostOnce
	c := mustClaim(t, s, amo)
	if err := s.Finish(ctx, store.FinishRequest{Key: "m", Fence: c.Record.Fence, AttemptID: c.Record.AttemptID, Outcome: store.OutcomeAbandoned, Reason: "crashed"}); err != nil {
		t.Fatal(err)
	}
	ind := mustClaim(t, s, amo)
	if ind.Acquired || ind.Record.Status != store.StatusInProgress || !ind.Record.Lapsed(ind.Now) {
		t.Fatalf("indeterminate: %+v", ind)
	}
	stuck, err := s.List(ctx, store.ListQuery{Stuck: true})
	if err != nil || len(stuck) != 1 || stuck[0].Key != "m" {
		t.Fatalf("stuck: %v %+v", err, stuck)
	}
	if _, err := s.Resolve(ctx, store.ResolveRequest{Key: "m", Fence: c.Record.Fence + 1, Done: true}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("resolve with a wrong fence: %v", err)
	}
	r, err := s.Resolve(ctx, store.ResolveRequest{Key: "m", Fence: c.Record.Fence, Done: true, Result: []byte("sent"), Retention: time.Hour, By: "op"})
	if err != nil || r.Status != store.StatusCompleted || r.Fence != c.Record.Fence+1 {
		t.Fatalf("resolve: %+v %v", r, err)
	}
	if _, err := s.Resolve(ctx, store.ResolveRequest{Key: "nope"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("resolve absent: %v", err)
	}

	if err := s.Delete(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "m"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	if _, err := s.Get(ctx, "m"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("get deleted: %v", err)
	}
}

func recordsEqual(a, b store.Record) bool {
	return fmt.Sprintf("%#v", normalized(a)) == fmt.Sprintf("%#v", normalized(b))
}

func normalized(r store.Record) store.Record {
	r.Journal = append([]store.JournalEntry(nil), r.Journal...)
	normalize(&r)
	if len(r.Result) == 0 {
		r.Result = nil
	}
	return r
}

func TestListAndSweep(t *testing.T) {
	ctx := context.Background()
	s, clk := openTest(t)
	for i := range 10 {
		r := req(fmt.Sprintf("k%02d", i))
		r.Retention = time.Duration(i+1) * time.Minute
		res := mustClaim(t, s, r)
		if i%2 == 0 {
			if err := s.Finish(ctx, store.FinishRequest{Key: r.Key, Fence: res.Record.Fence, AttemptID: res.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: nil, Retention: r.Retention}); err != nil {
				t.Fatal(err)
			}
		}
	}
	all, err := s.List(ctx, store.ListQuery{Limit: 4})
	if err != nil || len(all) != 4 || all[0].Key != "k00" || all[3].Key != "k03" {
		t.Fatalf("list: %v %d", err, len(all))
	}
	next, err := s.List(ctx, store.ListQuery{After: all[3].Key})
	if err != nil || len(next) != 6 || next[0].Key != "k04" {
		t.Fatalf("list after: %v %d", err, len(next))
	}
	done, err := s.List(ctx, store.ListQuery{Status: store.StatusCompleted})
	if err != nil || len(done) != 5 {
		t.Fatalf("list completed: %v %d", err, len(done))
	}
	if stuck, _ := s.List(ctx, store.ListQuery{Stuck: true}); len(stuck) != 0 {
		t.Fatalf("stuck before the leases pass: %d", len(stuck))
	}
	clk.Advance(45 * time.Second) // leases (30 s) passed, nothing expired
	if stuck, _ := s.List(ctx, store.ListQuery{Stuck: true}); len(stuck) != 5 {
		t.Fatalf("stuck: %d", len(stuck))
	}
	clk.Advance(4 * time.Minute) // k00..k03 expired (retention 1..4 min; in_progress ones max(lease, retention))
	rest, _ := s.List(ctx, store.ListQuery{})
	if len(rest) != 6 || rest[0].Key != "k04" {
		t.Fatalf("after expiry: %d", len(rest))
	}
	n, err := s.Sweep(ctx, 3)
	if err != nil || n != 3 {
		t.Fatalf("sweep: %d %v", n, err)
	}
	n, err = s.Sweep(ctx, 3)
	if err != nil || n != 1 {
		t.Fatalf("sweep 2: %d %v", n, err)
	}
	n, err = s.Sweep(ctx, 3)
	if err != nil || n != 0 {
		t.Fatalf("sweep 3: %d %v", n, err)
	}
	var rows int
	s.DB().QueryRow(`SELECT count(*) FROM idem_records`).Scan(&rows)
	if rows != 6 {
		t.Fatalf("rows after sweep: %d", rows)
	}
}
