package explain

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/transition"
)

var t0 = time.Date(2025, 6, 1, 10, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func TestExplainVerdicts(t *testing.T) {
	type tc struct {
		name     string
		rec      idem.Record
		now      time.Time
		code     string
		cause    string
		attempts []int
		state    State
		answers  []string // the decision steps' answers, in order
		text     []string // substrings of the verdict's text
	}
	cases := []tc{
		{
			name: "single attempt completed",
			rec: idem.Record{Key: "receipt:1:7", Status: idem.StatusCompleted, Fence: 1, Attempt: 1,
				LeaseUntil: at(20), ExpiresAt: at(1e6), CreatedAt: at(0),
				Journal: []idem.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(20), Ended: at(20), Outcome: idem.OutcomeCompleted},
				}},
			now: at(100), code: CodeSingle, cause: CauseNoIdemDup, attempts: []int{1}, state: StateCompleted,
			answers: []string{"no"},
			text:    []string{"One attempt; no second effect could come from idem's side."},
		},
		{
			name: "single attempt lapsed at_least_once",
			rec: idem.Record{Key: "k", Status: idem.StatusInProgress, Fence: 1, Attempt: 1, Policy: idem.AtLeastOnce,
				LeaseUntil: at(300), ExpiresAt: at(1e6),
				Journal: []idem.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(300)},
				}},
			now: at(500), code: CodeSingle, cause: CauseNoIdemDup, attempts: []int{1}, state: StateLapsed,
			answers: []string{"no"},
			text:    []string{"One attempt", "the next delivery takes over and runs again"},
		},
		{
			name: "single attempt indeterminate at_most_once",
			rec: idem.Record{Key: "k", Status: idem.StatusInProgress, Fence: 1, Attempt: 1, Policy: idem.AtMostOnce,
				LeaseUntil: at(300), ExpiresAt: at(1e6),
				Journal: []idem.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(300)},
				}},
			now: at(500), code: CodeIndeterminate, cause: CauseNoIdemDup, attempts: []int{1}, state: StateIndeterminate,
			answers: []string{"no"},
			text:    []string{"waiting for `idem resolve k"},
		},
		{
			name: "single attempt running",
			rec: idem.Record{Key: "k", Status: idem.StatusInProgress, Fence: 1, Attempt: 1, Policy: idem.AtMostOnce,
				LeaseUntil: at(300), ExpiresAt: at(1e6),
				Journal: []idem.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(300)},
				}},
			now: at(100), code: CodeSingle, cause: CauseNoIdemDup, attempts: []int{1}, state: StateInProgress,
			answers: []string{"no"},
		},
		{
			name: "takeover after a crash (verdict 3)",
			rec: idem.Record{Key: "receipt:1003:7", Status: idem.StatusCompleted, Fence: 2, Attempt: 2,
				LeaseUntil: at(420), ExpiresAt: at(1e6),
				Journal: []idem.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "consumer-1", Correlation: "m3", Started: at(0), LeaseUntil: at(300), Outcome: idem.OutcomeLapsed},
					{Attempt: 2, Fence: 2, Owner: "consumer-2", Correlation: "m3", Started: at(400), LeaseUntil: at(420), Ended: at(420), Outcome: idem.OutcomeCompleted, Takeover: true},
				}},
			now: at(1000), code: CodeTakeover, cause: CauseCrash, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"no", "no", "yes"},
			text:    []string{"Send succeeded, recording failed or crashed: attempt 1 lapsed without recording an outcome and attempt 2 took over (AtLeastOnce repeats the effect; use AtMostOnce or a Reconcile hook to stop that)"},
		},
		{
			name: "takeover of an abandoned attempt by a reconciler",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 2, Attempt: 2, Policy: idem.AtMostOnce,
				LeaseUntil: at(420), ExpiresAt: at(1e6),
				Journal: []idem.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m", Started: at(0), LeaseUntil: at(50), Ended: at(50), Outcome: idem.OutcomeAbandoned, Reason: "smtp: connection reset"},
					{Attempt: 2, Fence: 2, Owner: "w2", Correlation: "m", Started: at(400), LeaseUntil: at(420), Ended: at(420), Outcome: idem.OutcomeCompleted, Takeover: true},
				}},
			now: at(1000), code: CodeTakeover, cause: CauseCrash, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"no", "no", "yes"},
			text:    []string{"attempt 1 ended without recording an outcome (smtp: connection reset) and attempt 2 took over"},
		},
		{
			name: "overlap: late finish after takeover (verdict 2)",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 2, Attempt: 2,
				LeaseUntil: at(420), ExpiresAt: at(1e6),
				Journal: []idem.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m", Started: at(0), LeaseUntil: at(300), Outcome: idem.OutcomeLapsed, LateFinish: at(600)},
					{Attempt: 2, Fence: 2, Owner: "w2", Correlation: "m", Started: at(400), LeaseUntil: at(420), Ended: at(420), Outcome: idem.OutcomeCompleted, Takeover: true},
				}},
			now: at(1000), code: CodeOverlap, cause: CauseRace, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"no", "yes"},
			text:    []string{"Concurrent attempts: attempt 1 outlived its lease (heartbeats failed or the process paused)", "lengthen the lease / fix heartbeats"},
		},
		{
			name: "overlap: ended after the later attempt started",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 2, Attempt: 2,
				LeaseUntil: at(420), ExpiresAt: at(1e6),
				Journal: []idem.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m", Started: at(0), LeaseUntil: at(500), Ended: at(500), Outcome: idem.OutcomeReleased},
					{Attempt: 2, Fence: 2, Owner: "w2", Correlation: "m", Started: at(400), LeaseUntil: at(420), Ended: at(420), Outcome: idem.OutcomeCompleted},
				}},
			now: at(1000), code: CodeOverlap, cause: CauseRace, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"no", "yes"},
		},
		{
			name: "completed record expired before the redelivery (verdict 1)",
			rec: idem.Record{Key: "booking.confirmed:b-1", Status: idem.StatusCompleted, Fence: 2, Attempt: 2,
				LeaseUntil: at(90_000_020), ExpiresAt: at(1e9),
				Journal: []idem.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(20), Ended: at(20), Outcome: idem.OutcomeCompleted},
					{Attempt: 2, Fence: 2, Owner: "w2", Correlation: "m2", Started: at(90_000_000), LeaseUntil: at(90_000_020), Ended: at(90_000_020), Outcome: idem.OutcomeCompleted, AfterExpiry: true},
				}},
			now: at(90_000_100), code: CodeExpiredRerun, cause: CauseLifetime, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"yes"},
			text:    []string{"Check the job key, table and record lifetime: the completed record expired (retention) before the redelivery", "raise retention to cover the sender's retry horizon"},
		},
		{
			name: "operator released a completed key",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 3, Attempt: 2,
				LeaseUntil: at(520), ExpiresAt: at(1e6),
				Journal: []idem.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(20), Ended: at(20), Outcome: idem.OutcomeCompleted},
					{Attempt: 1, Fence: 2, Owner: "alice", Started: at(100), LeaseUntil: at(100), Ended: at(100), Outcome: idem.OutcomeResolvedNotDone, Reason: "resend requested"},
					{Attempt: 2, Fence: 3, Owner: "w2", Correlation: "m2", Started: at(500), LeaseUntil: at(520), Ended: at(520), Outcome: idem.OutcomeCompleted},
				}},
			now: at(1000), code: CodeReleasedRerun, cause: CauseLifetime, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"yes"},
			text:    []string{"an operator (alice) released the completed key", "(resend requested)"},
		},
		{
			name: "error after the effect under at_least_once",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 2, Attempt: 2, Policy: idem.AtLeastOnce,
				LeaseUntil: at(220), ExpiresAt: at(1e6),
				Journal: []idem.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(30), Ended: at(30), Outcome: idem.OutcomeReleased, Reason: "writing the audit row: timeout"},
					{Attempt: 2, Fence: 2, Owner: "w1", Correlation: "m1", Started: at(200), LeaseUntil: at(220), Ended: at(220), Outcome: idem.OutcomeCompleted},
				}},
			now: at(1000), code: CodeRetriedAfterError, cause: CauseCrash, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"no", "no", "yes"},
			text:    []string{"attempt 1 returned an error (writing the audit row: timeout)", "attempt 2 ran again"},
		},
		{
			name: "NotDone release under at_most_once",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 2, Attempt: 2, Policy: idem.AtMostOnce,
				LeaseUntil: at(220), ExpiresAt: at(1e6),
				Journal: []idem.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(30), Ended: at(30), Outcome: idem.OutcomeReleased, Reason: "dial tcp: connection refused"},
					{Attempt: 2, Fence: 2, Owner: "w1", Correlation: "m1", Started: at(200), LeaseUntil: at(220), Ended: at(220), Outcome: idem.OutcomeCompleted},
				}},
			now: at(1000), code: CodeNoDuplicate, cause: CauseNoIdemDup, attempts: []int{2}, state: StateCompleted,
			answers: []string{"no", "no", "no"},
			text:    []string{"2 attempts, but no second effect could come from idem's side"},
		},
		{
			name: "resolved not done, then indeterminate again",
			rec: idem.Record{Key: "k", Status: idem.StatusInProgress, Fence: 3, Attempt: 2, Policy: idem.AtMostOnce,
				LeaseUntil: at(900), ExpiresAt: at(1e6),
				Journal: []idem.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(400), Ended: at(400), Outcome: idem.OutcomeResolvedNotDone, Reason: "not in provider log"},
					{Attempt: 2, Fence: 3, Owner: "w2", Correlation: "m1", Started: at(600), LeaseUntil: at(900)},
				}},
			now: at(1000), code: CodeIndeterminate, cause: CauseNoIdemDup, attempts: []int{2}, state: StateIndeterminate,
			answers: []string{"no", "no", "no"},
			text:    []string{"attempt 2 lapsed", "waiting for `idem resolve k"},
		},
		{
			name: "attempt resolved as done by an operator",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 2, Attempt: 1, Policy: idem.AtMostOnce,
				LeaseUntil: at(700), ExpiresAt: at(1e6),
				Journal: []idem.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(300), Ended: at(700), Outcome: idem.OutcomeResolvedDone, Reason: "provider shows it sent"},
				}},
			now: at(1000), code: CodeSingle, cause: CauseNoIdemDup, attempts: []int{1}, state: StateCompleted,
			answers: []string{"no"},
		},
		{
			name: "empty journal",
			rec:  idem.Record{Key: "k", Status: idem.StatusReleased, Fence: 1, Attempt: 1, ExpiresAt: at(1e6)},
			now:  at(1000), code: CodeNoJournal, cause: CauseNoIdemDup, state: StateReleased,
			answers: []string{"no"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := Explain(c.rec, c.now)
			if x.Verdict.Code != c.code || x.Verdict.Cause != c.cause {
				t.Errorf("verdict = %s (%s), want %s (%s): %s", x.Verdict.Code, x.Verdict.Cause, c.code, c.cause, x.Verdict.Text)
			}
			if !slices.Equal(x.Verdict.Attempts, c.attempts) {
				t.Errorf("verdict attempts = %v, want %v", x.Verdict.Attempts, c.attempts)
			}
			if x.State != c.state {
				t.Errorf("state = %s, want %s", x.State, c.state)
			}
			var answers []string
			for _, s := range x.Steps {
				answers = append(answers, s.Answer)
			}
			if !slices.Equal(answers, c.answers) {
				t.Errorf("answers = %v, want %v (steps %+v)", answers, c.answers, x.Steps)
			}
			for _, s := range c.text {
				if !strings.Contains(x.Verdict.Text, s) {
					t.Errorf("verdict text %q does not contain %q", x.Verdict.Text, s)
				}
			}
			var buf bytes.Buffer
			if err := Write(&buf, x, ""); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(buf.String(), "Verdict: ") || !strings.Contains(buf.String(), c.rec.Key) {
				t.Errorf("rendered explanation lacks the verdict or key:\n%s", buf.String())
			}
			if _, err := json.Marshal(x); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestStoryOrderAndWording(t *testing.T) {
	rec := idem.Record{Key: "receipt:1003:7", Status: idem.StatusCompleted, Fence: 2, Attempt: 2,
		LeaseUntil: at(420), ExpiresAt: at(1e6),
		Journal: []idem.JournalEntry{
			{Attempt: 1, Fence: 1, Owner: "consumer-1", Correlation: "m3", Started: at(0), LeaseUntil: at(300), Outcome: idem.OutcomeLapsed, LateFinish: at(450)},
			{Attempt: 2, Fence: 2, Owner: "consumer-2", Correlation: "m3-b", Started: at(400), LeaseUntil: at(420), Ended: at(420), Outcome: idem.OutcomeCompleted, Takeover: true},
		}}
	x := Explain(rec, at(1000))
	var kinds []string
	for _, e := range x.Story {
		kinds = append(kinds, e.Kind)
	}
	want := []string{"claim", "lapse", "claim", "end", "late-finish"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("story kinds = %v, want %v", kinds, want)
	}
	for i, s := range []string{
		"attempt 1 (fence 1) claimed by consumer-1, correlation m3",
		"ran out with no outcome recorded",
		"taking over lapsed attempt 1",
		"attempt 2 completed after 20ms",
		"after attempt 2 took over and was refused",
	} {
		if !strings.Contains(x.Story[i].Text, s) {
			t.Errorf("story[%d] = %q, want it to contain %q", i, x.Story[i].Text, s)
		}
	}
	var buf bytes.Buffer
	if err := Write(&buf, x, "  "); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "  Story (UTC, 2025-06-01):\n    10:00:00.000  attempt 1") {
		t.Errorf("unexpected rendering:\n%s", buf.String())
	}
}

// TestJournalsFromTransitions builds journals with the same state machine the
// stores use, so the explanation keeps reading what stores really write.
func TestJournalsFromTransitions(t *testing.T) {
	const lease, retention = 300 * time.Millisecond, time.Hour
	claim := func(rec *idem.Record, p idem.Policy, owner string, now time.Time) (*idem.Record, int64) {
		t.Helper()
		next, res := transition.Claim(rec, idem.ClaimRequest{Key: "k", Owner: owner, Correlation: "msg-" + owner, Policy: p, Lease: lease, Retention: retention}, now)
		if !res.Acquired {
			t.Fatalf("claim by %s at %v not acquired: %+v", owner, now, res.Record)
		}
		return next, res.Record.Fence
	}
	finish := func(rec *idem.Record, fence int64, end transition.Ending, now time.Time) *idem.Record {
		t.Helper()
		next, err := transition.Finish(rec, fence, end, now)
		if err != nil && next == nil {
			t.Fatalf("finish fence %d: %v", fence, err)
		}
		if next == nil {
			return rec
		}
		return next
	}
	done := transition.Ending{Status: idem.StatusCompleted, Result: []byte("ok"), Retention: retention}

	t.Run("crash then takeover", func(t *testing.T) {
		r, _ := claim(nil, idem.AtLeastOnce, "a", at(0))
		r, f2 := claim(r, idem.AtLeastOnce, "b", at(400))
		r = finish(r, f2, done, at(420))
		if x := Explain(*r, at(500)); x.Verdict.Code != CodeTakeover {
			t.Fatalf("verdict %s: %s", x.Verdict.Code, x.Verdict.Text)
		}
	})
	t.Run("crash, takeover, late finish", func(t *testing.T) {
		r, f1 := claim(nil, idem.AtLeastOnce, "a", at(0))
		r, f2 := claim(r, idem.AtLeastOnce, "b", at(400))
		r = finish(r, f1, done, at(450)) // refused, annotated
		r = finish(r, f2, done, at(460))
		if x := Explain(*r, at(500)); x.Verdict.Code != CodeOverlap {
			t.Fatalf("verdict %s: %s", x.Verdict.Code, x.Verdict.Text)
		}
	})
	t.Run("expired then re-run", func(t *testing.T) {
		r, f1 := claim(nil, idem.AtLeastOnce, "a", at(0))
		r = finish(r, f1, done, at(20))
		r, f2 := claim(r, idem.AtLeastOnce, "b", at(20).Add(retention+time.Second))
		r = finish(r, f2, done, at(40).Add(retention+time.Second))
		if x := Explain(*r, at(50).Add(retention+time.Second)); x.Verdict.Code != CodeExpiredRerun {
			t.Fatalf("verdict %s: %s", x.Verdict.Code, x.Verdict.Text)
		}
	})
	t.Run("operator released a completed key", func(t *testing.T) {
		r, f1 := claim(nil, idem.AtLeastOnce, "a", at(0))
		r = finish(r, f1, done, at(20))
		r, err := transition.Resolve(r, 0, idem.Resolution{Reason: "resend", By: "alice"}, at(100))
		if err != nil {
			t.Fatal(err)
		}
		r, f3 := claim(r, idem.AtLeastOnce, "b", at(200))
		r = finish(r, f3, done, at(220))
		x := Explain(*r, at(300))
		if x.Verdict.Code != CodeReleasedRerun || x.Attempts != 2 {
			t.Fatalf("verdict %s, %d attempts: %s", x.Verdict.Code, x.Attempts, x.Verdict.Text)
		}
	})
	t.Run("at_most_once crash resolved", func(t *testing.T) {
		r, _ := claim(nil, idem.AtMostOnce, "a", at(0))
		if x := Explain(*r, at(500)); x.Verdict.Code != CodeIndeterminate || x.State != StateIndeterminate {
			t.Fatalf("verdict %s, state %s", x.Verdict.Code, x.State)
		}
		r, err := transition.Resolve(r, r.Fence, idem.Resolution{Done: true, Result: []byte("id"), Reason: "sent per provider", Retention: retention, By: "bob"}, at(600))
		if err != nil {
			t.Fatal(err)
		}
		x := Explain(*r, at(700))
		if x.Verdict.Code != CodeSingle || x.State != StateCompleted || x.Attempts != 1 {
			t.Fatalf("verdict %s, state %s, %d attempts", x.Verdict.Code, x.State, x.Attempts)
		}
		var kinds []string
		for _, e := range x.Story {
			kinds = append(kinds, e.Kind)
		}
		if !slices.Equal(kinds, []string{"claim", "lapse", "resolve"}) || !strings.Contains(x.Story[2].Text, "resolved as done (sent per provider)") {
			t.Errorf("story: %+v", x.Story)
		}
	})
}

func TestDur(t *testing.T) {
	for d, want := range map[time.Duration]string{
		20 * time.Millisecond:                 "20ms",
		1500 * time.Millisecond:               "1.5s",
		90 * time.Minute:                      "1h30m",
		36 * time.Hour:                        "1d12h",
		time.Hour:                             "1h",
		59*time.Minute + 2*time.Second:        "59m2s",
		time.Minute:                           "1m",
		7 * 24 * time.Hour:                    "7d",
		7*24*time.Hour + 5*time.Hour:          "7d5h",
		-300 * time.Millisecond:               "-300ms",
		3*24*time.Hour + 90*time.Minute + 1:   "3d2h",
		7*24*time.Hour - 500*time.Millisecond: "7d",
	} {
		if got := Dur(d); got != want {
			t.Errorf("Dur(%v) = %q, want %q", d, got, want)
		}
	}
}
