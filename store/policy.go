package store

import "fmt"

// Policy answers the question a crash leaves behind: an attempt started and
// never finished, so its effect may or may not have happened; run it again or
// not? The policy is recorded with each claim, and the record's policy (not the
// next caller's) decides what happens to a lapsed attempt.
type Policy uint8

const (
	// AtLeastOnce (idem's default) runs a lapsed attempt again: the next
	// claim takes the key over ([ClaimResult.Takeover], a new fence). An
	// effect that happened before the crash happens twice. The Ledger
	// releases the key when fn fails, unless the error is permanent.
	AtLeastOnce Policy = iota
	// AtMostOnce never runs a lapsed attempt again by itself: a claim finds
	// it (the Ledger answers "indeterminate") until a claim with
	// [ClaimRequest.TakeLapsed] (a Reconcile hook) or a [ResolveRequest]
	// decides. The Ledger leaves the key so when fn fails, unless fn says
	// nothing happened.
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
	return 0, fmt.Errorf("store: unknown policy %q", s)
}
