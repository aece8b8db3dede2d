package queue

import (
	"context"
	"errors"
	"testing"
	"time"
)

type ctxKey struct{}

// TestSettleContext: the lazy settle context keeps the caller's values,
// not its cancellation, and behaves as context.WithDeadline would,
// whether Done is asked before or after its deadline or its stop.
func TestSettleContext(t *testing.T) {
	parent, cancelParent := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	cancelParent()

	s := newSettleContext(parent)
	if s.Value(ctxKey{}) != "v" {
		t.Error("the caller's value is lost")
	}
	if dl, ok := s.Deadline(); !ok || time.Until(dl) < settleTimeout-time.Second {
		t.Errorf("deadline %v, %v; want settleTimeout away", dl, ok)
	}
	if s.Err() != nil {
		t.Errorf("Err = %v for a cancelled caller; want nil", s.Err())
	}
	select {
	case <-s.Done():
		t.Fatal("Done is closed before the deadline")
	default:
	}
	s.stop()
	<-s.Done()
	if !errors.Is(s.Err(), context.Canceled) {
		t.Errorf("Err after stop = %v", s.Err())
	}

	past := &settleContext{parent: context.Background(), deadline: time.Now().Add(-time.Millisecond)}
	if !errors.Is(past.Err(), context.DeadlineExceeded) {
		t.Errorf("Err past the deadline, Done never asked = %v", past.Err())
	}
	<-past.Done()
	if !errors.Is(past.Err(), context.DeadlineExceeded) {
		t.Errorf("Err past the deadline = %v", past.Err())
	}

	stopped := newSettleContext(context.Background())
	stopped.stop()
	if !errors.Is(stopped.Err(), context.Canceled) {
		t.Errorf("Err after stop, Done never asked = %v", stopped.Err())
	}
	<-stopped.Done() // armed after the stop: closed at once

	soon := &settleContext{parent: context.Background(), deadline: time.Now().Add(20 * time.Millisecond)}
	select {
	case <-soon.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done did not close at the deadline")
	}
	if !errors.Is(soon.Err(), context.DeadlineExceeded) {
		t.Errorf("Err at the deadline = %v", soon.Err())
	}
	soon.stop()
}
