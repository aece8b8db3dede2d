package explain

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// Verdict codes: the leaf of the decision tree a record reaches.
const (
	// CodeExpiredRerun: an attempt started after an earlier one's completion
	// was recorded, because the completed record expired (tree: "Check job
	// key, table and record lifetime").
	CodeExpiredRerun = "completed-then-expired"
	// CodeReleasedRerun: the same, because an operator released the
	// completed key.
	CodeReleasedRerun = "completed-then-released"
	// CodeOverlap: an attempt was still running after a later one took over
	// (tree: "Concurrent check-then-send race").
	CodeOverlap = "overlap"
	// CodeTakeover: an attempt lapsed without an outcome and a later one
	// took over (tree: "Send succeeded, recording failed or crashed").
	CodeTakeover = "takeover"
	// CodeRetriedAfterError: an attempt returned an error, the key was
	// released and a later attempt ran again (same tree leaf).
	CodeRetriedAfterError = "retried-after-error"
	// CodeReconciled: an attempt took over a lapsed one (or ran after one
	// that returned an error under at_least_once) and its Reconcile hook
	// found that attempt's effect done, so nothing was repeated.
	CodeReconciled = "reconciled"
	// CodeIndeterminate: an AtMostOnce attempt lapsed; nothing runs the key
	// again until it is resolved.
	CodeIndeterminate = "indeterminate"
	// CodeSingle: one attempt; no second effect could come from idem.
	CodeSingle = "single-attempt"
	// CodeNoDuplicate: several attempts, but every earlier one ended saying
	// its effect did not happen.
	CodeNoDuplicate = "no-duplicate"
	// CodeNoJournal: the record holds no journal entries.
	CodeNoJournal = "no-journal"
)

// The decision tree's leaves ("two emails, one booking").
const (
	CauseLifetime  = "Check job key, table and record lifetime"
	CauseRace      = "Concurrent check-then-send race"
	CauseCrash     = "Send succeeded, recording failed or crashed"
	CauseNoIdemDup = "No duplicate from idem's side"
)

// Event is one moment of a key's story.
type Event struct {
	At      time.Time `json:"at"`
	Attempt int       `json:"attempt,omitempty"`
	Fence   int64     `json:"fence,omitempty"`
	// Kind is claim, end, lapse, late-finish or resolve.
	Kind string `json:"kind"`
	Text string `json:"text"`
}

// Step is one question of the decision tree and its answer.
type Step struct {
	Question string `json:"question"`
	Answer   string `json:"answer"` // "yes" or "no"
	Why      string `json:"why"`
}

// Verdict is where the decision tree ends for a record.
type Verdict struct {
	Code  string `json:"code"`
	Cause string `json:"cause"` // the decision tree's leaf
	// Text is the verdict as one or two sentences, naming the attempts.
	Text string `json:"text"`
	// Attempts are the attempt numbers the verdict is about (earlier first).
	Attempts []int `json:"attempts,omitempty"`
}

// Explanation is a key's story and the verdict on it.
type Explanation struct {
	Key     string      `json:"key"`
	Status  idem.Status `json:"status"`
	State   State       `json:"state"`
	Policy  string      `json:"policy"`
	Fence   int64       `json:"fence"`
	Now     time.Time   `json:"now"`
	Expires time.Time   `json:"expires_at"`
	// Attempts is how many attempts the journal shows (operator decisions
	// are events, not attempts).
	Attempts int `json:"attempts"`
	// Truncated: the journal keeps the newest store.MaxJournal entries and
	// older attempts are missing from the story.
	Truncated bool    `json:"truncated,omitempty"`
	Story     []Event `json:"story"`
	Steps     []Step  `json:"steps"`
	Verdict   Verdict `json:"verdict"`
	// Current says what happens next for the key.
	Current string `json:"current"`
}

// attempt is a journal entry that is an attempt (not an operator's
// decision recorded as its own entry).
type attempt struct {
	store.JournalEntry
	idx int // position in the journal
}

// isDecision reports whether e records a resolution of a key that had no
// open attempt (an operator's decision, not an attempt): idem marks such
// entries with Decision.
func isDecision(e store.JournalEntry) bool { return e.Decision }

// isReconciled reports whether e is an attempt that took over a lapsed one
// (or ran after one that returned an error under at_least_once) and whose
// Reconcile hook found that attempt's effect done: the Ledger records that
// as a resolution by "<owner> (reconcile)" instead of running fn.
func isReconciled(e store.JournalEntry) bool {
	return e.Outcome == store.OutcomeResolvedDone &&
		(strings.HasSuffix(e.ResolvedBy, "(reconcile)") || strings.HasPrefix(e.Reason, "reconciled"))
}

// notRunDetail returns why e, an attempt that ended without running its
// operation (e.NotRun()), did not run: its reason after the prefix
// store.NotRunReason puts before it, with a failed Reconcile hook's error
// (`idem: reconcile "KEY": ERR`, key quoted) worded as such.
func notRunDetail(key string, e store.JournalEntry) string {
	d := strings.TrimPrefix(e.Reason, store.NotRunReason(""))
	if err, ok := strings.CutPrefix(d, "idem: reconcile "+strconv.Quote(key)+": "); ok {
		return "the Reconcile hook failed: " + err
	}
	return d
}

// reconciledText says what e, an attempt whose Reconcile hook found prev's
// effect done, did: it took prev over (prev lapsed), or it ran after
// prev's error under at_least_once (the Ledger asks the hook then too).
func reconciledText(e store.JournalEntry, prev string) string {
	if e.Takeover {
		return fmt.Sprintf("attempt %d took over, its Reconcile hook found %s's effect done, nothing was repeated", e.Attempt, prev)
	}
	return fmt.Sprintf("attempt %d ran after %s's error, its Reconcile hook found %s's effect done, nothing was repeated", e.Attempt, prev, prev)
}

// policyOf returns the policy e was claimed under: its own, else (journals
// of stores that do not keep it) the record's.
func policyOf(rec *idem.Record, e store.JournalEntry) string {
	if e.Policy != "" {
		return e.Policy
	}
	return rec.Policy.String()
}

// resolvedBy says who recorded e's resolution, as " by NAME", or "".
func resolvedBy(e store.JournalEntry) string {
	by := e.ResolvedBy
	if by == "" && e.Decision {
		by = e.Owner
	}
	if by == "" {
		return ""
	}
	return " by " + by
}

// Explain tells rec's story at now (the store's clock) and walks the
// decision tree over its journal.
func Explain(rec idem.Record, now time.Time) Explanation {
	x := Explanation{
		Key:     rec.Key,
		Status:  rec.Status,
		State:   StateOf(&rec, now),
		Policy:  rec.Policy.String(),
		Fence:   rec.Fence,
		Now:     now.UTC(),
		Expires: rec.ExpiresAt.UTC(),
	}
	j := rec.Journal
	var atts []attempt
	for i := range j {
		if !isDecision(j[i]) {
			atts = append(atts, attempt{j[i], i})
		}
	}
	x.Attempts = len(atts)
	x.Truncated = len(j) > 0 && j[0].Attempt > 1
	x.Story = story(&rec, atts, now)
	x.Steps, x.Verdict = decide(&rec, atts, now)
	x.Current = current(&rec, x.State, now)
	return x
}

// outcomeNotRun stands, in the story, for the outcome of an attempt that
// released or abandoned the key without running its operation.
const outcomeNotRun = "not-run"

func story(rec *idem.Record, atts []attempt, now time.Time) []Event {
	j := rec.Journal
	var ev []Event
	add := func(at time.Time, a int, f int64, kind, format string, args ...any) {
		ev = append(ev, Event{At: at, Attempt: a, Fence: f, Kind: kind, Text: fmt.Sprintf(format, args...)})
	}
	for i, e := range j {
		if isDecision(e) {
			if e.Outcome == store.OutcomeResolvedDone {
				add(e.Ended, 0, e.Fence, "resolve", "resolved as done%s%s: completed with the result given, replayed to duplicates", resolvedBy(e), because(e.Reason))
			} else {
				add(e.Ended, 0, e.Fence, "resolve", "resolved as not done%s%s: released, the next delivery runs it", resolvedBy(e), because(e.Reason))
			}
			continue
		}
		var b strings.Builder
		fmt.Fprintf(&b, "attempt %d (fence %d) claimed", e.Attempt, e.Fence)
		if e.Owner != "" {
			fmt.Fprintf(&b, " by %s", e.Owner)
		}
		if e.Policy != "" {
			fmt.Fprintf(&b, " under %s", e.Policy)
		}
		if e.Correlation != "" {
			fmt.Fprintf(&b, ", correlation %s", e.Correlation)
		}
		if e.AfterExpiry {
			b.WriteString(", after the previous record had expired (retention passed): idem no longer remembered how earlier attempts ended")
		}
		// prev names the attempt a takeover took over: the last one before
		// it that may have done the effect (the journal may no longer hold
		// it). The attempts after that one that did not run are passed over.
		prev, over := "the lapsed attempt", "a lapsed attempt"
		if !e.Takeover {
			prev = "the attempt before it"
		}
		from := -1
		if p := previousRun(atts, i); p != nil {
			prev = fmt.Sprintf("attempt %d", p.Attempt)
			over = "lapsed " + prev
			from = p.idx
		}
		if e.Takeover {
			fmt.Fprintf(&b, ", taking over %s", over)
			if skipped := notRunBetween(atts, from, i); len(skipped) > 0 {
				fmt.Fprintf(&b, " (%s after it did not run)", attemptList(skipped))
			}
		}
		add(e.Started, e.Attempt, e.Fence, "claim", "%s", b.String())

		outcome := e.Outcome
		if e.NotRun() && (outcome == store.OutcomeReleased || outcome == store.OutcomeAbandoned) {
			outcome = outcomeNotRun
		}
		switch outcome {
		case outcomeNotRun:
			// It ended without running its operation: no effect came from
			// it, whatever the policy.
			what := "it released the key"
			if e.Outcome == store.OutcomeAbandoned {
				what = "it left the key lapsed"
			}
			add(e.Ended, e.Attempt, e.Fence, "end", "attempt %d did not run: %s; no effect came from it, and %s", e.Attempt, notRunDetail(rec.Key, e), what)
		case "", store.OutcomeLapsed:
			if e.Outcome == store.OutcomeLapsed || (rec.Status == idem.StatusInProgress && rec.Fence == e.Fence && rec.Lapsed(now)) {
				add(e.LeaseUntil, e.Attempt, e.Fence, "lapse",
					"attempt %d's lease ran out with no outcome recorded: it crashed, hung or lost the store%s",
					e.Attempt, because(e.Reason))
			}
		case store.OutcomeCompleted:
			add(e.Ended, e.Attempt, e.Fence, "end", "attempt %d completed after %s: result recorded, duplicates replay it", e.Attempt, dur(e.Ended.Sub(e.Started)))
		case store.OutcomeFailed:
			add(e.Ended, e.Attempt, e.Fence, "end", "attempt %d failed permanently after %s%s: duplicates get the failure", e.Attempt, dur(e.Ended.Sub(e.Started)), because(e.Reason))
		case store.OutcomeReleased:
			if policyOf(rec, e) == idem.AtMostOnce.String() {
				add(e.Ended, e.Attempt, e.Fence, "end", "attempt %d returned idem.NotDone after %s%s: under at_most_once that says its effect did not happen, and released the key for a retry", e.Attempt, dur(e.Ended.Sub(e.Started)), because(e.Reason))
				break
			}
			add(e.Ended, e.Attempt, e.Fence, "end", "attempt %d returned an error after %s and released the key for a retry%s", e.Attempt, dur(e.Ended.Sub(e.Started)), because(e.Reason))
		case store.OutcomeAbandoned:
			add(e.Ended, e.Attempt, e.Fence, "end", "attempt %d ended after %s without an outcome%s: its effect may or may not have happened", e.Attempt, dur(e.Ended.Sub(e.Started)), because(e.Reason))
		case store.OutcomeResolvedDone, store.OutcomeResolvedNotDone:
			if e.LeaseUntil.Before(e.Ended) {
				add(e.LeaseUntil, e.Attempt, e.Fence, "lapse",
					"attempt %d's lease ran out with no outcome recorded: it crashed, hung or lost the store", e.Attempt)
			}
			switch {
			case isReconciled(e):
				add(e.Ended, e.Attempt, e.Fence, "resolve", "%s: completed with the hook's result (recorded%s)", reconciledText(e, prev), resolvedBy(e))
			case e.Outcome == store.OutcomeResolvedNotDone:
				add(e.Ended, e.Attempt, e.Fence, "resolve", "attempt %d was resolved as not done%s%s: released, the next delivery runs it", e.Attempt, resolvedBy(e), because(e.Reason))
			default:
				add(e.Ended, e.Attempt, e.Fence, "resolve", "attempt %d was resolved as done%s%s: completed with the result given", e.Attempt, resolvedBy(e), because(e.Reason))
			}
		default:
			add(e.Ended, e.Attempt, e.Fence, "end", "attempt %d ended: %s%s", e.Attempt, e.Outcome, because(e.Reason))
		}
		if !e.LateFinish.IsZero() {
			later := "a later attempt"
			if n := next(atts, i); n != nil {
				later = fmt.Sprintf("attempt %d", n.Attempt)
			}
			add(e.LateFinish, e.Attempt, e.Fence, "late-finish",
				"%s; the store refused it (lease lost)", stillRunning(e, later))
		}
	}
	slices.SortStableFunc(ev, func(a, b Event) int { return a.At.Compare(b.At) })
	for i := range ev {
		ev[i].At = ev[i].At.UTC()
	}
	return ev
}

// stillRunning says what e's LateFinish proves: a refused heartbeat or a
// refused outcome, after later took over.
func stillRunning(e store.JournalEntry, later string) string {
	return fmt.Sprintf("attempt %d was still running at %s (tried to extend its lease or record an outcome) after %s took over",
		e.Attempt, stamp(e.LateFinish), later)
}

// previousRun returns the last attempt before journal position idx that
// may have done the effect: attempts that did not run are passed over.
func previousRun(atts []attempt, idx int) *attempt {
	for k := len(atts) - 1; k >= 0; k-- {
		if atts[k].idx < idx && !atts[k].NotRun() {
			return &atts[k]
		}
	}
	return nil
}

// notRunBetween returns the numbers of the attempts between journal
// positions from and to (both excluded) that did not run.
func notRunBetween(atts []attempt, from, to int) []int {
	var n []int
	for _, a := range atts {
		if a.idx > from && a.idx < to && a.NotRun() {
			n = append(n, a.Attempt)
		}
	}
	return n
}

// attemptList names attempts: "attempt 2", "attempts 2 and 3", "attempts
// 2, 3 and 4".
func attemptList(n []int) string {
	if len(n) == 1 {
		return fmt.Sprintf("attempt %d", n[0])
	}
	s := make([]string, len(n))
	for i, a := range n {
		s[i] = fmt.Sprint(a)
	}
	return "attempts " + strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

func next(atts []attempt, idx int) *attempt {
	for k := range atts {
		if atts[k].idx > idx {
			return &atts[k]
		}
	}
	return nil
}

const (
	q1 = "Was completion recorded before the second attempt?"
	q2 = "Did attempts overlap?"
	q3 = "Did an attempt run again after an earlier one may have done its effect?"
	q0 = "Was there more than one attempt?"
)

func decide(rec *idem.Record, atts []attempt, now time.Time) ([]Step, Verdict) {
	j := rec.Journal
	if len(atts) == 0 {
		return []Step{{q0, "no", "the record holds no attempts in its journal"}},
			Verdict{Code: CodeNoJournal, Cause: CauseNoIdemDup, Text: "The record's journal is empty: there is no attempt to explain."}
	}
	if len(atts) == 1 {
		a := atts[0]
		steps := []Step{{q0, "no", fmt.Sprintf("the journal holds one attempt (attempt %d)", a.Attempt)}}
		if x := StateOf(rec, now); x == StateIndeterminate {
			return steps, Verdict{Code: CodeIndeterminate, Cause: CauseNoIdemDup, Attempts: []int{a.Attempt},
				Text: fmt.Sprintf("One attempt, and at most one effect: attempt %d lapsed without recording its outcome under at_most_once, so idem will not run it again; the key is waiting for `idem resolve %s --done|--not-done`.", a.Attempt, rec.Key)}
		}
		text := "One attempt; no second effect could come from idem's side."
		if StateOf(rec, now) == StateLapsed {
			if rec.Fingerprint != "" {
				text += fmt.Sprintf(" But attempt %d lapsed without recording its outcome: under at_least_once only a delivery of the same request (same fingerprint, or none) takes over and runs again, repeating its effect if it happened; a different request gets a mismatch and leaves the key as it is.", a.Attempt)
			} else {
				text += fmt.Sprintf(" But attempt %d lapsed without recording its outcome: under at_least_once the next delivery takes over and runs again, repeating its effect if it happened.", a.Attempt)
			}
		}
		text += fmt.Sprintf(" If two effects were seen anyway, they did not both go through this key: check that every delivery builds the key from business ids (never a message id) on the same store, and that no earlier record of the key expired or was deleted before this one was created (%s).", stamp(rec.CreatedAt))
		return steps, Verdict{Code: CodeSingle, Cause: CauseNoIdemDup, Text: text, Attempts: []int{a.Attempt}}
	}

	var steps []Step
	// 1. Was completion recorded before the second attempt?
	// An attempt that did not run did not repeat the effect.
	for jx := 1; jx < len(atts); jx++ {
		b := atts[jx]
		if b.NotRun() {
			continue
		}
		for ix := range jx {
			a := atts[ix]
			if a.Outcome != store.OutcomeCompleted && a.Outcome != store.OutcomeResolvedDone || a.Ended.IsZero() || a.Ended.After(b.Started) {
				continue
			}
			steps = append(steps, Step{q1, "yes", fmt.Sprintf("attempt %d's completion was recorded at %s, and attempt %d started after it at %s", a.Attempt, stamp(a.Ended), b.Attempt, stamp(b.Started))})
			v := Verdict{Cause: CauseLifetime, Attempts: []int{a.Attempt, b.Attempt}}
			switch op := releasedBetween(j, a.idx, b.idx); {
			case afterExpiryBetween(atts, a.idx, b.idx):
				v.Code = CodeExpiredRerun
				v.Text = fmt.Sprintf("Check the job key, table and record lifetime: the completed record expired (retention) before the redelivery; raise retention to cover the sender's retry horizon. Attempt %d completed at %s; the record was forgotten and attempt %d ran again %s later.",
					a.Attempt, stamp(a.Ended), b.Attempt, dur(b.Started.Sub(a.Ended)))
			case op != nil:
				v.Code = CodeReleasedRerun
				by := ""
				if who := strings.TrimPrefix(resolvedBy(*op), " by "); who != "" {
					by = " (" + who + ")"
				}
				v.Text = fmt.Sprintf("Check the job key, table and record lifetime: attempt %d completed at %s, then an operator%s released the completed key at %s%s, and attempt %d ran it again. Release a completed key only to repeat its effect on purpose.",
					a.Attempt, stamp(a.Ended), by, stamp(op.Ended), because(op.Reason), b.Attempt)
			default:
				v.Code = CodeExpiredRerun
				v.Text = fmt.Sprintf("Check the job key, table and record lifetime: attempt %d completed at %s, yet attempt %d claimed the key at %s; the completed record must have expired or been removed in between. Keep records for the sender's whole retry horizon.",
					a.Attempt, stamp(a.Ended), b.Attempt, stamp(b.Started))
			}
			return steps, v
		}
	}
	steps = append(steps, Step{q1, "no", "no attempt started after an earlier attempt's completion was recorded"})

	// 2. Did attempts overlap? An attempt whose Reconcile hook found the
	// effect done, or that did not run, ran no effect, so it does not
	// overlap anything.
	for ix := range atts {
		a := atts[ix]
		if a.NotRun() {
			continue
		}
		for jx := ix + 1; jx < len(atts); jx++ {
			b := atts[jx]
			if isReconciled(b.JournalEntry) || b.NotRun() {
				continue
			}
			var why string
			switch {
			case !a.LateFinish.IsZero() && !a.LateFinish.Before(b.Started):
				why = fmt.Sprintf("%s at %s", stillRunning(a.JournalEntry, fmt.Sprintf("attempt %d", b.Attempt)), stamp(b.Started))
			case !a.Ended.IsZero() && a.Ended.After(b.Started):
				why = fmt.Sprintf("attempt %d ended at %s, after attempt %d started at %s", a.Attempt, stamp(a.Ended), b.Attempt, stamp(b.Started))
			default:
				continue
			}
			steps = append(steps, Step{q2, "yes", why})
			return steps, Verdict{Code: CodeOverlap, Cause: CauseRace, Attempts: []int{a.Attempt, b.Attempt},
				Text: fmt.Sprintf("Concurrent attempts: attempt %d outlived its lease (heartbeats failed or the process paused) and was still running when attempt %d took over, so both may have done the effect. Preserve the business key; lengthen the lease / fix heartbeats.", a.Attempt, b.Attempt)}
		}
	}
	steps = append(steps, Step{q2, "no", "no attempt was still running, or recorded anything, after a later one started"})

	// 3. Did a later attempt run after an earlier one may have done its
	// effect? Each attempt that ran is paired with the last one before it
	// that ran: the attempts between them did not run, so they did no
	// effect (a Reconcile hook is asked about the attempt before them).
	var notes []string      // why each earlier attempt did not lead to a repeat
	var reconciled *attempt // the first takeover a Reconcile hook settled
	var notRun []int        // the attempts that did not run
	var lastRun *attempt    // the last attempt that ran, or may have
	for jx := range atts {
		b := atts[jx]
		if b.NotRun() {
			notRun = append(notRun, b.Attempt)
			notes = append(notes, fmt.Sprintf("attempt %d did not run (%s)", b.Attempt, notRunDetail(rec.Key, b.JournalEntry)))
			continue
		}
		ap := lastRun
		lastRun = &atts[jx]
		if ap == nil {
			continue
		}
		a := *ap
		between := ""
		if skipped := notRunBetween(atts, a.idx, b.idx); len(skipped) > 0 {
			between = fmt.Sprintf(" (%s between them did not run)", attemptList(skipped))
		}
		if op := releasedBetween(j, a.idx, b.idx); op != nil {
			notes = append(notes, fmt.Sprintf("attempt %d's effect was declared not done%s%s", a.Attempt, resolvedBy(*op), because(op.Reason)))
			continue
		}
		if isReconciled(b.JournalEntry) {
			notes = append(notes, reconciledText(b.JournalEntry, fmt.Sprintf("attempt %d", a.Attempt)))
			if reconciled == nil {
				reconciled = &atts[jx]
			}
			continue
		}
		amo := policyOf(rec, a.JournalEntry) == idem.AtMostOnce.String()
		switch a.Outcome {
		case "", store.OutcomeLapsed, store.OutcomeAbandoned:
			if !b.Takeover {
				continue
			}
			how := "lapsed without recording an outcome"
			if a.Outcome == store.OutcomeAbandoned {
				how = "ended without recording an outcome" + because(a.Reason)
			}
			steps = append(steps, Step{q3, "yes", fmt.Sprintf("attempt %d %s, and attempt %d took it over at %s%s", a.Attempt, how, b.Attempt, stamp(b.Started), between)})
			v := Verdict{Code: CodeTakeover, Cause: CauseCrash, Attempts: []int{a.Attempt, b.Attempt},
				Text: fmt.Sprintf("Send succeeded, recording failed or crashed: attempt %d %s and attempt %d took over (AtLeastOnce repeats the effect; use AtMostOnce or a Reconcile hook to stop that).", a.Attempt, how, b.Attempt)}
			if amo {
				// Only a claim with a Reconcile hook takes over an
				// at_most_once attempt, and the hook did not find the
				// effect done (it would have been recorded as reconciled).
				v.Text = fmt.Sprintf("Send succeeded, recording failed or crashed: attempt %d %s under at_most_once, and attempt %d took over with a Reconcile hook (the only way to take over an at_most_once attempt) that did not find attempt %d's effect done, so it ran again; if the hook missed the effect, it happened twice. Make the hook look the effect up where it happens (the provider's log).",
					a.Attempt, how, b.Attempt, a.Attempt)
			}
			return steps, v
		case store.OutcomeReleased:
			if amo {
				// Under AtMostOnce only idem.NotDone releases.
				notes = append(notes, fmt.Sprintf("attempt %d returned idem.NotDone under at_most_once: its effect did not happen", a.Attempt))
				continue
			}
			steps = append(steps, Step{q3, "yes", fmt.Sprintf("attempt %d returned an error%s under at_least_once and released the key; attempt %d ran again at %s%s", a.Attempt, because(a.Reason), b.Attempt, stamp(b.Started), between)})
			return steps, Verdict{Code: CodeRetriedAfterError, Cause: CauseCrash, Attempts: []int{a.Attempt, b.Attempt},
				Text: fmt.Sprintf("Send succeeded, recording failed: attempt %d returned an error%s, which under AtLeastOnce releases the key, and attempt %d ran again; if attempt %d's effect happened before its error, it happened twice. Return an error only for failures before the effect, or use AtMostOnce (an error then leaves the key indeterminate unless wrapped in idem.NotDone).",
					a.Attempt, because(a.Reason), b.Attempt, a.Attempt)}
		case store.OutcomeFailed:
			notes = append(notes, fmt.Sprintf("attempt %d failed permanently%s", a.Attempt, because(a.Reason)))
		}
	}
	why := "every earlier attempt ended saying its effect did not happen (released by idem.NotDone, or resolved as not done)"
	if len(notes) > 0 {
		why = strings.Join(notes, "; ")
	}
	steps = append(steps, Step{q3, "no", why})
	last := atts[len(atts)-1]
	if lastRun != nil {
		last = *lastRun // the one whose effect is in question
	}
	if StateOf(rec, now) == StateIndeterminate {
		return steps, Verdict{Code: CodeIndeterminate, Cause: CauseNoIdemDup, Attempts: []int{last.Attempt},
			Text: fmt.Sprintf("No second effect from idem's side so far: attempt %d lapsed without recording its outcome under at_most_once, so idem will not run it again; the key is waiting for `idem resolve %s --done|--not-done`.", last.Attempt, rec.Key)}
	}
	if reconciled != nil {
		p := previousRun(atts, reconciled.idx)
		return steps, Verdict{Code: CodeReconciled, Cause: CauseNoIdemDup, Attempts: []int{p.Attempt, reconciled.Attempt},
			Text: fmt.Sprintf("No second effect from idem's side: %s (the hook's result was recorded instead of running again). If two effects were seen anyway, check what the hook looks up.",
				reconciledText(reconciled.JournalEntry, fmt.Sprintf("attempt %d", p.Attempt)))}
	}
	text := fmt.Sprintf("%d attempts, but no second effect could come from idem's side: each earlier attempt ended saying its effect had not happened.", len(atts))
	switch {
	case len(notRun) > 0 && len(notRun)+1 >= len(atts):
		// At most one attempt ran.
		text = fmt.Sprintf("%d attempts, but no second effect could come from idem's side: %s did not run (no effect came from it), so only attempt %d may have done the effect.", len(atts), attemptList(notRun), last.Attempt)
		if lastRun == nil {
			text = fmt.Sprintf("%d attempts, and none ran: no effect came from idem's side.", len(atts))
		}
	case len(notRun) > 0:
		text = fmt.Sprintf("%d attempts, but no second effect could come from idem's side: %s did not run, and each earlier attempt that ran ended saying its effect had not happened.", len(atts), attemptList(notRun))
	}
	return steps, Verdict{Code: CodeNoDuplicate, Cause: CauseNoIdemDup, Attempts: []int{last.Attempt},
		Text: text}
}

// afterExpiryBetween reports whether an attempt after journal position from,
// up to and including to, was claimed after an earlier record's retention
// passed.
func afterExpiryBetween(atts []attempt, from, to int) bool {
	for _, a := range atts {
		if a.idx > from && a.idx <= to && a.AfterExpiry {
			return true
		}
	}
	return false
}

// releasedBetween returns the operator decision entry between journal
// positions from and to that released the key (resolved as not done), or
// nil.
func releasedBetween(j []store.JournalEntry, from, to int) *store.JournalEntry {
	if j[from].Outcome == store.OutcomeResolvedNotDone {
		return &j[from]
	}
	for i := from + 1; i < to; i++ {
		if isDecision(j[i]) && j[i].Outcome == store.OutcomeResolvedNotDone {
			return &j[i]
		}
	}
	return nil
}

func current(rec *idem.Record, s State, now time.Time) string {
	switch s {
	case StateInProgress:
		return fmt.Sprintf("Attempt %d (fence %d, owner %s) is running; its lease ends at %s (in %s) unless a heartbeat extends it.", rec.Attempt, rec.Fence, rec.Owner, stamp(rec.LeaseUntil), dur(rec.LeaseUntil.Sub(now)))
	case StateLapsed:
		if rec.Fingerprint != "" {
			// The stores take a lapsed attempt over only for the same
			// request; a different one gets a mismatch (store.ClaimResult.Answer).
			return fmt.Sprintf("Lapsed since %s: only a delivery of the same request (same fingerprint, or none) takes over as attempt %d and runs again (at_least_once); a different request gets a mismatch, and the key stays as it is until the same request comes, its retention ends at %s, or an operator runs `idem resolve %s`.", stamp(rec.LeaseUntil), rec.Attempt+1, stamp(rec.ExpiresAt), rec.Key)
		}
		return fmt.Sprintf("Lapsed since %s: the next delivery takes over as attempt %d and runs again (at_least_once).", stamp(rec.LeaseUntil), rec.Attempt+1)
	case StateIndeterminate:
		return fmt.Sprintf("Indeterminate since %s: waiting for `idem resolve %s --done` (the effect happened; --result gives what duplicates get) or `--not-done` (it did not; the next delivery runs it).", stamp(rec.LeaseUntil), rec.Key)
	case StateCompleted:
		return fmt.Sprintf("Completed: duplicates get the stored result until %s (retention); a delivery after that runs again.", stamp(rec.ExpiresAt))
	case StateFailed:
		return fmt.Sprintf("Failed for good%s: duplicates get the failure until %s (retention).", because(rec.Reason), stamp(rec.ExpiresAt))
	case StateReleased:
		return fmt.Sprintf("Released: the next delivery runs it as attempt %d.", rec.Attempt+1)
	}
	return string(s)
}

func because(reason string) string {
	if reason == "" {
		return ""
	}
	return fmt.Sprintf(" (%s)", reason)
}

// stamp formats a time for sentences: UTC with milliseconds.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// dur rounds d for people: "20ms", "1.5s", "59m2s", "36h", "7d", "1d12h".
func dur(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + dur(-d)
	case d < time.Millisecond:
		return d.String()
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(10 * time.Millisecond).String()
	case d < 24*time.Hour:
		d = d.Round(time.Second)
		h, m, sec := d/time.Hour, (d%time.Hour)/time.Minute, (d%time.Minute)/time.Second
		return units([]int64{int64(h), int64(m), int64(sec)}, []string{"h", "m", "s"})
	}
	d = d.Round(time.Hour)
	return units([]int64{int64(d / (24 * time.Hour)), int64(d % (24 * time.Hour) / time.Hour)}, []string{"d", "h"})
}

// units writes the values with their units, from the first non-zero one,
// leaving out zero values after it.
func units(v []int64, u []string) string {
	var b strings.Builder
	for i := range v {
		if v[i] != 0 {
			fmt.Fprintf(&b, "%d%s", v[i], u[i])
		}
	}
	return b.String()
}

// Dur formats d the way explanations do (exported for the CLI's other
// outputs).
func Dur(d time.Duration) string { return dur(d) }
