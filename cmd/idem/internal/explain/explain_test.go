package explain

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
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
		notText  []string // not in the verdict's text
		story    []string // substrings of the story's events, in order
	}
	cases := []tc{
		{
			name: "single attempt completed",
			rec: idem.Record{Key: "receipt:1:7", Status: idem.StatusCompleted, Fence: 1, Attempt: 1,
				LeaseUntil: at(20), ExpiresAt: at(1e6), CreatedAt: at(0),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(20), Ended: at(20), Outcome: store.OutcomeCompleted},
				}},
			now: at(100), code: CodeSingle, cause: CauseNoIdemDup, attempts: []int{1}, state: StateCompleted,
			answers: []string{"no"},
			text:    []string{"One attempt; no second effect could come from idem's side."},
		},
		{
			name: "single attempt lapsed at_least_once",
			rec: idem.Record{Key: "k", Status: idem.StatusInProgress, Fence: 1, Attempt: 1, Policy: idem.AtLeastOnce,
				LeaseUntil: at(300), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
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
				Journal: []store.JournalEntry{
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
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(300)},
				}},
			now: at(100), code: CodeSingle, cause: CauseNoIdemDup, attempts: []int{1}, state: StateInProgress,
			answers: []string{"no"},
		},
		{
			name: "takeover after a crash (verdict 3)",
			rec: idem.Record{Key: "receipt:1003:7", Status: idem.StatusCompleted, Fence: 2, Attempt: 2,
				LeaseUntil: at(420), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "consumer-1", Correlation: "m3", Started: at(0), LeaseUntil: at(300), Outcome: store.OutcomeLapsed},
					{Attempt: 2, Fence: 2, Owner: "consumer-2", Correlation: "m3", Started: at(400), LeaseUntil: at(420), Ended: at(420), Outcome: store.OutcomeCompleted, Takeover: true},
				}},
			now: at(1000), code: CodeTakeover, cause: CauseCrash, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"no", "no", "yes"},
			text:    []string{"Send succeeded, recording failed or crashed: attempt 1 lapsed without recording an outcome and attempt 2 took over (AtLeastOnce repeats the effect; use AtMostOnce or a Reconcile hook to stop that)"},
		},
		{
			name: "at_most_once takeover by a Reconcile hook that did not find the effect",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 2, Attempt: 2, Policy: idem.AtMostOnce,
				LeaseUntil: at(420), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m", Policy: "at_most_once", Started: at(0), LeaseUntil: at(50), Ended: at(50), Outcome: store.OutcomeAbandoned, Reason: "smtp: connection reset"},
					{Attempt: 2, Fence: 2, Owner: "w2", Correlation: "m", Policy: "at_most_once", Started: at(400), LeaseUntil: at(420), Ended: at(420), Outcome: store.OutcomeCompleted, Takeover: true},
				}},
			now: at(1000), code: CodeTakeover, cause: CauseCrash, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"no", "no", "yes"},
			text:    []string{"attempt 1 ended without recording an outcome (smtp: connection reset) under at_most_once, and attempt 2 took over with a Reconcile hook", "did not find attempt 1's effect done"},
			notText: []string{"AtLeastOnce repeats"},
		},
		{
			name: "takeover of an at_least_once attempt under a record now at_most_once",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 2, Attempt: 2, Policy: idem.AtMostOnce,
				LeaseUntil: at(420), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m", Policy: "at_least_once", Started: at(0), LeaseUntil: at(300), Outcome: store.OutcomeLapsed},
					{Attempt: 2, Fence: 2, Owner: "w2", Correlation: "m", Policy: "at_most_once", Started: at(400), LeaseUntil: at(420), Ended: at(420), Outcome: store.OutcomeCompleted, Takeover: true},
				}},
			now: at(1000), code: CodeTakeover, cause: CauseCrash, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"no", "no", "yes"},
			text:    []string{"AtLeastOnce repeats the effect"},
			story:   []string{"claimed by w1 under at_least_once", "lease ran out", "claimed by w2 under at_most_once, correlation m, taking over lapsed attempt 1", "attempt 2 completed"},
		},
		{
			name: "reconciled takeover: the hook found the effect done",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 3, Attempt: 2, Policy: idem.AtMostOnce,
				LeaseUntil: at(410), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m", Policy: "at_most_once", Started: at(0), LeaseUntil: at(300), Outcome: store.OutcomeLapsed},
					{Attempt: 2, Fence: 2, Owner: "w2", Correlation: "m", Policy: "at_most_once", Started: at(400), LeaseUntil: at(410), Ended: at(410), Outcome: store.OutcomeResolvedDone, Takeover: true,
						Reason: "reconciled: the lapsed attempt's effect was found done", ResolvedBy: "w2 (reconcile)"},
				}},
			now: at(1000), code: CodeReconciled, cause: CauseNoIdemDup, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"no", "no", "no"},
			text:    []string{"attempt 2 took over, its Reconcile hook found attempt 1's effect done, nothing was repeated"},
			notText: []string{"twice", "repeats", "Send succeeded"},
			story: []string{"attempt 1 (fence 1) claimed", "lease ran out", "taking over lapsed attempt 1",
				"attempt 2 took over, its Reconcile hook found attempt 1's effect done, nothing was repeated: completed with the hook's result (recorded by w2 (reconcile))"},
		},
		{
			name: "reconciled takeover while the lapsed attempt still ran (refused heartbeat)",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 3, Attempt: 2, Policy: idem.AtLeastOnce,
				LeaseUntil: at(410), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m", Started: at(0), LeaseUntil: at(300), Outcome: store.OutcomeLapsed, LateFinish: at(500)},
					{Attempt: 2, Fence: 2, Owner: "w2", Correlation: "m", Started: at(400), LeaseUntil: at(410), Ended: at(410), Outcome: store.OutcomeResolvedDone, Takeover: true,
						Reason: "reconciled: the lapsed attempt's effect was found done"},
				}},
			now: at(1000), code: CodeReconciled, cause: CauseNoIdemDup, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"no", "no", "no"},
			text:    []string{"nothing was repeated"},
			story:   []string{"claimed", "lease ran out", "taking over", "Reconcile hook found attempt 1's effect done", "attempt 1 was still running at 2025-06-01 10:00:00.500Z (tried to extend its lease or record an outcome) after attempt 2 took over"},
		},
		{
			name: "reconciled takeover of an attempt the journal no longer holds",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 18, Attempt: 17, Policy: idem.AtLeastOnce,
				LeaseUntil: at(410), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 17, Fence: 17, Owner: "w2", Started: at(400), LeaseUntil: at(410), Ended: at(410), Outcome: store.OutcomeResolvedDone, Takeover: true,
						Reason: "reconciled: the lapsed attempt's effect was found done", ResolvedBy: "w2 (reconcile)"},
				}},
			now: at(1000), code: CodeSingle, cause: CauseNoIdemDup, attempts: []int{17}, state: StateCompleted,
			answers: []string{"no"},
			story:   []string{"attempt 17 (fence 17) claimed by w2, taking over a lapsed attempt", "attempt 17 took over, its Reconcile hook found the lapsed attempt's effect done, nothing was repeated"},
		},
		{
			name: "a refused heartbeat after a takeover is an overlap",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 2, Attempt: 2, Policy: idem.AtLeastOnce,
				LeaseUntil: at(900), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m", Policy: "at_least_once", Started: at(0), LeaseUntil: at(300), Outcome: store.OutcomeLapsed, LateFinish: at(450)},
					{Attempt: 2, Fence: 2, Owner: "w2", Correlation: "m", Policy: "at_least_once", Started: at(400), LeaseUntil: at(900), Ended: at(900), Outcome: store.OutcomeCompleted, Takeover: true},
				}},
			now: at(1000), code: CodeOverlap, cause: CauseRace, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"no", "yes"},
			story:   []string{"claimed", "lease ran out", "taking over", "attempt 1 was still running at 2025-06-01 10:00:00.450Z (tried to extend its lease or record an outcome) after attempt 2 took over; the store refused it (lease lost)", "attempt 2 completed"},
		},
		{
			name: "overlap: late finish after takeover (verdict 2)",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 2, Attempt: 2,
				LeaseUntil: at(420), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m", Started: at(0), LeaseUntil: at(300), Outcome: store.OutcomeLapsed, LateFinish: at(600)},
					{Attempt: 2, Fence: 2, Owner: "w2", Correlation: "m", Started: at(400), LeaseUntil: at(420), Ended: at(420), Outcome: store.OutcomeCompleted, Takeover: true},
				}},
			now: at(1000), code: CodeOverlap, cause: CauseRace, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"no", "yes"},
			text:    []string{"Concurrent attempts: attempt 1 outlived its lease (heartbeats failed or the process paused)", "lengthen the lease / fix heartbeats"},
		},
		{
			name: "overlap: ended after the later attempt started",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 2, Attempt: 2,
				LeaseUntil: at(420), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m", Started: at(0), LeaseUntil: at(500), Ended: at(500), Outcome: store.OutcomeReleased},
					{Attempt: 2, Fence: 2, Owner: "w2", Correlation: "m", Started: at(400), LeaseUntil: at(420), Ended: at(420), Outcome: store.OutcomeCompleted},
				}},
			now: at(1000), code: CodeOverlap, cause: CauseRace, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"no", "yes"},
		},
		{
			name: "completed record expired before the redelivery (verdict 1)",
			rec: idem.Record{Key: "booking.confirmed:b-1", Status: idem.StatusCompleted, Fence: 2, Attempt: 2,
				LeaseUntil: at(90_000_020), ExpiresAt: at(1e9),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(20), Ended: at(20), Outcome: store.OutcomeCompleted},
					{Attempt: 2, Fence: 2, Owner: "w2", Correlation: "m2", Started: at(90_000_000), LeaseUntil: at(90_000_020), Ended: at(90_000_020), Outcome: store.OutcomeCompleted, AfterExpiry: true},
				}},
			now: at(90_000_100), code: CodeExpiredRerun, cause: CauseLifetime, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"yes"},
			text:    []string{"Check the job key, table and record lifetime: the completed record expired (retention) before the redelivery", "raise retention to cover the sender's retry horizon"},
		},
		{
			name: "operator released a completed key",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 3, Attempt: 2,
				LeaseUntil: at(520), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(20), Ended: at(20), Outcome: store.OutcomeCompleted},
					{Attempt: 1, Fence: 2, Owner: "alice", Started: at(100), LeaseUntil: at(100), Ended: at(100), Outcome: store.OutcomeResolvedNotDone, Reason: "resend requested", ResolvedBy: "alice", Decision: true},
					{Attempt: 2, Fence: 3, Owner: "w2", Correlation: "m2", Started: at(500), LeaseUntil: at(520), Ended: at(520), Outcome: store.OutcomeCompleted},
				}},
			now: at(1000), code: CodeReleasedRerun, cause: CauseLifetime, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"yes"},
			text:    []string{"an operator (alice) released the completed key", "(resend requested)"},
			story:   []string{"attempt 1 (fence 1) claimed", "attempt 1 completed", "resolved as not done by alice (resend requested)", "attempt 2 (fence 3) claimed", "attempt 2 completed"},
		},
		{
			name: "only the Decision field makes a decision",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 2, Attempt: 2, Policy: idem.AtMostOnce,
				LeaseUntil: at(700), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Policy: "at_most_once", Started: at(0), LeaseUntil: at(300), Outcome: store.OutcomeLapsed},
					// An attempt claimed without a correlation id, resolved
					// by an operator at once: the shape the old guess took
					// for a decision.
					{Attempt: 2, Fence: 2, Owner: "w2", Policy: "at_most_once", Started: at(700), LeaseUntil: at(700), Ended: at(700), Outcome: store.OutcomeResolvedDone, Takeover: true, ResolvedBy: "bob", Reason: "provider shows it sent"},
				}},
			now: at(1000), code: CodeTakeover, cause: CauseCrash, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"no", "no", "yes"},
			story:   []string{"attempt 1 (fence 1) claimed", "lease ran out", "attempt 2 (fence 2) claimed by w2 under at_most_once, taking over lapsed attempt 1", "attempt 2 was resolved as done by bob (provider shows it sent)"},
		},
		{
			name: "error after the effect under at_least_once",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 2, Attempt: 2, Policy: idem.AtLeastOnce,
				LeaseUntil: at(220), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(30), Ended: at(30), Outcome: store.OutcomeReleased, Reason: "writing the audit row: timeout"},
					{Attempt: 2, Fence: 2, Owner: "w1", Correlation: "m1", Started: at(200), LeaseUntil: at(220), Ended: at(220), Outcome: store.OutcomeCompleted},
				}},
			now: at(1000), code: CodeRetriedAfterError, cause: CauseCrash, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"no", "no", "yes"},
			text:    []string{"attempt 1 returned an error (writing the audit row: timeout)", "attempt 2 ran again"},
		},
		{
			name: "NotDone release under at_most_once (the record's policy)",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 2, Attempt: 2, Policy: idem.AtMostOnce,
				LeaseUntil: at(220), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(30), Ended: at(30), Outcome: store.OutcomeReleased, Reason: "dial tcp: connection refused"},
					{Attempt: 2, Fence: 2, Owner: "w1", Correlation: "m1", Started: at(200), LeaseUntil: at(220), Ended: at(220), Outcome: store.OutcomeCompleted},
				}},
			now: at(1000), code: CodeNoDuplicate, cause: CauseNoIdemDup, attempts: []int{2}, state: StateCompleted,
			answers: []string{"no", "no", "no"},
			text:    []string{"2 attempts, but no second effect could come from idem's side"},
		},
		{
			name: "NotDone release under at_most_once, record now at_least_once",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 2, Attempt: 2, Policy: idem.AtLeastOnce,
				LeaseUntil: at(220), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Policy: "at_most_once", Started: at(0), LeaseUntil: at(30), Ended: at(30), Outcome: store.OutcomeReleased, Reason: "dial tcp: connection refused"},
					{Attempt: 2, Fence: 2, Owner: "w1", Correlation: "m1", Policy: "at_least_once", Started: at(200), LeaseUntil: at(220), Ended: at(220), Outcome: store.OutcomeCompleted},
				}},
			now: at(1000), code: CodeNoDuplicate, cause: CauseNoIdemDup, attempts: []int{2}, state: StateCompleted,
			answers: []string{"no", "no", "no"},
			story:   []string{"claimed by w1 under at_most_once", "attempt 1 returned idem.NotDone after 30ms (dial tcp: connection refused): under at_most_once that says its effect did not happen", "claimed by w1 under at_least_once", "attempt 2 completed"},
		},
		{
			name: "error retry under at_least_once, record now at_most_once",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 2, Attempt: 2, Policy: idem.AtMostOnce,
				LeaseUntil: at(220), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Policy: "at_least_once", Started: at(0), LeaseUntil: at(30), Ended: at(30), Outcome: store.OutcomeReleased, Reason: "writing the audit row: timeout"},
					{Attempt: 2, Fence: 2, Owner: "w1", Correlation: "m1", Policy: "at_most_once", Started: at(200), LeaseUntil: at(220), Ended: at(220), Outcome: store.OutcomeCompleted},
				}},
			now: at(1000), code: CodeRetriedAfterError, cause: CauseCrash, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"no", "no", "yes"},
			text:    []string{"attempt 1 returned an error (writing the audit row: timeout), which under AtLeastOnce releases the key"},
			story:   []string{"claimed", "attempt 1 returned an error after 30ms and released the key for a retry (writing the audit row: timeout)", "claimed", "attempt 2 completed"},
		},
		{
			name: "resolved not done, then indeterminate again",
			rec: idem.Record{Key: "k", Status: idem.StatusInProgress, Fence: 3, Attempt: 2, Policy: idem.AtMostOnce,
				LeaseUntil: at(900), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(400), Ended: at(400), Outcome: store.OutcomeResolvedNotDone, Reason: "not in provider log"},
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
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(300), Ended: at(700), Outcome: store.OutcomeResolvedDone, Reason: "provider shows it sent"},
				}},
			now: at(1000), code: CodeSingle, cause: CauseNoIdemDup, attempts: []int{1}, state: StateCompleted,
			answers: []string{"no"},
		},
		{
			name: "orphaned claim of a fresh key, then a run",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 2, Attempt: 2, Policy: idem.AtLeastOnce,
				LeaseUntil: at(220), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Policy: "at_least_once", Started: at(0), LeaseUntil: at(5), Ended: at(5), Outcome: store.OutcomeReleased,
						Reason: store.NotRunReason("the caller left before its claim was answered")},
					{Attempt: 2, Fence: 2, Owner: "w1", Correlation: "m2", Policy: "at_least_once", Started: at(200), LeaseUntil: at(220), Ended: at(220), Outcome: store.OutcomeCompleted},
				}},
			now: at(1000), code: CodeNoDuplicate, cause: CauseNoIdemDup, attempts: []int{2}, state: StateCompleted,
			answers: []string{"no", "no", "no"},
			text:    []string{"attempt 1 did not run"},
			notText: []string{"returned an error", "twice"},
			story: []string{"attempt 1 (fence 1) claimed",
				"attempt 1 did not run: the caller left before its claim was answered; no effect came from it, and it released the key",
				"attempt 2 (fence 2) claimed", "attempt 2 completed"},
		},
		{
			name: "orphaned takeover, then a takeover",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 3, Attempt: 3, Policy: idem.AtLeastOnce,
				LeaseUntil: at(720), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Policy: "at_least_once", Started: at(0), LeaseUntil: at(300), Outcome: store.OutcomeLapsed},
					{Attempt: 2, Fence: 2, Owner: "w2", Correlation: "m1", Policy: "at_least_once", Started: at(400), LeaseUntil: at(405), Ended: at(405), Outcome: store.OutcomeAbandoned, Takeover: true,
						Reason: store.NotRunReason("the caller left before its claim was answered")},
					{Attempt: 3, Fence: 3, Owner: "w3", Correlation: "m1", Policy: "at_least_once", Started: at(700), LeaseUntil: at(720), Ended: at(720), Outcome: store.OutcomeCompleted, Takeover: true},
				}},
			now: at(1000), code: CodeTakeover, cause: CauseCrash, attempts: []int{1, 3}, state: StateCompleted,
			answers: []string{"no", "no", "yes"},
			text:    []string{"attempt 1 lapsed without recording an outcome and attempt 3 took over"},
			notText: []string{"attempt 2"},
			story: []string{"attempt 1 (fence 1) claimed", "attempt 1's lease ran out",
				"attempt 2 (fence 2) claimed by w2 under at_least_once, correlation m1, taking over lapsed attempt 1",
				"attempt 2 did not run: the caller left before its claim was answered; no effect came from it, and it left the key lapsed",
				"attempt 3 (fence 3) claimed by w3 under at_least_once, correlation m1, taking over lapsed attempt 1 (attempt 2 after it did not run)",
				"attempt 3 completed"},
		},
		{
			name: "two attempts that did not run between a lapse and a takeover",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 4, Attempt: 4, Policy: idem.AtLeastOnce,
				LeaseUntil: at(920), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Started: at(0), LeaseUntil: at(300), Outcome: store.OutcomeLapsed},
					{Attempt: 2, Fence: 2, Owner: "w2", Started: at(400), LeaseUntil: at(405), Ended: at(405), Outcome: store.OutcomeAbandoned, Takeover: true,
						Reason: store.NotRunReason("the caller left before its claim was answered")},
					{Attempt: 3, Fence: 3, Owner: "w3", Started: at(600), LeaseUntil: at(650), Ended: at(650), Outcome: store.OutcomeAbandoned, Takeover: true,
						Reason: store.NotRunReason(`idem: reconcile "k": provider 503`)},
					{Attempt: 4, Fence: 4, Owner: "w4", Started: at(900), LeaseUntil: at(920), Ended: at(920), Outcome: store.OutcomeCompleted, Takeover: true},
				}},
			now: at(1000), code: CodeTakeover, cause: CauseCrash, attempts: []int{1, 4}, state: StateCompleted,
			answers: []string{"no", "no", "yes"},
			text:    []string{"attempt 1 lapsed without recording an outcome and attempt 4 took over"},
			story: []string{"attempt 1 (fence 1) claimed", "lease ran out",
				"taking over lapsed attempt 1", "attempt 2 did not run: the caller left",
				"taking over lapsed attempt 1 (attempt 2 after it did not run)", "attempt 3 did not run: the Reconcile hook failed: provider 503",
				"taking over lapsed attempt 1 (attempts 2 and 3 after it did not run)", "attempt 4 completed"},
		},
		{
			name: "a failed Reconcile hook, then a reconcile",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 3, Attempt: 3, Policy: idem.AtLeastOnce,
				LeaseUntil: at(710), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Policy: "at_least_once", Started: at(0), LeaseUntil: at(300), Outcome: store.OutcomeLapsed},
					{Attempt: 2, Fence: 2, Owner: "w2", Correlation: "m1", Policy: "at_least_once", Started: at(400), LeaseUntil: at(450), Ended: at(450), Outcome: store.OutcomeAbandoned, Takeover: true,
						Reason: store.NotRunReason(`idem: reconcile "k": provider 503`)},
					{Attempt: 3, Fence: 3, Owner: "w3", Correlation: "m1", Policy: "at_least_once", Started: at(700), LeaseUntil: at(710), Ended: at(710), Outcome: store.OutcomeResolvedDone, Takeover: true,
						Reason: "reconciled: the lapsed attempt's effect was found done", ResolvedBy: "w3 (reconcile)"},
				}},
			now: at(1000), code: CodeReconciled, cause: CauseNoIdemDup, attempts: []int{1, 3}, state: StateCompleted,
			answers: []string{"no", "no", "no"},
			text:    []string{"attempt 3 took over, its Reconcile hook found attempt 1's effect done, nothing was repeated"},
			notText: []string{"attempt 2", "Send succeeded"},
			story: []string{"attempt 1 (fence 1) claimed", "attempt 1's lease ran out",
				"attempt 2 (fence 2) claimed by w2 under at_least_once, correlation m1, taking over lapsed attempt 1",
				"attempt 2 did not run: the Reconcile hook failed: provider 503; no effect came from it, and it left the key lapsed",
				"taking over lapsed attempt 1 (attempt 2 after it did not run)",
				"attempt 3 took over, its Reconcile hook found attempt 1's effect done, nothing was repeated"},
		},
		{
			name: "a failed Reconcile hook under at_most_once leaves the key indeterminate about the attempt before it",
			rec: idem.Record{Key: "k", Status: idem.StatusInProgress, Fence: 2, Attempt: 2, Policy: idem.AtMostOnce,
				LeaseUntil: at(450), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Policy: "at_most_once", Started: at(0), LeaseUntil: at(300), Outcome: store.OutcomeLapsed},
					{Attempt: 2, Fence: 2, Owner: "w2", Correlation: "m1", Policy: "at_most_once", Started: at(400), LeaseUntil: at(450), Ended: at(450), Outcome: store.OutcomeAbandoned, Takeover: true,
						Reason: store.NotRunReason("the Reconcile hook panicked: nil map")},
				}},
			now: at(1000), code: CodeIndeterminate, cause: CauseNoIdemDup, attempts: []int{1}, state: StateIndeterminate,
			answers: []string{"no", "no", "no"},
			text:    []string{"attempt 1 lapsed", "waiting for `idem resolve k"},
			story: []string{"attempt 1 (fence 1) claimed", "attempt 1's lease ran out", "taking over lapsed attempt 1",
				"attempt 2 did not run: the Reconcile hook panicked: nil map; no effect came from it, and it left the key lapsed"},
		},
		{
			name: "a claim after expiry that did not run, then a run",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 3, Attempt: 3, Policy: idem.AtLeastOnce,
				LeaseUntil: at(90_000_520), ExpiresAt: at(1e9),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(20), Ended: at(20), Outcome: store.OutcomeCompleted},
					{Attempt: 2, Fence: 2, Owner: "w2", Correlation: "m2", Started: at(90_000_000), LeaseUntil: at(90_000_005), Ended: at(90_000_005), Outcome: store.OutcomeReleased, AfterExpiry: true,
						Reason: store.NotRunReason("the caller left before its claim was answered")},
					{Attempt: 3, Fence: 3, Owner: "w2", Correlation: "m3", Started: at(90_000_500), LeaseUntil: at(90_000_520), Ended: at(90_000_520), Outcome: store.OutcomeCompleted},
				}},
			now: at(90_000_600), code: CodeExpiredRerun, cause: CauseLifetime, attempts: []int{1, 3}, state: StateCompleted,
			answers: []string{"yes"},
			text:    []string{"the completed record expired (retention) before the redelivery", "attempt 3 ran again"},
		},
		{
			name: "an error under at_least_once, then a Reconcile hook that found the effect done",
			rec: idem.Record{Key: "k", Status: idem.StatusCompleted, Fence: 2, Attempt: 2, Policy: idem.AtLeastOnce,
				LeaseUntil: at(210), ExpiresAt: at(1e6),
				Journal: []store.JournalEntry{
					{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Policy: "at_least_once", Started: at(0), LeaseUntil: at(30), Ended: at(30), Outcome: store.OutcomeReleased, Reason: "writing the audit row: timeout"},
					{Attempt: 2, Fence: 2, Owner: "w1", Correlation: "m1", Policy: "at_least_once", Started: at(200), LeaseUntil: at(210), Ended: at(210), Outcome: store.OutcomeResolvedDone,
						Reason: "reconciled: the lapsed attempt's effect was found done", ResolvedBy: "w1 (reconcile)"},
				}},
			now: at(1000), code: CodeReconciled, cause: CauseNoIdemDup, attempts: []int{1, 2}, state: StateCompleted,
			answers: []string{"no", "no", "no"},
			text:    []string{"attempt 2 ran after attempt 1's error, its Reconcile hook found attempt 1's effect done, nothing was repeated"},
			notText: []string{"took over", "twice"},
			story: []string{"attempt 1 (fence 1) claimed", "attempt 1 returned an error after 30ms and released the key for a retry (writing the audit row: timeout)",
				"attempt 2 (fence 2) claimed",
				"attempt 2 ran after attempt 1's error, its Reconcile hook found attempt 1's effect done, nothing was repeated: completed with the hook's result (recorded by w1 (reconcile))"},
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
			for _, s := range c.notText {
				if strings.Contains(x.Verdict.Text, s) {
					t.Errorf("verdict text %q contains %q", x.Verdict.Text, s)
				}
			}
			if c.story != nil {
				if len(x.Story) != len(c.story) {
					t.Errorf("story has %d events, want %d: %+v", len(x.Story), len(c.story), x.Story)
				}
				for i := range min(len(x.Story), len(c.story)) {
					if !strings.Contains(x.Story[i].Text, c.story[i]) {
						t.Errorf("story[%d] = %q, want it to contain %q", i, x.Story[i].Text, c.story[i])
					}
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
		Journal: []store.JournalEntry{
			{Attempt: 1, Fence: 1, Owner: "consumer-1", Correlation: "m3", Started: at(0), LeaseUntil: at(300), Outcome: store.OutcomeLapsed, LateFinish: at(450)},
			{Attempt: 2, Fence: 2, Owner: "consumer-2", Correlation: "m3-b", Started: at(400), LeaseUntil: at(420), Ended: at(420), Outcome: store.OutcomeCompleted, Takeover: true},
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
		"attempt 1 was still running at 2025-06-01 10:00:00.450Z (tried to extend its lease or record an outcome) after attempt 2 took over; the store refused it (lease lost)",
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
	// claim returns the record after the claim and the claiming attempt, as
	// a FinishRequest that finish completes.
	claim := func(rec *idem.Record, p idem.Policy, owner string, now time.Time) (*idem.Record, store.FinishRequest) {
		t.Helper()
		next, res := store.ApplyClaim(rec, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: owner, Correlation: "msg-" + owner, Policy: p, Lease: lease, Retention: retention}, now, 0)
		if !res.Acquired {
			t.Fatalf("claim by %s at %v not acquired: %+v", owner, now, res.Record)
		}
		return next, store.FinishRequest{Key: "k", Fence: res.Record.Fence, AttemptID: res.Record.AttemptID}
	}
	finish := func(rec *idem.Record, att store.FinishRequest, now time.Time) *idem.Record {
		t.Helper()
		att.Outcome, att.Result, att.Retention = store.OutcomeCompleted, []byte("ok"), retention
		next, err := store.ApplyFinish(rec, att, now)
		if err != nil && next == nil {
			t.Fatalf("finish fence %d: %v", att.Fence, err)
		}
		if next == nil {
			return rec
		}
		return next
	}

	t.Run("crash then takeover", func(t *testing.T) {
		r, _ := claim(nil, idem.AtLeastOnce, "a", at(0))
		r, f2 := claim(r, idem.AtLeastOnce, "b", at(400))
		r = finish(r, f2, at(420))
		if x := Explain(*r, at(500)); x.Verdict.Code != CodeTakeover {
			t.Fatalf("verdict %s: %s", x.Verdict.Code, x.Verdict.Text)
		}
	})
	t.Run("crash, takeover, late finish", func(t *testing.T) {
		r, f1 := claim(nil, idem.AtLeastOnce, "a", at(0))
		r, f2 := claim(r, idem.AtLeastOnce, "b", at(400))
		r = finish(r, f1, at(450)) // refused, annotated
		r = finish(r, f2, at(460))
		if x := Explain(*r, at(500)); x.Verdict.Code != CodeOverlap {
			t.Fatalf("verdict %s: %s", x.Verdict.Code, x.Verdict.Text)
		}
	})
	t.Run("crash, takeover, refused heartbeat", func(t *testing.T) {
		r, f1 := claim(nil, idem.AtLeastOnce, "a", at(0))
		r, f2 := claim(r, idem.AtLeastOnce, "b", at(400))
		next, err := store.ApplyExtend(r, store.ExtendRequest{Key: "k", Fence: f1.Fence, AttemptID: f1.AttemptID, Lease: lease}, at(450))
		if !errors.Is(err, idem.ErrLeaseLost) || next == nil {
			t.Fatalf("stale heartbeat: %v, %v", next, err)
		}
		r = finish(next, f2, at(460))
		x := Explain(*r, at(500))
		if x.Verdict.Code != CodeOverlap {
			t.Fatalf("verdict %s: %s", x.Verdict.Code, x.Verdict.Text)
		}
		if want := "attempt 1 was still running at 2025-06-01 10:00:00.450Z (tried to extend its lease or record an outcome) after attempt 2 took over at 2025-06-01 10:00:00.400Z"; x.Steps[1].Why != want {
			t.Errorf("step 2: %q, want %q", x.Steps[1].Why, want)
		}
	})
	t.Run("reconciled takeover", func(t *testing.T) {
		r, _ := claim(nil, idem.AtMostOnce, "a", at(0))
		next, res := store.ApplyClaim(r, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "b", Correlation: "msg-b", Policy: idem.AtMostOnce, Lease: lease, Retention: retention, TakeLapsed: true}, at(400), 0)
		if !res.Acquired || !res.Takeover {
			t.Fatalf("takeover: %+v", res)
		}
		r, err := store.ApplyResolve(next, store.ResolveRequest{Key: "k", Fence: res.Record.Fence, AttemptID: res.Record.AttemptID, Done: true, Result: []byte("ses-1"), Retention: retention,
			Reason: "reconciled: the lapsed attempt's effect was found done", By: "b (reconcile)"}, at(410))
		if err != nil {
			t.Fatal(err)
		}
		x := Explain(*r, at(500))
		if x.Verdict.Code != CodeReconciled || x.Attempts != 2 || !slices.Equal(x.Verdict.Attempts, []int{1, 2}) {
			t.Fatalf("verdict %s, %d attempts: %s", x.Verdict.Code, x.Attempts, x.Verdict.Text)
		}
	})
	t.Run("expired then re-run", func(t *testing.T) {
		r, f1 := claim(nil, idem.AtLeastOnce, "a", at(0))
		r = finish(r, f1, at(20))
		r, f2 := claim(r, idem.AtLeastOnce, "b", at(20).Add(retention+time.Second))
		r = finish(r, f2, at(40).Add(retention+time.Second))
		if x := Explain(*r, at(50).Add(retention+time.Second)); x.Verdict.Code != CodeExpiredRerun {
			t.Fatalf("verdict %s: %s", x.Verdict.Code, x.Verdict.Text)
		}
	})
	t.Run("operator released a completed key", func(t *testing.T) {
		r, f1 := claim(nil, idem.AtLeastOnce, "a", at(0))
		r = finish(r, f1, at(20))
		r, err := store.ApplyResolve(r, store.ResolveRequest{Key: "k", Reason: "resend", By: "alice"}, at(100))
		if err != nil {
			t.Fatal(err)
		}
		r, f3 := claim(r, idem.AtLeastOnce, "b", at(200))
		r = finish(r, f3, at(220))
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
		r, err := store.ApplyResolve(r, store.ResolveRequest{Key: "k", Fence: r.Fence, Lapsed: true, Done: true, Result: []byte("id"), Reason: "sent per provider", Retention: retention, By: "bob"}, at(600))
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
		if !slices.Equal(kinds, []string{"claim", "lapse", "resolve"}) || !strings.Contains(x.Story[2].Text, "attempt 1 was resolved as done by bob (sent per provider)") {
			t.Errorf("story: %+v", x.Story)
		}
	})
}

// TestJournalsFromLedger reads journals a Ledger writes, on memstore.
func TestJournalsFromLedger(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	now := t0
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	s := memstore.New(memstore.WithClock(clock))
	defer s.Close()
	// A worker under at_most_once claims the key, sends and dies.
	if res, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "receipt:1:7", Owner: "consumer-1", Correlation: "m-1", Policy: idem.AtMostOnce, Lease: time.Second, Retention: time.Hour}); err != nil || !res.Acquired {
		t.Fatalf("claim: %v %+v", err, res)
	}
	advance(2 * time.Second)
	// The next delivery takes over; its Reconcile hook finds the email sent.
	l := idem.New(s, idem.WithOwner("consumer-2"), idem.WithLogger(slog.New(slog.DiscardHandler)))
	res, err := l.Do(ctx, idem.RawKey("receipt:1:7"), func(context.Context) ([]byte, error) {
		t.Error("fn ran after the hook found the effect done")
		return nil, nil
	}, idem.WithPolicy(idem.AtMostOnce), idem.WithCorrelationID("m-1"), idem.WithReconcile(func(context.Context, idem.Lapsed) ([]byte, bool, error) {
		return []byte("ses-0001"), true, nil
	}))
	if err != nil || !res.Reconciled {
		t.Fatalf("Do: %v %+v", err, res)
	}
	rec, err := s.Get(ctx, "receipt:1:7")
	if err != nil {
		t.Fatal(err)
	}
	x := Explain(rec, clock())
	if x.Verdict.Code != CodeReconciled || x.Attempts != 2 {
		t.Fatalf("verdict %s, %d attempts: %s", x.Verdict.Code, x.Attempts, x.Verdict.Text)
	}
	last := x.Story[len(x.Story)-1].Text
	if !strings.Contains(last, "attempt 2 took over, its Reconcile hook found attempt 1's effect done, nothing was repeated") ||
		!strings.Contains(last, "by consumer-2 (reconcile)") {
		t.Errorf("story: %q", last)
	}
}

// leavingStore answers a claim after the caller's context has ended (the
// caller left while its claim was on its way), while leave is set.
type leavingStore struct {
	store.Store
	mu    sync.Mutex
	leave context.CancelFunc
}

func (s *leavingStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	res, err := s.Store.Claim(context.WithoutCancel(ctx), req)
	s.mu.Lock()
	if s.leave != nil {
		s.leave()
		s.leave = nil
	}
	s.mu.Unlock()
	return res, err
}

// TestJournalsFromLedgerNotRun reads journals a Ledger writes on memstore
// for attempts that ended without running fn: they did no effect, and the
// explanation pairs each attempt with the one before it that ran.
func TestJournalsFromLedgerNotRun(t *testing.T) {
	ctx := context.Background()
	setup := func(t *testing.T) (*leavingStore, *idem.Ledger, func() time.Time, func(time.Duration)) {
		var mu sync.Mutex
		now := t0
		clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
		advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
		ms := memstore.New(memstore.WithClock(clock))
		t.Cleanup(func() { ms.Close() })
		s := &leavingStore{Store: ms}
		l := idem.New(s, idem.WithOwner("w2"), idem.WithLease(time.Second), idem.WithLogger(slog.New(slog.DiscardHandler)))
		return s, l, clock, advance
	}
	// crash: attempt 1 claims the key and dies.
	crash := func(t *testing.T, s store.Store, p idem.Policy) {
		if res, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "w1", Correlation: "m-1", Policy: p, Lease: time.Second, Retention: time.Hour}); err != nil || !res.Acquired {
			t.Fatalf("claim: %v %+v", err, res)
		}
	}
	// orphan: a Do whose caller leaves while its claim is on its way.
	orphan := func(t *testing.T, s *leavingStore, l *idem.Ledger) {
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		s.mu.Lock()
		s.leave = cancel
		s.mu.Unlock()
		_, err := l.Do(cctx, idem.RawKey("k"), func(context.Context) ([]byte, error) {
			t.Error("fn ran for a caller that left")
			return nil, nil
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("orphaned Do: %v, want context.Canceled", err)
		}
	}
	explain := func(t *testing.T, s store.Store, clock func() time.Time) Explanation {
		rec, err := s.Get(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		return Explain(rec, clock())
	}
	storyHas := func(t *testing.T, x Explanation, want ...string) {
		t.Helper()
		var all []string
		for _, e := range x.Story {
			all = append(all, e.Text)
		}
		story := strings.Join(all, "\n")
		for _, w := range want {
			if !strings.Contains(story, w) {
				t.Errorf("story lacks %q:\n%s", w, story)
			}
		}
	}
	send := func(context.Context) ([]byte, error) { return []byte("sent"), nil }

	t.Run("failed hook, then a reconcile", func(t *testing.T) {
		s, l, clock, advance := setup(t)
		crash(t, s, idem.AtLeastOnce)
		advance(2 * time.Second)
		_, err := l.Do(ctx, idem.RawKey("k"), func(context.Context) ([]byte, error) {
			t.Error("fn ran after its hook failed")
			return nil, nil
		}, idem.WithReconcile(func(context.Context, idem.Lapsed) ([]byte, bool, error) {
			return nil, false, errors.New("provider 503")
		}))
		if err == nil {
			t.Fatal("Do with a failing hook succeeded")
		}
		var asked int
		res, err := l.Do(ctx, idem.RawKey("k"), send, idem.WithReconcile(func(_ context.Context, lp idem.Lapsed) ([]byte, bool, error) {
			asked = lp.Attempt
			return []byte("found"), true, nil
		}))
		if err != nil || !res.Reconciled || asked != 1 {
			t.Fatalf("Do: %v %+v, hook asked about attempt %d", err, res, asked)
		}
		x := explain(t, s, clock)
		if x.Verdict.Code != CodeReconciled || !slices.Equal(x.Verdict.Attempts, []int{1, 3}) {
			t.Errorf("verdict %s %v: %s", x.Verdict.Code, x.Verdict.Attempts, x.Verdict.Text)
		}
		storyHas(t, x, "attempt 2 did not run: the Reconcile hook failed: provider 503",
			"attempt 3 took over, its Reconcile hook found attempt 1's effect done")
	})
	t.Run("orphaned takeover, then a takeover", func(t *testing.T) {
		s, l, clock, advance := setup(t)
		crash(t, s, idem.AtLeastOnce)
		advance(2 * time.Second)
		orphan(t, s, l)
		res, err := l.Do(ctx, idem.RawKey("k"), send)
		if err != nil || !res.Takeover || res.Attempt != 3 {
			t.Fatalf("Do: %v %+v", err, res)
		}
		x := explain(t, s, clock)
		if x.Verdict.Code != CodeTakeover || !slices.Equal(x.Verdict.Attempts, []int{1, 3}) {
			t.Errorf("verdict %s %v: %s", x.Verdict.Code, x.Verdict.Attempts, x.Verdict.Text)
		}
		storyHas(t, x, "attempt 2 did not run: the caller left before its claim was answered",
			"taking over lapsed attempt 1 (attempt 2 after it did not run)")
	})
	t.Run("failed hook after an error, then a reconcile", func(t *testing.T) {
		s, l, clock, _ := setup(t)
		if _, err := l.Do(ctx, idem.RawKey("k"), func(context.Context) ([]byte, error) {
			return nil, errors.New("writing the audit row: timeout")
		}); err == nil {
			t.Fatal("Do with a failing fn succeeded")
		}
		hook := func(err error) idem.CallOption {
			return idem.WithReconcile(func(context.Context, idem.Lapsed) ([]byte, bool, error) { return []byte("found"), err == nil, err })
		}
		if _, err := l.Do(ctx, idem.RawKey("k"), send, hook(errors.New("provider 503"))); err == nil {
			t.Fatal("Do with a failing hook succeeded")
		}
		res, err := l.Do(ctx, idem.RawKey("k"), send, hook(nil))
		if err != nil || !res.Reconciled || res.Attempt != 3 {
			t.Fatalf("Do: %v %+v", err, res)
		}
		x := explain(t, s, clock)
		if x.Verdict.Code != CodeReconciled || !slices.Equal(x.Verdict.Attempts, []int{1, 3}) {
			t.Errorf("verdict %s %v: %s", x.Verdict.Code, x.Verdict.Attempts, x.Verdict.Text)
		}
		storyHas(t, x, "attempt 2 did not run: the Reconcile hook failed: provider 503; no effect came from it, and it left the key lapsed",
			"attempt 3 took over, its Reconcile hook found attempt 1's effect done")
	})
	t.Run("an error, then a reconcile", func(t *testing.T) {
		s, l, clock, _ := setup(t)
		if _, err := l.Do(ctx, idem.RawKey("k"), func(context.Context) ([]byte, error) {
			return nil, errors.New("writing the audit row: timeout")
		}); err == nil {
			t.Fatal("Do with a failing fn succeeded")
		}
		res, err := l.Do(ctx, idem.RawKey("k"), send, idem.WithReconcile(func(context.Context, idem.Lapsed) ([]byte, bool, error) {
			return []byte("found"), true, nil
		}))
		if err != nil || !res.Reconciled || res.Attempt != 2 {
			t.Fatalf("Do: %v %+v", err, res)
		}
		x := explain(t, s, clock)
		if x.Verdict.Code != CodeReconciled || !slices.Equal(x.Verdict.Attempts, []int{1, 2}) {
			t.Errorf("verdict %s %v: %s", x.Verdict.Code, x.Verdict.Attempts, x.Verdict.Text)
		}
	})
	t.Run("orphaned claim of a fresh key, then a run", func(t *testing.T) {
		s, l, clock, _ := setup(t)
		orphan(t, s, l)
		res, err := l.Do(ctx, idem.RawKey("k"), send)
		if err != nil || res.Takeover || res.Attempt != 2 {
			t.Fatalf("Do: %v %+v", err, res)
		}
		x := explain(t, s, clock)
		if x.Verdict.Code != CodeNoDuplicate || !slices.Equal(x.Verdict.Attempts, []int{2}) {
			t.Errorf("verdict %s %v: %s", x.Verdict.Code, x.Verdict.Attempts, x.Verdict.Text)
		}
		storyHas(t, x, "attempt 1 did not run: the caller left before its claim was answered; no effect came from it, and it released the key")
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

// A failed Reconcile hook's error is quoted whole, also for a key that
// holds ": " (the ledger quotes the key in the reason).
func TestNotRunDetailKeyWithColon(t *testing.T) {
	e := store.JournalEntry{Reason: store.NotRunReason(`idem: reconcile "order: 5": provider down`)}
	if got, want := notRunDetail("order: 5", e), "the Reconcile hook failed: provider down"; got != want {
		t.Fatalf("notRunDetail = %q, want %q", got, want)
	}
}

// A lapsed at_least_once record is taken over only by the same request:
// with a fingerprint on the record, a different request gets a mismatch
// and the key stays until the same request comes, its retention ends or an
// operator resolves it. Without one, the next delivery takes over.
func TestLapsedTakeoverNeedsTheSameRequest(t *testing.T) {
	rec := func(fp string) idem.Record {
		return idem.Record{Key: "receipt:8891:7", Status: idem.StatusInProgress, Fence: 1, Attempt: 1, Policy: idem.AtLeastOnce,
			Owner: "w1", Fingerprint: fp, LeaseUntil: at(300), ExpiresAt: at(1e6), CreatedAt: at(0),
			Journal: []store.JournalEntry{
				{Attempt: 1, Fence: 1, Owner: "w1", Correlation: "m1", Started: at(0), LeaseUntil: at(300)},
			}}
	}
	contains := func(what, got string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("%s %q does not contain %q", what, got, w)
			}
		}
	}
	lacks := func(what, got string, not ...string) {
		t.Helper()
		for _, w := range not {
			if strings.Contains(got, w) {
				t.Errorf("%s %q contains %q", what, got, w)
			}
		}
	}

	r := rec("sha256:aa")
	x := Explain(r, at(500))
	if x.State != StateLapsed {
		t.Fatalf("state = %s, want lapsed", x.State)
	}
	contains("current", x.Current, "Lapsed since 2025-06-01 10:00:00.300Z",
		"only a delivery of the same request (same fingerprint, or none) takes over as attempt 2",
		"a different request gets a mismatch",
		"until the same request comes, its retention ends at 2025-06-01 10:16:40.000Z, or an operator runs `idem resolve receipt:8891:7`")
	lacks("current", x.Current, "the next delivery takes over")
	contains("verdict", x.Verdict.Text, "only a delivery of the same request (same fingerprint, or none) takes over", "a different request gets a mismatch")
	lacks("verdict", x.Verdict.Text, "the next delivery takes over")
	d := StateLapsed.DescribeFor(&r)
	contains("description", d, "lapsed", "the same request's next claim takes over", "a different request gets a mismatch")

	r = rec("")
	x = Explain(r, at(500))
	contains("current", x.Current, "the next delivery takes over as attempt 2 and runs again (at_least_once)")
	lacks("current", x.Current, "mismatch")
	contains("verdict", x.Verdict.Text, "the next delivery takes over and runs again")
	lacks("verdict", x.Verdict.Text, "mismatch")
	if d := StateLapsed.DescribeFor(&r); d != StateLapsed.Describe() {
		t.Errorf("description without a fingerprint = %q, want %q", d, StateLapsed.Describe())
	}
	// Other states describe themselves whatever the fingerprint.
	done := idem.Record{Status: idem.StatusCompleted, Fingerprint: "sha256:aa"}
	if d := StateCompleted.DescribeFor(&done); d != StateCompleted.Describe() {
		t.Errorf("completed description = %q", d)
	}
}
