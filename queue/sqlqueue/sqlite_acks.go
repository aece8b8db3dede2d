package sqlqueue

import (
	"context"
	"fmt"
	"sync"
)

// unitGroups puts calls of one kind together into units of work of a
// handle's writer: a call made while a unit of its kind waits for the
// writer joins it, up to maxAckGroup calls. The acks of a consumer with
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
	first := g == nil || len(g.calls) >= maxAckGroup
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

type sqliteAckCall struct {
	q       *SQLiteQueue
	d       *delivery
	deleted bool // set by the unit's last run
}

// maxAckGroup bounds the calls of one unit, so one unit does not hold the
// writer for long.
const maxAckGroup = 512

// ack deletes d's message if its receipt is still d's. If ctx ends first,
// ack returns ctx's error and the DELETE may still happen.
func (q *SQLiteQueue) ack(ctx context.Context, d *delivery) error {
	s := q.s
	if s.closed.Load() {
		return ErrClosed
	}
	k := &sqliteAckCall{q: q, d: d}
	g := s.acks.join(k, s.runAcks)
	if err := g.wait(ctx); err != nil {
		return err
	}
	switch {
	case g.err != nil:
		return s.wrapErr(fmt.Errorf("sqlqueue: ack message %d of %s: %w", d.id, q.name, g.err))
	case !k.deleted:
		return expired(d.id)
	}
	return nil
}

// runAcks runs g as one unit of the writer and answers its acks. The unit
// runs with no deadline: its acks share it, and each waits only as long as
// its own context allows.
func (s *SQLite) runAcks(g *unitGroup[*sqliteAckCall]) {
	err := s.w.do(bg, func(st *sqliteStmts, _ int64) error {
		s.acks.detach(g)
		// g.calls grows no more. The writer may run a unit again (when
		// another unit's failure rolled the transaction back): every run
		// sets every ack's outcome.
		for _, k := range g.calls {
			res, err := st.ack.Exec(k.d.id, k.d.receipt)
			if err != nil {
				return err
			}
			n, err := res.RowsAffected()
			if err != nil {
				return err
			}
			k.deleted = n > 0
		}
		return nil
	}, nil)
	s.acks.detach(g) // the unit may not have run
	g.err = err
	close(g.done)
	if err != nil {
		return
	}
	for _, k := range g.calls {
		if k.deleted && k.d.msg.GroupID != "" {
			k.q.wake.wake() // the group's next message is visible now
		}
	}
}
