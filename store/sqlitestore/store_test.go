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
	return store.ClaimRequest{
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

	res := mustClaim(t, s, req("k"))
	if !res.Acquired || res.Takeover || res.Record.Fence != 1 || res.Record.Attempt != 1 ||
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
	if busy.Acquired || busy.Record.Fence != 1 {
		t.Fatalf("second claim: %+v", busy)
	}

	if err := s.Complete(ctx, "k", 1, []byte("ok"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "k", 1, []byte("again"), time.Hour); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("second complete: %v", err)
	}
	dup := mustClaim(t, s, req("k"))
	if dup.Acquired || dup.Record.Status != store.StatusCompleted || string(dup.Record.Result) != "ok" {
		t.Fatalf("duplicate: %+v", dup)
	}

	clk.Advance(time.Hour)
	if _, err := s.Get(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get after retention: %v", err)
	}
	again := mustClaim(t, s, req("k"))
	if !again.Acquired || again.Record.Fence != 2 || !again.Record.Journal[len(again.Record.Journal)-1].AfterExpiry {
		t.Fatalf("claim after expiry: %+v", again)
	}

	// Lapse and take over.
	clk.Advance(31 * time.Second)
	to := mustClaim(t, s, req("k"))
	if !to.Acquired || !to.Takeover || to.Record.Fence != 3 || to.Record.Attempt != 3 {
		t.Fatalf("takeover: %+v", to)
	}
	if err := s.Release(ctx, "k", 2, "late"); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("stale release: %v", err)
	}
	rec, _ := s.Get(ctx, "k")
	var late bool
	for _, e := range rec.Journal {
		if e.Fence == 2 && !e.LateFinish.IsZero() {
			late = true
		}
	}
	if !late {
		t.Fatalf("late finish not annotated: %+v", rec.Journal)
	}

	until, err := s.Extend(ctx, "k", 3, time.Minute)
	if err != nil || !until.Equal(clk.Now().Add(time.Minute)) {
		t.Fatalf("extend: %v %v", until, err)
	}
	if err := s.Release(ctx, "k", 3, "try later"); err != nil {
		t.Fatal(err)
	}
	rel := mustClaim(t, s, req("k"))
	if !rel.Acquired || rel.Record.Fence != 4 || rel.Record.Reason != "try later" {
		t.Fatalf("claim after release: %+v", rel)
	}
	if err := s.Fail(ctx, "k", 4, "boom", time.Hour); err != nil {
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
	if err := s.Abandon(ctx, "m", c.Record.Fence, "crashed"); err != nil {
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
	if _, err := s.Resolve(ctx, "m", 99, store.Resolution{Done: true}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("resolve with a wrong fence: %v", err)
	}
	r, err := s.Resolve(ctx, "m", c.Record.Fence, store.Resolution{Done: true, Result: []byte("sent"), Retention: time.Hour, By: "op"})
	if err != nil || r.Status != store.StatusCompleted || r.Fence != c.Record.Fence+1 {
		t.Fatalf("resolve: %+v %v", r, err)
	}
	if _, err := s.Resolve(ctx, "nope", 0, store.Resolution{}); !errors.Is(err, store.ErrNotFound) {
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
			if err := s.Complete(ctx, r.Key, res.Record.Fence, nil, r.Retention); err != nil {
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
