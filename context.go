package idem

import "context"

// Attempt names the attempt fn runs as: its key, fence, number and id,
// and whether it took over a lapsed attempt.
type Attempt struct {
	Key      string
	Fence    int64
	Number   int
	ID       string
	Takeover bool
}

type attemptKey struct{}

// AttemptFromContext returns the attempt that a context given to fn by
// [Ledger.Do] (or [Run]) runs as: a handler reads its fence there to pass
// it downstream, and a queue consumer to log the attempt of a message it
// dead-letters. ok is false outside fn, and under [DoTx], whose claim is
// not visible to others before it commits.
func AttemptFromContext(ctx context.Context) (a Attempt, ok bool) {
	a, ok = ctx.Value(attemptKey{}).(Attempt)
	return a, ok
}

// attemptContext is the context fn's is derived from: the call's, with
// the attempt as a value. It lives in the call's heartbeat, so it costs
// no allocation of its own, and it cancels as its parent does (Done is the
// parent's, so context.WithCancelCause on it still joins the parent's
// cancellation directly, without a goroutine).
type attemptContext struct {
	context.Context
	h *heartbeat
}

func (c *attemptContext) Value(key any) any {
	if key == (attemptKey{}) {
		r := &c.h.rec
		return Attempt{Key: r.Key, Fence: r.Fence, Number: r.Attempt, ID: r.AttemptID, Takeover: c.h.c.takeover}
	}
	return c.Context.Value(key)
}
