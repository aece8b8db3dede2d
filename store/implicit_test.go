package store

import (
	"testing"
	"time"
)

// TestImplicit: a first attempt's journal stays implicit through its
// heartbeats and its end (completed, failed, released) and ImplicitEntry
// rebuilds it exactly; an abandon, a second attempt and a takeover do not.
// (The stores' tests run random histories through their tables.)
func TestImplicit(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 123456000, time.UTC)
	req := ClaimRequest{Key: "k", Owner: "w1", Correlation: "msg-1", Policy: AtMostOnce, Lease: time.Minute, Retention: time.Hour}
	claimed, _ := ApplyClaim(nil, req, now)
	extended, _ := ApplyExtend(claimed, 1, time.Hour, now.Add(time.Second))
	check := func(name string, r *Record, want bool) {
		t.Helper()
		if got := IsImplicit(r); got != want {
			t.Fatalf("%s: IsImplicit %v, want %v (journal %+v)", name, got, want, r.Journal)
		}
		if want && ImplicitEntry(r, r.Journal[0].Correlation) != r.Journal[0] {
			t.Fatalf("%s: ImplicitEntry\n%+v\nthe journal's\n%+v", name, ImplicitEntry(r, r.Journal[0].Correlation), r.Journal[0])
		}
	}
	check("claimed", claimed, true)
	check("extended", extended, true)
	for _, end := range []Ending{
		{Status: StatusCompleted, Result: []byte("ok"), Retention: time.Hour},
		{Status: StatusFailed, Reason: "declined", Retention: time.Hour},
		{Status: StatusReleased, Reason: "later"},
	} {
		done, err := ApplyFinish(extended, 1, end, now.Add(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		check(string(end.Status), done, true)
	}
	abandoned, _ := ApplyFinish(extended, 1, Ending{Status: StatusInProgress, Reason: "crashed"}, now.Add(2*time.Second))
	check("abandoned", abandoned, false)
	released, _ := ApplyFinish(claimed, 1, Ending{Status: StatusReleased}, now.Add(time.Second))
	again, _ := ApplyClaim(released, req, now.Add(2*time.Second))
	check("claimed again", again, false)
	lapsed := *claimed
	req.TakeLapsed = true
	taken, res := ApplyClaim(&lapsed, req, now.Add(2*time.Minute))
	if !res.Takeover {
		t.Fatalf("no takeover: %+v", res)
	}
	check("taken over", taken, false)
}
