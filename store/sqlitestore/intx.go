package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/transition"
)

// InTx implements [idem.TxStore] for *sql.Tx (see [idem.DoTx]). It begins an
// IMMEDIATE transaction on a connection of [Store.DB] (not the group-commit
// writer's; SQLite's write lock serializes the two) and claims req in it. If
// the claim is not acquired, the transaction rolls back and InTx returns
// the claim's result without calling fn. Otherwise it calls fn with the
// transaction: when fn returns nil, the key is completed with fn's result
// (kept for retention) in the same transaction, which then commits, so fn's
// writes and the completion happen together or not at all; when fn returns
// an error, the transaction rolls back (fn's writes and the claim are
// undone, the key is as it was) and InTx returns the error unchanged.
//
// fn must use tx for its writes to the database: another connection would
// wait for the write lock tx holds, until the busy timeout. For the same
// reason fn must not call the Store's own mutating methods (they fail after
// the busy timeout). The write lock is held while fn runs, so every other
// write of the store waits for fn: keep fn short.
func (s *Store) InTx(ctx context.Context, req idem.ClaimRequest, retention time.Duration,
	fn func(ctx context.Context, tx *sql.Tx) ([]byte, error)) (idem.ClaimResult, []byte, error) {
	if s.closed.Load() {
		return idem.ClaimResult{}, nil, errClosed
	}
	unlock := s.lockWrites(ctx)
	defer unlock()
	tx, err := s.db.BeginTx(ctx, nil) // BEGIN IMMEDIATE (_txlock=immediate)
	if err != nil {
		return idem.ClaimResult{}, nil, s.txErr("begin", err)
	}
	rolledBack := false
	rollback := func() {
		if !rolledBack {
			rolledBack = true
			tx.Rollback()
		}
	}
	defer rollback()

	w := newSQLRW(ctx, s.dbStmts.inTx(ctx, tx))
	var res idem.ClaimResult
	if _, _, err := applyIn(w, req.Key, claimM(req, &res), s.now()); err != nil {
		return idem.ClaimResult{}, nil, s.txErr("claim", err)
	}
	if !res.Acquired {
		return res, nil, nil
	}

	val, err := fn(ctx, tx)
	if err != nil {
		rollback()
		return res, nil, err
	}

	end := transition.Ending{Status: idem.StatusCompleted, Result: val, Retention: retention}
	if _, _, err := applyIn(w, req.Key, finishM(res.Record.Fence, end), s.now()); err != nil {
		// ErrLeaseLost only if the clock passed the claim's expiry while
		// fn ran: nobody else can write the key while tx holds the lock.
		return res, nil, s.txErr("complete", err)
	}
	if err := tx.Commit(); err != nil {
		rolledBack = true
		return res, nil, s.txErr("commit", err)
	}
	rolledBack = true
	s.held.forget(req.Key)
	s.stats.ops.Add(2)
	s.stats.commits.Add(1)
	if s.cfg.sync == SyncFull {
		s.stats.syncs.Add(1)
	}
	return res, val, nil
}

func (s *Store) txErr(op string, err error) error {
	if s.closed.Load() {
		return errClosed
	}
	var ce *idem.CorruptError
	if errors.As(err, &ce) || isStmtError(err) {
		return err
	}
	return fmt.Errorf("sqlitestore: intx %s: %w", op, err)
}
