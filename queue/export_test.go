package queue

import "time"

// WithOverrunMargin sets how long past the handler timeout a delivery
// under handling is still extended, in place of the margin derived from
// the ledger (at least 6 s), so that tests of a hung handler take
// milliseconds (tests only).
func WithOverrunMargin(d time.Duration) Option {
	return func(c *config) { c.overrunMargin = d }
}

// DefaultHandlerTimeoutFor is the handler timeout a consumer of a source of
// visibility v takes without WithHandlerTimeout (tests only).
func DefaultHandlerTimeoutFor(v time.Duration) time.Duration { return defaultHandlerTimeout(v) }

// BusyWait is c's retry delay of a busy message (tests only).
func BusyWait(c *Consumer, receive int, running, leaseLeft time.Duration) time.Duration {
	return c.busyWait(receive, running, leaseLeft)
}
