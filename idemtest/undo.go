package idemtest

import (
	"context"
	"log/slog"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// CheckUndone checks what a store left after it undid claims it could not
// keep (a batch claim that failed midway, a write the replicas did not
// confirm), as every store must undo them: each key in fresh, which the
// undone claims claimed afresh, is released as not run; taken, which they
// took over from the lapsed attempt first (fence 1), is in progress at
// fence 2, lapsed at once and abandoned as not run. Then, at once, a
// Ledger call on each fresh key runs afresh at fence 2 under AtMostOnce
// without asking its Reconcile hook, and one on taken takes over at fence
// 3, asking the hook once, about first's attempt. Pass taken "" when
// nothing was taken over. It is for a store's own tests, which make the
// store fail where it must undo.
func CheckUndone(t testing.TB, s store.Store, fresh []string, taken string, first store.ClaimRequest) {
	t.Helper()
	ctx := context.Background()
	for _, k := range fresh {
		rec, err := s.Get(ctx, k)
		if err != nil || rec.Status != idem.StatusReleased || rec.Fence != 1 || !rec.Journal[len(rec.Journal)-1].NotRun() {
			t.Fatalf("%s after its claim was undone: %s at fence %d, %v, journal %+v; want released at fence 1, not run", k, rec.Status, rec.Fence, err, rec.Journal)
		}
	}
	if taken != "" {
		rec, err := s.Get(ctx, taken)
		now, nerr := s.Now(ctx)
		if err != nil || nerr != nil || rec.Status != idem.StatusInProgress || rec.Fence != 2 || !rec.Lapsed(now) {
			t.Fatalf("%s after its takeover was undone: %s at fence %d, lease until %v (now %v), %v, %v; want in_progress at fence 2, lapsed",
				taken, rec.Status, rec.Fence, rec.LeaseUntil, now, err, nerr)
		}
		if last := rec.Journal[len(rec.Journal)-1]; last.Outcome != store.OutcomeAbandoned || !last.NotRun() {
			t.Fatalf("%s's undone takeover: journal entry %+v; want abandoned, not run", taken, last)
		}
	}

	l := idem.New(s, idem.WithOwner("after-the-undo"), idem.WithLogger(slog.New(slog.DiscardHandler)))
	do := func(key string, opts ...idem.CallOption) (idem.Result, []idem.Lapsed, error) {
		var asked []idem.Lapsed
		opts = append(opts, idem.WithReconcile(func(_ context.Context, lp idem.Lapsed) ([]byte, bool, error) {
			asked = append(asked, lp)
			return nil, false, nil
		}))
		res, err := l.Do(ctx, idem.RawKey(key), func(context.Context) ([]byte, error) { return []byte("ran"), nil }, opts...)
		return res, asked, err
	}
	for _, k := range fresh {
		res, asked, err := do(k, idem.WithPolicy(idem.AtMostOnce))
		if err != nil || res.Takeover || res.Fence != 2 || len(asked) != 0 {
			t.Fatalf("AtMostOnce call for %s, whose claim was undone: %+v, %v, hook asked about %+v; want fn run afresh at fence 2, no hook", k, res, err, asked)
		}
	}
	if taken == "" {
		return
	}
	res, asked, err := do(taken)
	if err != nil || !res.Takeover || res.Fence != 3 {
		t.Fatalf("call for %s, whose takeover was undone: %+v, %v; want a takeover at fence 3", taken, res, err)
	}
	if len(asked) != 1 || asked[0].Attempt != 1 || asked[0].Owner != first.Owner ||
		(first.Correlation != "" && asked[0].Correlation != first.Correlation) {
		t.Fatalf("the Reconcile hook was asked about %+v; want once, about attempt 1 (%s, %q)", asked, first.Owner, first.Correlation)
	}
}
