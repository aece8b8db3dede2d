// Package explain tells a key's story from its record and attempt journal,
// and walks the "two emails, one booking" decision tree over it: was
// completion recorded before the second attempt, did attempts overlap, was
// there a takeover after a lapse. It reads only an [idem.Record] and the
// store's clock, so it works the same on every store.
package explain

import (
	"time"

	"github.com/idemkit/idem"
)

// State is a record's state as an operator sees it: the stored status, with
// in_progress split by its lease.
type State string

const (
	// StateInProgress: an attempt holds the key and its lease is running.
	StateInProgress State = "in_progress"
	// StateLapsed: an AtLeastOnce attempt's lease passed without an
	// outcome; the next claim takes over and runs again. With a
	// fingerprint on the record, only a claim of the same request (the
	// same fingerprint, or none) takes over; a different request gets a
	// mismatch and leaves the key as it is.
	StateLapsed State = "lapsed"
	// StateIndeterminate: an AtMostOnce attempt's lease passed without an
	// outcome; nothing runs the key again until it is resolved.
	StateIndeterminate State = "indeterminate"
	StateCompleted     State = "completed"
	StateFailed        State = "failed"
	StateReleased      State = "released"
)

// StateOf derives r's state at now (the store's clock).
func StateOf(r *idem.Record, now time.Time) State {
	switch r.Status {
	case idem.StatusInProgress:
		switch {
		case !r.Lapsed(now):
			return StateInProgress
		case r.Indeterminate(now):
			return StateIndeterminate
		}
		return StateLapsed
	case idem.StatusCompleted:
		return StateCompleted
	case idem.StatusFailed:
		return StateFailed
	case idem.StatusReleased:
		return StateReleased
	}
	return State(r.Status)
}

// Stuck reports whether s needs a takeover or an operator.
func (s State) Stuck() bool { return s == StateLapsed || s == StateIndeterminate }

// Describe says in a few words what s means for the next delivery.
func (s State) Describe() string {
	switch s {
	case StateInProgress:
		return "an attempt holds the key; other deliveries get ErrInProgress until its lease ends"
	case StateLapsed:
		return "lapsed, next claim takes over (at_least_once: the effect may repeat)"
	case StateIndeterminate:
		return "indeterminate: an at_most_once attempt lapsed without recording its outcome; waiting for `idem resolve`"
	case StateCompleted:
		return "done; duplicates get the stored result"
	case StateFailed:
		return "failed for good; duplicates get the stored reason"
	case StateReleased:
		return "claimable at once; the next delivery runs it"
	}
	return string(s)
}

// DescribeFor is [State.Describe] for r, whose state is s: a lapsed record
// with a fingerprint is taken over only by the same request (the same
// fingerprint, or none); a different request gets a mismatch.
func (s State) DescribeFor(r *idem.Record) string {
	if s == StateLapsed && r.Fingerprint != "" {
		return "lapsed; the same request's next claim takes over (at_least_once: the effect may repeat), a different request gets a mismatch"
	}
	return s.Describe()
}
