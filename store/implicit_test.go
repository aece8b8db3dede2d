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
	req := ClaimRequest{Key: "k", AttemptID: "a1", Owner: "w1", Correlation: "msg-1", Policy: AtMostOnce, Lease: time.Minute, Retention: time.Hour}
	claimed, _ := ApplyClaim(nil, req, now, 0)
	fence := claimed.Fence
	extended, _ := ApplyExtend(claimed, ExtendRequest{Key: "k", Fence: fence, AttemptID: "a1", Lease: time.Hour}, now.Add(time.Second))
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
	end := func(o Outcome, result []byte, reason string) FinishRequest {
		return FinishRequest{Key: "k", Fence: fence, AttemptID: "a1", Outcome: o, Result: result, Reason: reason, Retention: time.Hour}
	}
	for _, end := range []FinishRequest{
		end(OutcomeCompleted, []byte("ok"), ""),
		end(OutcomeFailed, nil, "declined"),
		end(OutcomeReleased, nil, "later"),
	} {
		done, err := ApplyFinish(extended, end, now.Add(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		check(string(end.Outcome), done, true)
	}
	abandoned, _ := ApplyFinish(extended, end(OutcomeAbandoned, nil, "crashed"), now.Add(2*time.Second))
	check("abandoned", abandoned, false)
	released, _ := ApplyFinish(claimed, end(OutcomeReleased, nil, ""), now.Add(time.Second))
	req.AttemptID = "a2"
	again, _ := ApplyClaim(released, req, now.Add(2*time.Second), 0)
	check("claimed again", again, false)
	lapsed := *claimed
	req.TakeLapsed = true
	taken, res := ApplyClaim(&lapsed, req, now.Add(2*time.Minute), 0)
	if !res.Takeover {
		t.Fatalf("no takeover: %+v", res)
	}
	check("taken over", taken, false)
}
