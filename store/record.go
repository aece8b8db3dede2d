package store

import (
	"fmt"
	"strings"
	"time"
)

// Status is a record's stored state. A lapsed attempt is not a status: it is
// an in_progress record whose lease has passed, derived on every read.
type Status string

const (
	StatusInProgress Status = "in_progress" // an attempt holds (or held) the key
	StatusCompleted  Status = "completed"   // done; duplicates get the result
	StatusFailed     Status = "failed"      // failed for good; duplicates get the reason
	StatusReleased   Status = "released"    // claimable at once; numbering continues
)

// Valid reports whether s is one of the four statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusInProgress, StatusCompleted, StatusFailed, StatusReleased:
		return true
	}
	return false
}

// ParseStatus checks s and returns it as a Status.
func ParseStatus(s string) (Status, error) {
	if st := Status(s); st.Valid() {
		return st, nil
	}
	return "", fmt.Errorf("store: unknown status %q", s)
}

// MaxJournal is how many attempts a record's journal keeps (the newest).
const MaxJournal = 16

// Record is what a store keeps per key. Times are the store's clock.
type Record struct {
	Key    string
	Status Status
	Policy Policy // the policy of the latest claim; decides a lapsed attempt
	Fence  int64  // grows with every successful claim or resolution; never repeats for a key
	// AttemptID is the id of the latest attempt ([ClaimRequest.AttemptID]).
	// While the record is in_progress it names the attempt that holds the
	// key, lapsed or not; an abandoned attempt gives it up ("": it can end
	// only once), and its journal entry keeps it.
	AttemptID   string
	Attempt     int    // number of claims the store remembers for the key
	Owner       string // holder of the latest claim
	Fingerprint string // hex sha256 named by the caller as "the request"; "" if none
	Result      []byte // completed: the result
	Reason      string // failed: the permanent error; otherwise the last error reported
	LeaseUntil  time.Time
	ExpiresAt   time.Time // retention: the record counts as absent from then on
	CreatedAt   time.Time
	UpdatedAt   time.Time
	// Journal holds the newest [MaxJournal] attempts, oldest first. It is what
	// `idem explain` reads to tell a takeover from an overlap.
	Journal []JournalEntry
}

// Lapsed reports whether r is an in_progress record whose lease has passed
// at now: an attempt that never finished.
func (r *Record) Lapsed(now time.Time) bool {
	return r.Status == StatusInProgress && !now.Before(r.LeaseUntil)
}

// Indeterminate reports whether r is lapsed at now ([Record.Lapsed]) and
// its policy is AtMostOnce: an attempt that never recorded its outcome and
// that no claim takes over by itself. It waits for a Reconcile hook (a
// claim with [ClaimRequest.TakeLapsed]) or an operator's [ResolveRequest].
// A lapsed AtLeastOnce record is not indeterminate: its next claim takes
// it over.
func (r *Record) Indeterminate(now time.Time) bool {
	return r.Lapsed(now) && r.Policy == AtMostOnce
}

// Expired reports whether r's retention has passed at now.
func (r *Record) Expired(now time.Time) bool { return !now.Before(r.ExpiresAt) }

// Outcome is how an attempt ended, in its journal entry; the first four
// are what [Store.Finish] records.
type Outcome string

// The outcomes.
const (
	OutcomeCompleted       Outcome = "completed"
	OutcomeFailed          Outcome = "failed"
	OutcomeReleased        Outcome = "released"
	OutcomeAbandoned       Outcome = "abandoned"         // ended its own lease without an outcome (AtMostOnce error, panic)
	OutcomeLapsed          Outcome = "lapsed"            // its lease passed and another attempt took over
	OutcomeResolvedDone    Outcome = "resolved-done"     // an operator or Reconcile hook said the effect happened
	OutcomeResolvedNotDone Outcome = "resolved-not-done" // an operator said it did not
)

// EntryOf returns the journal entry of the attempt with id attemptID, if
// the journal still holds it: how a caller whose finishing write's answer
// was lost learns whether the write landed.
func (r *Record) EntryOf(attemptID string) (JournalEntry, bool) {
	if attemptID == "" {
		return JournalEntry{}, false
	}
	for i := len(r.Journal) - 1; i >= 0; i-- {
		if r.Journal[i].AttemptID == attemptID && !r.Journal[i].Decision {
			return r.Journal[i], true
		}
	}
	return JournalEntry{}, false
}

// notRunPrefix begins the reason recorded for an attempt that ended
// without running its operation (NotRunReason).
const notRunPrefix = "idem: not run: "

// NotRunReason returns the reason to record for an attempt that ends
// without running its operation: a claim whose caller left before it was
// answered, a Reconcile hook that failed, a claim a store undid. It begins
// "idem: not run: ". Such an attempt did no effect: a Reconcile hook is
// asked about the attempt before it instead, and `idem explain` does not
// count it as one that may have done the effect.
func NotRunReason(detail string) string { return notRunPrefix + detail }

// NotRun reports whether the attempt ended without running its operation
// (its reason was made by [NotRunReason]).
func (e JournalEntry) NotRun() bool { return IsNotRun(e.Reason) }

// IsNotRun reports whether reason was made by [NotRunReason].
func IsNotRun(reason string) bool { return strings.HasPrefix(reason, notRunPrefix) }

// JournalEntry is one attempt in a record's journal.
type JournalEntry struct {
	Attempt     int       `json:"a"`
	Fence       int64     `json:"f"`
	AttemptID   string    `json:"i,omitempty"`
	Owner       string    `json:"o,omitempty"`
	Correlation string    `json:"c,omitempty"` // the caller's correlation id (message id, request id)
	Started     time.Time `json:"s"`
	LeaseUntil  time.Time `json:"l"`           // the last lease granted, claim or heartbeat
	Ended       time.Time `json:"e,omitzero"`  // when its outcome was recorded
	Outcome     Outcome   `json:"x,omitempty"` // "" while running or unknown
	Reason      string    `json:"r,omitempty"`
	Takeover    bool      `json:"t,omitempty"`  // claimed over a lapsed attempt
	AfterExpiry bool      `json:"ae,omitempty"` // claimed after an earlier record's retention passed
	Policy      string    `json:"p,omitempty"`  // the claim's policy (Policy.String)
	// LateFinish is when this attempt, after its lease had been taken over,
	// tried to extend its lease or record an outcome: it was still running
	// while a later attempt ran, so their effects may have overlapped.
	LateFinish time.Time `json:"lf,omitzero"`
	// ResolvedBy names who recorded a resolved-* outcome: an operator, or
	// the holder's Reconcile hook.
	ResolvedBy string `json:"rb,omitempty"`
	// Decision marks an entry that records a resolution of a key with no
	// open attempt: a decision, not an attempt (it repeats the attempt
	// number of the entry before it).
	Decision bool `json:"d,omitempty"`
}
