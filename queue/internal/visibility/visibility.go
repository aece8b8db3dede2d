// Package visibility keeps a delivery's locally known visibility deadline:
// when the time the broker gave its receiver to settle it (SQS's
// visibility timeout, JetStream's ack wait) lapses, at the earliest, as
// bought by the receive and by each extension since. Once it has passed,
// the broker may have handed the message to another receiver, and an
// adapter whose broker would not say so (sqsqueue, jetstream) refuses to
// act on the delivery rather than act on another receiver's.
package visibility

import "time"

// ReceiveSlack is how long before a receive's answer arrived a delivery's
// visibility is counted from: the broker started it when it handed the
// message out, before the answer made its way back.
const ReceiveSlack = 250 * time.Millisecond

// Deadline is when a delivery's visibility lapses, at the earliest. It is
// not safe for concurrent use: it belongs to one delivery, under the lock
// that serialises the delivery's calls.
type Deadline struct {
	at time.Time
}

// Received returns the deadline of a delivery handed out with visibility d
// in answer to a request sent at asked and answered at answered: d from
// ReceiveSlack before the answer, or from asked if that is later.
func Received(asked, answered time.Time, d time.Duration) Deadline {
	from := answered.Add(-ReceiveSlack)
	if from.Before(asked) {
		from = asked
	}
	return Deadline{at: from.Add(d)}
}

// Lapsed reports whether now is past the deadline.
func (dl Deadline) Lapsed(now time.Time) bool { return now.After(dl.at) }

// Extend records an extension the broker accepted: visibility d from
// started, when its request was sent.
func (dl *Deadline) Extend(started time.Time, d time.Duration) { dl.at = started.Add(d) }

// String is the deadline for error messages (RFC 3339, nanoseconds).
func (dl Deadline) String() string { return dl.at.Format(time.RFC3339Nano) }
