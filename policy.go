package idem

import "fmt"

// Policy answers the question a crash leaves behind: an attempt started and
// never finished, so its effect may or may not have happened; run it again or
// not? The policy is recorded with each claim, and the record's policy (not the
// next caller's) decides what happens to a lapsed attempt.
type Policy uint8

const (
	// AtLeastOnce (the default) runs a lapsed attempt again: the next claim
	// takes the key over (Result.Takeover, fence+1). An effect that happened
	// before the crash happens twice; the takeover is logged. An error from
	// fn releases the key for a retry, unless it is [Permanent].
	AtLeastOnce Policy = iota
	// AtMostOnce never runs a lapsed attempt again by itself: later calls get
	// [ErrIndeterminate] until a Reconcile hook or an operator
	// (`idem resolve`) decides. An error from fn leaves the key indeterminate
	// too, because the effect may have happened before the error, unless fn
	// wraps it in [NotDone] to say nothing happened.
	AtMostOnce
)

// String returns "at_least_once" or "at_most_once", the names stores keep.
func (p Policy) String() string {
	switch p {
	case AtLeastOnce:
		return "at_least_once"
	case AtMostOnce:
		return "at_most_once"
	}
	return fmt.Sprintf("Policy(%d)", uint8(p))
}

// ParsePolicy is the inverse of [Policy.String].
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "at_least_once":
		return AtLeastOnce, nil
	case "at_most_once":
		return AtMostOnce, nil
	}
	return 0, fmt.Errorf("idem: unknown policy %q", s)
}
