package sqlqueue

import (
	"context"
	"fmt"
	"sync"
)

// sqliteAcks puts a handle's acks together into units of work of its
// writer: an ack made while a unit of acks waits for the writer joins it.
// Each ack is still its own conditional DELETE; what the group shares is
// the unit (the hand-off to the writer, the wake-up, the savepoint the
// store's group commit puts around every unit). A consumer with many
// handlers acks in bursts, and per ack that overhead cost about as much as
// the DELETE itself.
type sqliteAcks struct {
	mu   sync.Mutex
	next *sqliteAckGroup // the group a queued unit will take; nil if none waits
}

// sqliteAckGroup is the acks one unit deletes.
type sqliteAckGroup struct {
	acks []*sqliteAckCall
	err  error         // the unit's outcome, set before done is closed
	done chan struct{} // closed once the unit has committed or failed
}

type sqliteAckCall struct {
	q       *SQLiteQueue
	d       *delivery
	deleted bool // set by the unit's last run
}

// maxAckGroup bounds the acks of one unit, so one unit does not hold the
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
	s.acks.mu.Lock()
	g := s.acks.next
	first := g == nil || len(g.acks) >= maxAckGroup
	if first {
		g = &sqliteAckGroup{done: make(chan struct{})}
		s.acks.next = g
	}
	g.acks = append(g.acks, k)
	s.acks.mu.Unlock()
	if first {
		go s.runAcks(g)
	}
	select {
	case <-g.done:
	case <-ctx.Done():
		return ctx.Err()
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
func (s *SQLite) runAcks(g *sqliteAckGroup) {
	detach := func() {
		s.acks.mu.Lock()
		if s.acks.next == g {
			s.acks.next = nil // later acks start a group of their own
		}
		s.acks.mu.Unlock()
	}
	err := s.w.do(bg, func(st *sqliteStmts, _ int64) error {
		detach()
		// g.acks grows no more. The writer may run a unit again (when
		// another unit's failure rolled the transaction back): every run
		// sets every ack's outcome.
		for _, k := range g.acks {
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
	detach() // the unit may not have run
	g.err = err
	close(g.done)
	if err != nil {
		return
	}
	for _, k := range g.acks {
		if k.deleted && k.d.msg.GroupID != "" {
			k.q.wake.wake() // the group's next message is visible now
		}
	}
}
