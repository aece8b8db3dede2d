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
// undone claims claimed afresh, is released as not run, its one attempt's
// fence and attempt id kept; taken, which they took over from first's
// lapsed attempt, is in progress at that attempt's fence + 1, lapsed at
// once, without an attempt id, and abandoned as not run. Then, at once, a
// Ledger call on each fresh key runs afresh at the released fence + 1
// under AtMostOnce without asking its Reconcile hook, and one on taken
// takes over at the abandoned fence + 1, asking the hook once, about
// first's attempt (attempt 1: its fence, Owner and Correlation). Pass
// taken "" when nothing was taken over. It is for a store's own tests,
// which make the store fail where it must undo.
func CheckUndone(t testing.TB, s store.Store, fresh []string, taken string, first store.ClaimRequest) {
	t.Helper()
	ctx := context.Background()
	released := make(map[string]int64, len(fresh)) // key -> its undone claim's fence
	for _, k := range fresh {
		rec, err := s.Get(ctx, k)
		if err != nil {
			t.Fatalf("%s after its claim was undone: %v; want released, not run", k, err)
		}
		if rec.Status != idem.StatusReleased || rec.Attempt != 1 || rec.AttemptID == "" || len(rec.Journal) != 1 ||
			rec.Journal[0].Fence != rec.Fence || rec.Journal[0].AttemptID != rec.AttemptID || !rec.Journal[0].NotRun() {
			t.Fatalf("%s after its claim was undone: %s at fence %d, attempt %d, attempt id %q, journal %+v; want released, its one attempt (at the record's fence, with its attempt id) not run",
				k, rec.Status, rec.Fence, rec.Attempt, rec.AttemptID, rec.Journal)
		}
		released[k] = rec.Fence
	}
	var undone, lapsed store.JournalEntry // taken's undone takeover, and first's attempt before it
	if taken != "" {
		rec, err := s.Get(ctx, taken)
		now, nerr := s.Now(ctx)
		if err != nil || nerr != nil {
			t.Fatalf("%s after its takeover was undone: Get: %v, Now: %v", taken, err, nerr)
		}
		n := len(rec.Journal)
		if n < 2 {
			t.Fatalf("%s after its takeover was undone: journal %+v; want first's attempt and the undone takeover", taken, rec.Journal)
		}
		lapsed, undone = rec.Journal[n-2], rec.Journal[n-1]
		if lapsed.Attempt != 1 || lapsed.Owner != first.Owner {
			t.Fatalf("%s's journal entry before the undone takeover: %+v; want first's attempt 1 (owner %s)", taken, lapsed, first.Owner)
		}
		if rec.Status != idem.StatusInProgress || rec.Fence != lapsed.Fence+1 || rec.Attempt != 2 || rec.AttemptID != "" || !rec.Lapsed(now) {
			t.Fatalf("%s after its takeover was undone: %s at fence %d, attempt %d, attempt id %q, lease until %v (now %v); want in_progress at fence %d (first's + 1), attempt 2, no attempt id, lapsed",
				taken, rec.Status, rec.Fence, rec.Attempt, rec.AttemptID, rec.LeaseUntil, now, lapsed.Fence+1)
		}
		if undone.Fence != rec.Fence || !undone.Takeover || undone.AttemptID == "" || undone.Outcome != store.OutcomeAbandoned || !undone.NotRun() {
			t.Fatalf("%s's undone takeover: journal entry %+v; want at fence %d, a takeover with its attempt id, abandoned, not run", taken, undone, rec.Fence)
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
		if err != nil || res.Takeover || res.Fence != released[k]+1 || len(asked) != 0 {
			t.Fatalf("AtMostOnce call for %s, whose claim was undone: %+v, %v, hook asked about %+v; want fn run afresh at fence %d (the released one's + 1), no hook",
				k, res, err, asked, released[k]+1)
		}
	}
	if taken == "" {
		return
	}
	res, asked, err := do(taken)
	if err != nil || !res.Takeover || res.Fence != undone.Fence+1 {
		t.Fatalf("call for %s, whose takeover was undone: %+v, %v; want a takeover at fence %d (the abandoned one's + 1)", taken, res, err, undone.Fence+1)
	}
	if len(asked) != 1 || asked[0].Attempt != 1 || asked[0].Fence != lapsed.Fence || asked[0].Owner != first.Owner ||
		(first.Correlation != "" && asked[0].Correlation != first.Correlation) {
		t.Fatalf("the Reconcile hook was asked about %+v; want once, about attempt 1 (fence %d, %s, %q)", asked, lapsed.Fence, first.Owner, first.Correlation)
	}
}
