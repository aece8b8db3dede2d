package sqlqueue

import (
	"context"
	"sync"
)

// unitGroups puts calls of one kind together into units of work of a
// handle's writer: a call made while a unit of its kind waits for the
// writer joins it, up to maxUnitCalls calls. The acks of a consumer with
// many handlers come in bursts, and per ack the unit's overhead (the
// hand-off to the writer, the wake-up, the savepoint the store's group
// commit puts around every unit) cost about as much as the DELETE itself;
// so do the fused path's completions.
type unitGroups[C any] struct {
	mu   sync.Mutex
	next *unitGroup[C] // the group a queued unit will take; nil if none waits
}

// unitGroup is the calls one unit runs.
type unitGroup[C any] struct {
	calls []C
	err   error         // the unit's outcome, set before done is closed
	done  chan struct{} // closed once the unit has committed or failed
}

// join adds c to the group a queued unit will take, or starts a group and
// runs it (run(g), on a goroutine of its own), and returns c's group.
func (u *unitGroups[C]) join(c C, run func(g *unitGroup[C])) *unitGroup[C] {
	u.mu.Lock()
	g := u.next
	first := g == nil || len(g.calls) >= maxUnitCalls
	if first {
		g = &unitGroup[C]{done: make(chan struct{})}
		u.next = g
	}
	g.calls = append(g.calls, c)
	u.mu.Unlock()
	if first {
		go run(g)
	}
	return g
}

// detach closes g to new calls, which start a group of their own: its
// unit has begun (g.calls grows no more) or ended.
func (u *unitGroups[C]) detach(g *unitGroup[C]) {
	u.mu.Lock()
	if u.next == g {
		u.next = nil
	}
	u.mu.Unlock()
}

// wait waits for g's unit, or returns ctx's error first (the unit may
// still run its call).
func (g *unitGroup[C]) wait(ctx context.Context) error {
	select {
	case <-g.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// maxUnitCalls bounds the calls of one unit, so one unit does not hold the
// writer for long.
const maxUnitCalls = 512
