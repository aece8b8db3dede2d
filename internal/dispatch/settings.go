package dispatch

import (
	"context"
	"math/rand/v2"
	"time"
)

// Settings are the knobs of a [Loop] that its user's options set. The zero
// value is not useful: the user starts from its own documented defaults.
type Settings struct {
	// Concurrency is how many units of work (a delivery without a group,
	// or a FIFO group's deliveries of one batch) are processed at once.
	Concurrency int
	// BatchSize is the most deliveries asked of the source at once; the
	// loop never asks for more than it has free slots.
	BatchSize int
	// Backoff paces the receives after a receive error.
	Backoff Backoff
	// ShutdownTimeout is how long [Loop.Run] lets the units under way
	// finish once its context is done.
	ShutdownTimeout time.Duration
	// ExtendEvery is how often a held delivery is extended; 0 or less:
	// never. See [Extension] for its default.
	ExtendEvery time.Duration
}

// SetConcurrency sets Concurrency; values below 1 are ignored.
func (s *Settings) SetConcurrency(n int) {
	if n > 0 {
		s.Concurrency = n
	}
}

// SetBatchSize sets BatchSize; values below 1 are ignored.
func (s *Settings) SetBatchSize(n int) {
	if n > 0 {
		s.BatchSize = n
	}
}

// SetBackoff sets the backoff's base and cap; a non-positive value leaves
// the one it would set as it is.
func (s *Settings) SetBackoff(base, max time.Duration) {
	if base > 0 {
		s.Backoff.Base = base
	}
	if max > 0 {
		s.Backoff.Max = max
	}
}

// SetShutdownTimeout sets ShutdownTimeout; non-positive values are ignored.
func (s *Settings) SetShutdownTimeout(d time.Duration) {
	if d > 0 {
		s.ShutdownTimeout = d
	}
}

// SetExtendEvery sets ExtendEvery; non-positive values are ignored.
func (s *Settings) SetExtendEvery(d time.Duration) {
	if d > 0 {
		s.ExtendEvery = d
	}
}

// Extension returns how often, and by how much, a delivery from a source
// with the given visibility is extended, given the interval asked for
// (every, 0 when none was): every when it is positive, otherwise a third
// of the visibility (0, never, when the visibility is 0); by the
// visibility, or three times the interval when the visibility is 0.
func Extension(visibility, every time.Duration) (interval, by time.Duration) {
	if visibility > 0 && every == 0 {
		every = visibility / 3
	}
	by = visibility
	if by == 0 {
		by = 3 * every
	}
	return every, by
}

// Backoff is an exponential backoff with jitter.
type Backoff struct {
	Base time.Duration // the delay after the first failure, before jitter
	Max  time.Duration // the cap, before jitter
}

// Delay is the delay after the n-th failure in a row: Base·2^(n-1), capped
// at Max, then jittered to between half and all of it. It does not
// overflow, whatever n and Max (math.MaxInt64 for "no cap"); n below 2
// gives Base.
func (b Backoff) Delay(n int) time.Duration {
	d := b.Base
	for i := 1; i < n && d < b.Max; i++ {
		if d > b.Max/2 {
			d = b.Max // doubling would pass the cap, or overflow
			break
		}
		d *= 2
	}
	d = min(d, b.Max)
	half := d / 2
	return half + rand.N(d-half+1)
}

// minEmptyPause and maxEmptyPause bound the wait between receives that
// return nothing.
const (
	minEmptyPause = 5 * time.Millisecond
	maxEmptyPause = 250 * time.Millisecond
)

// emptyPause is the wait after the n-th receive in a row that returned
// nothing: minEmptyPause doubled per receive, up to maxEmptyPause.
func emptyPause(n int) time.Duration {
	if n > 10 {
		return maxEmptyPause
	}
	return min(minEmptyPause<<n, maxEmptyPause)
}

// sleep waits d or until ctx is done; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
