package memstore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/store"
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
	first := store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "t", Owner: "first", Correlation: "c1", Policy: store.AtLeastOnce, Lease: time.Minute, Retention: time.Hour}
	if cr, err := s.Claim(ctx, first); err != nil || !cr.Acquired {
		t.Fatalf("Claim: %+v, %v", cr, err)
	}
	clock.Advance(2 * time.Minute) // the first attempt crashed: its lease lapses

	// The takeover of t and the claim of fresh are made; ctx ends during
	// the second, so the third fails.
	req := func(k string) store.ClaimRequest {
		return store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: k, Owner: "second", Correlation: "c2", Policy: store.AtMostOnce, Lease: time.Minute, Retention: time.Hour}
	}
	t2 := req("t")
	t2.Policy, t2.TakeLapsed = store.AtLeastOnce, true
	cancelAt.Store(reads.Load() + 2)
	if _, err := s.ClaimBatch(bctx, []store.ClaimRequest{t2, req("fresh"), req("late")}); !errors.Is(err, context.Canceled) {
		t.Fatalf("ClaimBatch whose ctx ended midway = %v, want context.Canceled", err)
	}
	if _, err := s.Get(ctx, "late"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get(late) = %v, want ErrNotFound", err)
	}
	idemtest.CheckUndone(t, s, []string{"fresh"}, "t", first)
}
