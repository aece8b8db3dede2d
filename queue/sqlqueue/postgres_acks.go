package sqlqueue

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/internal/pgarray"
)

// The PostgreSQL handle's acks are grouped (pgGroups): one DELETE and one
// commit for the acks made while the one before was on its way. Acks of
// FIFO group messages are not grouped: they NOTIFY the group's next
// message.

// pgAck is one ack: delete message id if its receipt is still receipt.
type pgAck struct{ id, receipt int64 }

// acker returns the handle's acks, starting their loops on first use, or
// nil once the handle is closed.
func (p *Postgres) acker() *pgGroups[pgAck] {
	p.amu.Lock()
	defer p.amu.Unlock()
	if p.closed.Load() {
		return nil
	}
	if p.acks == nil {
		p.acks = newPGGroups(p.runAcks)
	}
	return p.acks
}

// runAcks deletes batch's messages in one statement and answers each ack:
// nil, or ErrReceiptExpired for a message whose receipt changed.
func (p *Postgres) runAcks(batch []*pgCall[pgAck]) {
	ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
	defer cancel()
	answer := func(deleted func(pgAck) bool, err error) {
		for _, k := range batch {
			switch {
			case err != nil:
				k.err = p.wrapErr(fmt.Errorf("sqlqueue: ack message %d: %w", k.req.id, err))
			case !deleted(k.req):
				k.err = expired(k.req.id)
			}
			close(k.done)
		}
	}
	if len(batch) == 1 {
		a := batch[0].req
		tag, err := p.pool.Exec(ctx, p.n.ack, a.id, a.receipt)
		answer(func(pgAck) bool { return tag.RowsAffected() == 1 }, err)
		return
	}
	ids, receipts := make([]int64, len(batch)), make([]int64, len(batch))
	for i, k := range batch {
		ids[i], receipts[i] = k.req.id, k.req.receipt
	}
	// Keyed by receipt too: a stale ack of a message received again since
	// may share the group with the ack of its new delivery. Each deleted
	// row answers one ack; a second ack of the same delivery finds it gone.
	gone, err := p.deleteMany(ctx, p.pool, ids, receipts)
	if err != nil {
		answer(nil, err)
		return
	}
	answer(func(a pgAck) bool {
		if gone[a] {
			delete(gone, a)
			return true
		}
		return false
	}, nil)
}

// deleteMany deletes on q the messages ids[i] whose receipt is still
// receipts[i] (ackMany), and returns the deliveries it deleted.
func (p *Postgres) deleteMany(ctx context.Context, q querier, ids, receipts []int64) (map[pgAck]bool, error) {
	rows, err := q.Query(ctx, p.n.ackMany, pgarray.Int64s(ids), pgarray.Int64s(receipts))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	deleted := make(map[pgAck]bool, len(ids))
	for rows.Next() {
		var d pgAck
		if err := rows.Scan(&d.id, &d.receipt); err != nil {
			return nil, err
		}
		deleted[d] = true
	}
	return deleted, rows.Err()
}
