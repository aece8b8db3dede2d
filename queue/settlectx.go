package queue

import (
	"context"
	"sync"
	"time"
)

// settleContext is the context of one Ack, Retry or DeadLetter: the
// caller's values, not its cancellation, and a deadline settleTimeout
// away. Its timer is made only when something asks for Done: a message
// whose completion already settled it (the fused path: the completion
// deleted it) acks without looking at its context, and a timer for every
// such message was a tenth of the fused consumer's allocations.
type settleContext struct {
	parent   context.Context // without cancellation
	deadline time.Time

	mu       sync.Mutex
	inner    context.Context // nil until Done or stop
	cancel   context.CancelFunc
	canceled bool
}

func newSettleContext(ctx context.Context) *settleContext {
	return &settleContext{parent: context.WithoutCancel(ctx), deadline: time.Now().Add(settleTimeout)}
}

func (s *settleContext) Deadline() (time.Time, bool) { return s.deadline, true }
func (s *settleContext) Value(key any) any             { return s.parent.Value(key) }

// Done arms the deadline on first use.
func (s *settleContext) Done() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inner == nil {
		s.inner, s.cancel = context.WithDeadline(s.parent, s.deadline)
		if s.canceled {
			s.cancel()
		}
	}
	return s.inner.Done()
}

func (s *settleContext) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.inner != nil:
		return s.inner.Err()
	case s.canceled:
		return context.Canceled
	case !time.Now().Before(s.deadline):
		return context.DeadlineExceeded
	}
	return nil
}

// stop releases the timer, if Done made one; the context is then
// cancelled.
func (s *settleContext) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.canceled = true
	if s.cancel != nil {
		s.cancel()
	}
}
