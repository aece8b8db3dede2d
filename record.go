package idem

import "github.com/idemkit/idem/store"

// Record is what the Ledger's store keeps per key: status, fence, attempt
// count, lease, fingerprint, result and a journal of attempts. Operators
// read it (`idem ls`, `idem explain`); [Ledger.Do]'s callers meet only its
// answers.
type Record = store.Record

// Status is a record's stored state. A lapsed attempt is not a status: it is
// an in_progress record whose lease has passed, derived on every read.
type Status = store.Status

// The four statuses.
const (
	StatusInProgress = store.StatusInProgress // an attempt holds (or held) the key
	StatusCompleted  = store.StatusCompleted  // done; duplicates get the result
	StatusFailed     = store.StatusFailed     // failed for good; duplicates get the reason
	StatusReleased   = store.StatusReleased   // claimable at once; numbering continues
)

// Policy answers the question a crash leaves behind: an attempt started and
// never finished, so its effect may or may not have happened; run it again or
// not? The policy is recorded with each claim, and the record's policy (not the
// next caller's) decides what happens to a lapsed attempt.
type Policy = store.Policy

const (
	// AtLeastOnce (the default) runs a lapsed attempt again: the next claim
	// takes the key over (Result.Takeover, a new fence). An effect that
	// happened before the crash happens twice; the takeover is logged. An
	// error from fn releases the key for a retry, unless it is [Permanent].
	AtLeastOnce = store.AtLeastOnce
	// AtMostOnce never runs a lapsed attempt again by itself: later calls get
	// [ErrIndeterminate] until a Reconcile hook or an operator
	// (`idem resolve`) decides. An error from fn leaves the key indeterminate
	// too, because the effect may have happened before the error, unless fn
	// wraps it in [NotDone] to say nothing happened.
	AtMostOnce = store.AtMostOnce
)

// ParsePolicy is the inverse of [Policy.String]: "at_least_once" or
// "at_most_once".
func ParsePolicy(s string) (Policy, error) { return store.ParsePolicy(s) }
