package sqlqueue

import (
	"context"
	"fmt"
)

// sqliteAckCall is one ack of the SQLite handle, put together with the
// others made meanwhile into a unit of its writer (unitGroups). Each ack
// is still its own conditional DELETE; what the group shares is the unit.
type sqliteAckCall struct {
	q       *SQLiteQueue
	d       *delivery
	deleted bool // set by the unit's last run
}

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
