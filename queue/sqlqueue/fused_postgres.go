package sqlqueue

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgLedger is what the fused path needs of a ledger store in the queue's
// PostgreSQL database: pgstore.Store's claims and finishes inside a
// transaction of the queue's.
type pgLedger interface {
	store.Store
	ClaimBatchTx(ctx context.Context, tx pgx.Tx, reqs []store.ClaimRequest) ([]store.ClaimResult, error)
	FinishBatchTx(ctx context.Context, tx pgx.Tx, reqs []store.FinishRequest) ([]error, error)
}

var _ queue.ClaimingSource = (*PostgresQueue)(nil)

// checkLedger checks the store of WithLedger: one that can claim inside
// the queue's transactions, in the pool's database.
func checkLedger(ctx context.Context, pool *pgxpool.Pool, s store.Store) (pgLedger, error) {
	l, ok := s.(pgLedger)
	if !ok {
		return nil, fmt.Errorf("%w: %T does not claim in a pgx transaction (want a pgstore.Store)", ErrLedger, s)
	}
	sp, ok := s.(interface{ Pool() *pgxpool.Pool })
	if !ok || sp.Pool() == pool {
		return l, nil
	}
	const where = "SELECT current_database(), coalesce(host(inet_server_addr()), ''), coalesce(inet_server_port(), 0)"
	var db1, db2, h1, h2 string
	var p1, p2 int
	if err := pool.QueryRow(ctx, where).Scan(&db1, &h1, &p1); err != nil {
		return nil, fmt.Errorf("sqlqueue: %w", err)
	}
	if err := sp.Pool().QueryRow(ctx, where).Scan(&db2, &h2, &p2); err != nil {
		return nil, fmt.Errorf("sqlqueue: %w", err)
	}
	if db1 != db2 || h1 != h2 || p1 != p2 {
		return nil, fmt.Errorf("%w: the store is in database %s at %s:%d, the queue in %s at %s:%d", ErrLedger, db2, h2, p2, db1, h1, p1)
	}
	return l, nil
}

// ClaimsFor implements [queue.ClaimingSource]: s is the store the handle
// was given with [WithLedger].
func (q *PostgresQueue) ClaimsFor(s store.Store) bool {
	return q.p.ledger != nil && s != nil && store.Store(q.p.ledger) == s
}

// ReceiveClaimed implements [queue.ClaimingSource]: Receive, with the
// claims of the keys claim asks for made by the ledger store of
// [WithLedger] in the receive's transaction. A message of a FIFO group
// gets its claim but no Complete: its ack goes apart, to wake the
// group's next message.
func (q *PostgresQueue) ReceiveClaimed(ctx context.Context, n int, claim func(queue.Message) (store.ClaimRequest, bool)) ([]queue.Delivery, []*idem.Claimed, error) {
	if q.p.ledger == nil {
		return nil, nil, fmt.Errorf("%w: the handle was made without WithLedger", ErrLedger)
	}
	var (
		ds     []queue.Delivery
		claims []*idem.Claimed
	)
	err := q.waitFor(ctx, func() (bool, error) {
		var err error
		ds, claims, err = q.receiveClaimed(ctx, max(n, 1), claim)
		return len(ds) > 0, err
	})
	return ds, claims, err
}

// receiveClaimed runs one receive and its claims in one transaction. As
// receive does, it runs to its end whatever ctx says (bounded at
// receiveTimeout); if ctx has ended before the commit, it rolls back, so
// nothing was received or claimed.
func (q *PostgresQueue) receiveClaimed(ctx context.Context, n int, claim func(queue.Message) (store.ClaimRequest, bool)) ([]queue.Delivery, []*idem.Claimed, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), receiveTimeout)
	defer cancel()
	tx, err := q.p.pool.BeginTx(sctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, nil, q.p.wrapErr(fmt.Errorf("sqlqueue: receive from %s: %w", q.name, err))
	}
	defer tx.Rollback(context.WithoutCancel(sctx)) // after Commit, a no-op
	ds, corrupt, err := q.receiveOn(sctx, tx, n)
	if err != nil {
		return nil, nil, err
	}
	reqs := make([]store.ClaimRequest, 0, len(ds))
	idx := make([]int, 0, len(ds)) // reqs[j] is ds[idx[j]]'s
	for i, d := range ds {
		if req, ok := claim(d.Message()); ok {
			reqs = append(reqs, req)
			idx = append(idx, i)
		}
	}
	sent := time.Now()
	results, err := q.p.ledger.ClaimBatchTx(sctx, tx, reqs)
	if err != nil {
		return nil, nil, fmt.Errorf("sqlqueue: receive from %s: claiming the messages' keys: %w", q.name, err)
	}
	if ctx.Err() != nil {
		return nil, nil, ctx.Err() // rolled back: nothing received, nothing claimed
	}
	if err := tx.Commit(sctx); err != nil {
		// The commit may have landed without its answer: claims of keys
		// whose handlers will never run would hold them for their lease
		// (and leave AtMostOnce keys indeterminate). The messages come
		// back after their visibility timeout.
		go q.p.undoLostClaims(reqs, err)
		return nil, nil, q.p.wrapErr(fmt.Errorf("sqlqueue: receive from %s: %w", q.name, err))
	}
	deadLetterCorrupt(q.p.cfg.logger, q.name, corrupt, q.deadLetter)
	claims := make([]*idem.Claimed, len(ds))
	all := make([]idem.Claimed, len(idx)) // one allocation for the batch's claims
	for j, i := range idx {
		d := ds[i].(*delivery)
		cl := &all[j]
		*cl = idem.Claimed{Request: reqs[j], Result: results[j], Sent: sent}
		if d.msg.GroupID == "" && results[j].Acquired {
			cl.Complete = func(ctx context.Context, req store.FinishRequest) error { return q.complete(ctx, req, d) }
		}
		claims[i] = cl
	}
	return ds, claims, nil
}

// undoLostClaims undoes the claims of reqs that landed in a receive whose
// commit got no answer (cause): fn never ran under them.
func (p *Postgres) undoLostClaims(reqs []store.ClaimRequest, cause error) {
	ctx, cancel := context.WithTimeout(context.Background(), receiveTimeout)
	defer cancel()
	detail := "the receive that claimed it got no answer from its commit: " + cause.Error()
	for _, r := range reqs {
		if _, err := store.UndoLostClaim(ctx, p.ledger, r, detail); err != nil {
			p.cfg.logger.Warn("sqlqueue: undoing a claim whose receive's commit got no answer failed; the key waits for its lease",
				"err", err)
			if ctx.Err() != nil {
				return
			}
		}
	}
}

// complete records req (a completion) and acks d in one commit, shared
// with the other completions made meanwhile. If ctx ends first it returns
// ctx's error, and the completion may still happen.
func (q *PostgresQueue) complete(ctx context.Context, req store.FinishRequest, d *delivery) error {
	c := q.p.completer()
	if c == nil {
		return ErrClosed
	}
	return c.call(ctx, pgCompletion{req: req, d: d})
}

// pgCompletion is one fused completion: the ledger's end of an attempt
// and the ack of its message, committed together in groups (pgGroups), so
// many handlers share one transaction (one WAL flush).
type pgCompletion struct {
	req store.FinishRequest
	d   *delivery
}

// completer returns the handle's completions, starting their loops on
// first use, or nil once the handle is closed.
func (p *Postgres) completer() *pgGroups[pgCompletion] {
	if c := p.running.Load(); c != nil && !p.closed.Load() {
		return c // every completion asks: no lock once it runs
	}
	p.amu.Lock()
	defer p.amu.Unlock()
	if p.closed.Load() {
		return nil
	}
	if p.completes == nil {
		p.completes = newPGGroups(p.runCompletions)
		p.running.Store(p.completes)
	}
	return p.completes
}

// runCompletions commits batch's completions and acks. The acks go
// first, so that the transaction locks message rows before ledger rows,
// as a receive does (which locks its messages, then claims). A completion the store
// refuses (its attempt lost the key) must not ack its message: the
// transaction is then rolled back and run again without that ack.
func (p *Postgres) runCompletions(batch []*pgCall[pgCompletion]) {
	ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
	defer cancel()
	refused := make([]bool, len(batch))
	var (
		errs    []error
		deleted map[pgAck]bool
		err     error
	)
	for range len(batch) + 1 { // each run again refuses one more ack at least
		var again bool
		errs, deleted, again, err = p.tryCompletions(ctx, batch, refused)
		if err != nil || !again {
			break
		}
	}
	for i, k := range batch {
		switch {
		case err != nil:
			k.err = p.wrapErr(fmt.Errorf("sqlqueue: complete and ack message %d: %w", k.req.d.id, err))
		case errs[i] != nil:
			k.err = errs[i]
		case deleted[pgAck{k.req.d.id, k.req.d.receipt}]:
			d := k.req.d
			d.mu.Lock()
			d.completed = true
			d.mu.Unlock()
		}
		close(k.done)
	}
}

// tryCompletions runs one transaction: the acks of batch's messages but the refused
// ones, then the completions. When a completion not yet refused is, it
// marks it refused, rolls back and reports again.
func (p *Postgres) tryCompletions(ctx context.Context, batch []*pgCall[pgCompletion], refused []bool) (errs []error, deleted map[pgAck]bool, again bool, err error) {
	tx, err := p.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, nil, false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // after Commit, a no-op
	ids, receipts := make([]int64, 0, len(batch)), make([]int64, 0, len(batch))
	for i, k := range batch {
		if !refused[i] {
			ids, receipts = append(ids, k.req.d.id), append(receipts, k.req.d.receipt)
		}
	}
	if len(ids) > 0 {
		if deleted, err = p.deleteMany(ctx, tx, ids, receipts); err != nil {
			return nil, nil, false, err
		}
	}
	reqs := make([]store.FinishRequest, len(batch))
	for i, k := range batch {
		reqs[i] = k.req.req
	}
	errs, err = p.ledger.FinishBatchTx(ctx, tx, reqs)
	if err != nil {
		return nil, nil, false, err
	}
	for i, e := range errs {
		if e != nil && !refused[i] {
			refused[i], again = true, true
		}
	}
	if again {
		return errs, nil, true, nil // rolled back
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, false, err
	}
	return errs, deleted, false, nil
}
