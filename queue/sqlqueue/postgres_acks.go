package sqlqueue

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem/internal/pgarray"
)

// pgAcks deletes acked messages in groups: acks made while a DELETE is on
// its way wait for the next one, so a consumer with many handlers spends
// one statement and one commit on many acks instead of one each (each
// commit waits for a WAL flush). A lone ack goes at once. Acks of FIFO
// group messages are not grouped: they NOTIFY the group's next message.
type pgAcks struct {
	p       *Postgres
	queue   chan *pgAck
	stop    chan struct{}
	stopped sync.WaitGroup
	exited  chan struct{} // closed when the loops have returned
}

type pgAck struct {
	id, receipt int64
	err         error
	done        chan struct{}
}

const (
	// ackFlights is how many grouped DELETEs may be on their way at once.
	ackFlights = 2
	// ackGroup bounds the acks of one DELETE.
	ackGroup = 512
	// ackTimeout bounds one grouped DELETE (acks wait for it whatever
	// their own contexts say: others share it).
	ackTimeout = 30 * time.Second
)

// acker returns the handle's acker, starting it on first use, or nil once
// the handle is closed.
func (p *Postgres) acker() *pgAcks {
	p.amu.Lock()
	defer p.amu.Unlock()
	if p.closed.Load() {
		return nil
	}
	if p.acks == nil {
		a := &pgAcks{p: p, queue: make(chan *pgAck, ackGroup), stop: make(chan struct{}), exited: make(chan struct{})}
		for range ackFlights {
			a.stopped.Add(1)
			go a.loop()
		}
		p.acks = a
	}
	return p.acks
}

// ack deletes message id if its receipt is still receipt. If ctx ends
// first, ack returns ctx's error and the DELETE may still happen.
func (a *pgAcks) ack(ctx context.Context, id, receipt int64) error {
	k := &pgAck{id: id, receipt: receipt, done: make(chan struct{})}
	select {
	case a.queue <- k:
	case <-a.stop:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-k.done:
		return k.err
	case <-ctx.Done():
		return ctx.Err()
	case <-a.exited:
		select {
		case <-k.done:
			return k.err
		default:
			return ErrClosed // queued as the loops stopped
		}
	}
}

func (a *pgAcks) loop() {
	defer a.stopped.Done()
	batch := make([]*pgAck, 0, ackGroup)
	for {
		select {
		case k := <-a.queue:
			batch = append(batch[:0], k)
		case <-a.stop:
			a.drain()
			return
		}
	more:
		for len(batch) < ackGroup {
			select {
			case k := <-a.queue:
				batch = append(batch, k)
			default:
				break more
			}
		}
		a.run(batch)
	}
}

// drain answers the acks still queued when the handle closes.
func (a *pgAcks) drain() {
	for {
		select {
		case k := <-a.queue:
			k.err = ErrClosed
			close(k.done)
		default:
			return
		}
	}
}

// run deletes batch's messages in one statement and answers each ack:
// nil, or ErrReceiptExpired for a message whose receipt changed.
func (a *pgAcks) run(batch []*pgAck) {
	ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
	defer cancel()
	p := a.p
	answer := func(deleted func(*pgAck) bool, err error) {
		for _, k := range batch {
			switch {
			case err != nil:
				k.err = p.wrapErr(fmt.Errorf("sqlqueue: ack message %d: %w", k.id, err))
			case !deleted(k):
				k.err = expired(k.id)
			}
			close(k.done)
		}
	}
	if len(batch) == 1 {
		tag, err := p.pool.Exec(ctx, p.n.ack, batch[0].id, batch[0].receipt)
		answer(func(*pgAck) bool { return tag.RowsAffected() == 1 }, err)
		return
	}
	ids, receipts := make([]int64, len(batch)), make([]int64, len(batch))
	for i, k := range batch {
		ids[i], receipts[i] = k.id, k.receipt
	}
	rows, err := p.pool.Query(ctx, p.n.ackMany, pgarray.Int64s(ids), pgarray.Int64s(receipts))
	if err != nil {
		answer(nil, err)
		return
	}
	// Keyed by receipt too: a stale ack of a message received again since
	// may share the group with the ack of its new delivery. Each deleted
	// row answers one ack; a second ack of the same delivery finds it gone.
	type delivered struct{ id, receipt int64 }
	gone := make(map[delivered]bool, len(batch))
	for rows.Next() {
		var d delivered
		if err := rows.Scan(&d.id, &d.receipt); err != nil {
			rows.Close()
			answer(nil, err)
			return
		}
		gone[d] = true
	}
	if err := rows.Err(); err != nil {
		answer(nil, err)
		return
	}
	answer(func(k *pgAck) bool {
		d := delivered{k.id, k.receipt}
		if gone[d] {
			delete(gone, d)
			return true
		}
		return false
	}, nil)
}

// close stops the loops: an ack a loop has taken is finished (each group
// bounded by ackTimeout), the others get ErrClosed.
func (a *pgAcks) close() {
	close(a.stop)
	a.stopped.Wait()
	close(a.exited)
}
