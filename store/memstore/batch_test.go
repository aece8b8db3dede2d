package memstore_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/store/memstore"
)

// TestClaimBatchFailsUndoesAsNotRun: when ctx ends in the middle of a
// ClaimBatch, the claims it had made are undone: a fresh claim released,
// a takeover abandoned (lapsed at once, not busy for a lease), both as not
// run. The next call's Reconcile hook is not asked about the fresh key,
// and is asked about the attempt the takeover took over.
func TestClaimBatchFailsUndoesAsNotRun(t *testing.T) {
	ctx := context.Background()
	clock := idemtest.NewClock(idemtest.ClockStart)
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var cancelAt atomic.Int64 // cancel bctx at this reading of the clock
	var reads atomic.Int64
	s := memstore.New(memstore.WithClock(func() time.Time {
		if n := reads.Add(1); n == cancelAt.Load() {
			cancel()
		}
		return clock.Now()
	}))
	first := idem.ClaimRequest{Key: "t", Owner: "first", Correlation: "c1", Policy: idem.AtLeastOnce, Lease: time.Minute, Retention: time.Hour}
	if cr, err := s.Claim(ctx, first); err != nil || !cr.Acquired {
		t.Fatalf("Claim: %+v, %v", cr, err)
	}
	clock.Advance(2 * time.Minute) // the first attempt crashed: its lease lapses

	// The takeover of t and the claim of fresh are made; ctx ends during
	// the second, so the third fails.
	req := func(k string) idem.ClaimRequest {
		return idem.ClaimRequest{Key: k, Owner: "second", Correlation: "c2", Policy: idem.AtMostOnce, Lease: time.Minute, Retention: time.Hour}
	}
	t2 := req("t")
	t2.Policy, t2.TakeLapsed = idem.AtLeastOnce, true
	cancelAt.Store(reads.Load() + 2)
	if _, err := s.ClaimBatch(bctx, []idem.ClaimRequest{t2, req("fresh"), req("late")}); !errors.Is(err, context.Canceled) {
		t.Fatalf("ClaimBatch whose ctx ended midway = %v, want context.Canceled", err)
	}
	rec, err := s.Get(ctx, "fresh")
	if err != nil || rec.Status != idem.StatusReleased || !rec.Journal[len(rec.Journal)-1].NotRun() {
		t.Fatalf("fresh after the failed batch: %s, %v, journal %+v; want released, not run", rec.Status, err, rec.Journal)
	}
	rec, err = s.Get(ctx, "t")
	if err != nil || rec.Status != idem.StatusInProgress || rec.Fence != 2 || !rec.Lapsed(clock.Now()) {
		t.Fatalf("t after the failed batch took it over: %s at fence %d, lease until %v, %v; want in_progress at fence 2, lapsed", rec.Status, rec.Fence, rec.LeaseUntil, err)
	}
	if last := rec.Journal[len(rec.Journal)-1]; last.Outcome != idem.OutcomeAbandoned || !last.NotRun() {
		t.Fatalf("t's takeover in the failed batch: journal entry %+v; want abandoned, not run", last)
	}
	if _, err := s.Get(ctx, "late"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get(late) = %v, want ErrNotFound", err)
	}

	// At once, without the clock moving.
	l := idem.New(s, idem.WithOwner("third"), idem.WithLogger(slog.New(slog.DiscardHandler)))
	do := func(key string, opts ...idem.CallOption) (idem.Result, []idem.Lapsed, error) {
		var asked []idem.Lapsed
		opts = append(opts, idem.WithReconcile(func(_ context.Context, lp idem.Lapsed) ([]byte, bool, error) {
			asked = append(asked, lp)
			return nil, false, nil
		}))
		res, err := l.Do(ctx, idem.RawKey(key), func(context.Context) ([]byte, error) { return []byte("ran"), nil }, opts...)
		return res, asked, err
	}
	res, asked, err := do("fresh", idem.WithPolicy(idem.AtMostOnce))
	if err != nil || res.Takeover || res.Fence != 2 || len(asked) != 0 {
		t.Fatalf("call for the key the failed batch made: %+v, %v, hook asked about %+v; want fn run afresh at fence 2, no hook", res, err, asked)
	}
	res, asked, err = do("t")
	if err != nil || !res.Takeover || res.Fence != 3 {
		t.Fatalf("call for the key the failed batch took over: %+v, %v; want a takeover at fence 3", res, err)
	}
	if len(asked) != 1 || asked[0].Attempt != 1 || asked[0].Owner != "first" || asked[0].Correlation != "c1" {
		t.Fatalf("the Reconcile hook was asked about %+v; want once, about attempt 1 (first, c1)", asked)
	}
}
