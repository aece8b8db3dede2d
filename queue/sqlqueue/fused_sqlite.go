package sqlqueue

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store"
)

// sqliteLedger is what the fused path needs of a ledger store in the
// queue's SQLite file: sqlitestore.Store's claims and finishes inside a
// unit of work of its own writer, which runs the queue's writes too
// (WithGroupCommit).
type sqliteLedger interface {
	store.Store
	GroupCommitter
	ClaimBatchIn(ctx context.Context, reqs []store.ClaimRequest) ([]store.ClaimResult, error)
	FinishBatchIn(ctx context.Context, reqs []store.FinishRequest) ([]error, error)
}

var _ queue.ClaimingSource = (*SQLiteQueue)(nil)

// checkLedger checks the store of WithLedger: a sqlitestore.Store whose
// writer runs the handle's writes (WithGroupCommit with the same store,
// which WithLedger implies when it is not given).
func (s *SQLite) checkLedger() (sqliteLedger, error) {
	l, ok := s.cfg.ledger.(sqliteLedger)
	if !ok {
		return nil, fmt.Errorf("%w: %T does not claim in its writer's units of work (want a sqlitestore.Store)", ErrLedger, s.cfg.ledger)
	}
	if s.cfg.groupCommit == nil {
		s.cfg.groupCommit = l
	}
	if gc, ok := s.cfg.groupCommit.(sqliteLedger); !ok || gc != l {
		return nil, fmt.Errorf("%w: WithGroupCommit names another committer than the ledger's store", ErrLedger)
	}
	return l, nil
}

// ClaimsFor implements [queue.ClaimingSource]: s is the store the handle
// was given with [WithLedger].
func (q *SQLiteQueue) ClaimsFor(s store.Store) bool {
	return q.s.ledger != nil && s != nil && store.Store(q.s.ledger) == s
}

// ReceiveClaimed implements [queue.ClaimingSource]: Receive, with the
// claims of the keys claim asks for made by the ledger store of
// [WithLedger] in the receive's unit of work, so that they commit
// together. claim runs on the store's writer, as every write waits: the
// consumer's key function (and a typed consumer's decode) should be quick.
func (q *SQLiteQueue) ReceiveClaimed(ctx context.Context, n int, claim func(queue.Message) (store.ClaimRequest, bool)) ([]queue.Delivery, []*idem.Claimed, error) {
	if q.s.ledger == nil {
		return nil, nil, fmt.Errorf("%w: the handle was made without WithLedger", ErrLedger)
	}
	n = max(n, 1)
	backoff := 5 * time.Millisecond
	for {
		if q.s.closed.Load() {
			return nil, nil, ErrClosed
		}
		wake := q.wake.wait()
		ds, claims, err := q.receiveClaimed(ctx, n, claim)
		if err != nil || len(ds) > 0 {
			return ds, claims, err
		}
		if err := q.waitVisible(ctx, &backoff, wake); err != nil {
			return nil, nil, err
		}
	}
}

// receiveClaimed runs the receive statement and the claims in one unit.
//
// The receive still updates the message rows it takes, although the claim
// of a message's key already keeps a second attempt from running its
// handler (issue 20 asked to cut that update). A receive must pass over
// the messages that are taken, or it hands the same ones out again, and
// the claim cannot tell it which those are:
//
//   - The receive picks rows in SQL, by (queue, visible_at, id). The
//     claim is a record under the operation key, which the consumer's key
//     function computes in Go from the message; SQL cannot get from a
//     message to its key. Keys are not one to one with messages either: a
//     copy of a message has its key, its claim answers busy, and it must
//     be retried after a wait, where a taken message must be skipped. A
//     handle could remember the messages it handed out itself; another
//     process's receive would take them, claim their keys, find them busy
//     and retry them, spending on a message whose handler runs the
//     receives that max receives counts, and on every receive it would
//     decode and claim every message in flight, on the writer that every
//     write waits for.
//   - Only a mark under the message's id can be read in the receive: the
//     update (visible_at moved past now), or a column of the key's record
//     naming the message, under an index the claim and the completion
//     write (bench/engine/sqlite/cut.sh, rows 4m). The second is a write
//     too, into the ledger's table, for the queue's sake.
//   - Every other reader of the queue reads visible_at alone: Receive (a
//     consumer without the ledger, an operator's tool), other processes,
//     and a build older than any cut (migrations only add, so an older
//     build runs on a newer schema). Each would hand out a message whose
//     handler is running.
//   - The update also carries the receipt every settle names, the receive
//     count that max receives dead-letters on (a message whose receives
//     are not counted, one that crashes its process each time, is never
//     dead-lettered), the in-flight mark a FIFO group's next message waits
//     on, and the visibility that brings back the message of a handler
//     that ignores its cancelled context while the ledger's heartbeat
//     keeps its key's lease (queue's TestHungHandlerLosesItsDelivery).
//
// So the cut is not made: docs/benchmarks.md ("What the engines allow")
// has what the mark costs at the engine.
func (q *SQLiteQueue) receiveClaimed(ctx context.Context, max int, claim func(queue.Message) (store.ClaimRequest, bool)) ([]queue.Delivery, []*idem.Claimed, error) {
	var (
		ds      []queue.Delivery
		corrupt []corruptRow
		reqs    []store.ClaimRequest
		idx     []int // reqs[j] is ds[idx[j]]'s
		results []store.ClaimResult
		sent    time.Time
	)
	err := q.s.w.do(ctx, func(st *sqliteStmts, now int64) error {
		// The writer may run a unit again: each run starts afresh.
		var err error
		reqs, idx, results = nil, nil, nil
		if ds, corrupt, err = q.receiveIn(st, now, max); err != nil {
			return err
		}
		reqs, idx = make([]store.ClaimRequest, 0, len(ds)), make([]int, 0, len(ds))
		for i, d := range ds {
			if req, ok := claim(d.Message()); ok {
				reqs = append(reqs, req)
				idx = append(idx, i)
			}
		}
		sent = time.Now()
		results, err = q.s.ledger.ClaimBatchIn(st.ctx, reqs)
		return err
	}, nil)
	if err != nil {
		return nil, nil, q.s.wrapErr(fmt.Errorf("sqlqueue: receive from %s: %w", q.name, err))
	}
	if err := ctx.Err(); err != nil {
		// The caller gave up while the writer ran the receive: hand the
		// messages back, and undo the claims no handler will run under.
		q.handBack(ds)
		q.s.undoClaims(results)
		return nil, nil, err
	}
	deadLetterCorrupt(q.s.cfg.logger, q.name, corrupt, q.deadLetter)
	claims := make([]*idem.Claimed, len(ds))
	all := make([]idem.Claimed, len(idx)) // one allocation for the batch's claims
	for j, i := range idx {
		d := ds[i].(*delivery)
		cl := &all[j]
		*cl = idem.Claimed{Request: reqs[j], Result: results[j], Sent: sent}
		if results[j].Acquired {
			cl.Complete = func(ctx context.Context, req store.FinishRequest) error { return q.complete(ctx, req, d) }
		}
		claims[i] = cl
	}
	return ds, claims, nil
}

// undoClaims undoes the acquired claims of a receive whose caller left.
func (s *SQLite) undoClaims(results []store.ClaimResult) {
	ctx, cancel := context.WithTimeout(bg, 30*time.Second)
	defer cancel()
	for _, r := range results {
		if err := store.UndoClaim(ctx, s.ledger, r, "the receiver left before the messages were handed out"); err != nil {
			s.cfg.logger.Warn("sqlqueue: undoing a claim of a receive whose caller left failed; the key waits for its lease", "err", err)
		}
	}
}

// sqliteCompleteCall is one completion of the fused path, put together
// with the others made meanwhile into a unit of the writer (unitGroups),
// as acks are. The unit records every completion (one finish for all,
// FinishBatchIn) and deletes the message of each that landed, so that a
// completion and its ack commit together.
type sqliteCompleteCall struct {
	q       *SQLiteQueue
	d       *delivery
	req     store.FinishRequest
	refused error // the store's answer to this completion: nil, or the lease lost
	deleted bool  // its message was acked with it
}

// complete records req (a completion) and acks d in one unit, shared with
// the other completions made meanwhile. If ctx ends first it returns
// ctx's error, and the completion may still happen.
func (q *SQLiteQueue) complete(ctx context.Context, req store.FinishRequest, d *delivery) error {
	s := q.s
	if s.closed.Load() {
		return ErrClosed
	}
	k := &sqliteCompleteCall{q: q, d: d, req: req}
	g := s.completes.join(k, s.runCompletes)
	if err := g.wait(ctx); err != nil {
		return err
	}
	if g.err != nil {
		return s.wrapErr(fmt.Errorf("sqlqueue: complete and ack message %d of %s: %w", d.id, q.name, g.err))
	}
	return k.refused
}

// runCompletes runs g as one unit of the writer and answers its calls.
func (s *SQLite) runCompletes(g *unitGroup[*sqliteCompleteCall]) {
	err := s.w.do(bg, func(st *sqliteStmts, _ int64) error {
		s.completes.detach(g)
		reqs := make([]store.FinishRequest, len(g.calls))
		for i, k := range g.calls {
			reqs[i] = k.req
		}
		errs, err := s.ledger.FinishBatchIn(st.ctx, reqs)
		if err != nil {
			return err
		}
		for i, k := range g.calls {
			k.refused, k.deleted = errs[i], false
			if errs[i] != nil {
				continue // not done here: its message is not acked
			}
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
	s.completes.detach(g)
	g.err = err
	if err == nil {
		for _, k := range g.calls {
			if !k.deleted {
				continue
			}
			k.d.mu.Lock()
			k.d.completed = true
			k.d.mu.Unlock()
			if k.d.msg.GroupID != "" {
				k.q.wake.wake() // the group's next message is visible now
			}
		}
	}
	close(g.done)
}
