package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/store"
)

// WriteTx runs fn inside the group-commit writer's next write transaction,
// the one the store's own claims and completions share, and returns once
// that transaction has committed (or failed). It lets code that keeps its
// tables in the same file (queue/sqlqueue, the caller's own) share the
// store's commits, and so their syncs of the write-ahead log, instead of
// taking turns at SQLite's write lock with transactions of its own.
//
// fn runs in a SAVEPOINT of the transaction tx: when fn returns an error,
// its writes (and only its) are rolled back and WriteTx returns the error
// unchanged; the batch's other operations commit. When fn returns nil,
// its writes commit with the batch, and WriteTx returns nil once the
// COMMIT is durable, or the COMMIT's error (then nothing of the batch was
// written). In the rare case that a statement failure ends the whole
// transaction (SQLITE_FULL, SQLITE_IOERR, a write interrupted because its
// context ended), the writer rolls back and runs the batch's other
// operations again in a new transaction, calling their fn again: fn must
// have no effect outside tx that a second call would repeat.
//
// fn runs on the writer's goroutine while every other write of the store
// waits, so:
//   - keep it short: SQL statements on tx, no network calls, no waiting;
//   - use tx for every read and write of the database, and never call the
//     store's methods (Claim, Finish, InTx, WriteTx, ...) or anything that
//     waits for them: they wait for the writer, which waits for fn. Called
//     with the ctx fn was given they return [ErrOnWriter]; called with
//     another context they deadlock until it ends;
//   - never call tx.Commit or tx.Rollback, nor RELEASE or ROLLBACK TO a
//     savepoint it did not make: the transaction is the batch's. (If fn
//     does call Commit or Rollback, every operation that ran before it in
//     the batch is answered with an error, as its outcome is unknown.)
//
// ctx is passed to fn. If it ends while fn is still queued, WriteTx returns
// ctx's error and fn does not run; once fn has begun, WriteTx waits for the
// transaction's outcome. A panic in fn rolls back its savepoint and is
// raised again in WriteTx's caller.
func (s *Store) WriteTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if s.closed.Load() {
		return errClosed
	}
	return s.w.doUnit(ctx, fn)
}

// InTx implements [store.TxStore] for *sql.Tx (see [idem.DoTx]). It runs as
// one unit of work of the group-commit writer (see [Store.WriteTx]): the
// claim of req, fn and the completion share the writer's transaction with
// the other operations of its batch, inside a savepoint of their own. If
// the claim is not acquired, InTx returns its result without calling fn.
// Otherwise it calls fn with the transaction: when fn returns nil, the key
// is completed with fn's result (kept for retention) in the same
// savepoint, which commits with the batch, so fn's writes and the
// completion happen together or not at all; when fn returns an error, the
// savepoint rolls back (fn's writes and the claim are undone, the key is
// as it was) and InTx returns the error unchanged.
//
// fn runs on the writer's goroutine, so the rules of WriteTx apply: fn
// must be short, must use tx for its reads and writes, must not call
// tx.Commit or tx.Rollback, and must not call the store (or the Ledger on
// it) again (with fn's ctx that returns [ErrOnWriter]; with another context
// it deadlocks until that context ends); in the rare case that the whole batch
// is rolled back by a failed statement, fn may be called again.
func (s *Store) InTx(ctx context.Context, req store.ClaimRequest, retention time.Duration,
	fn func(ctx context.Context, tx *sql.Tx) ([]byte, error)) (store.ClaimResult, []byte, error) {
	if err := req.Check(); err != nil {
		return store.ClaimResult{}, nil, err
	}
	if s.closed.Load() {
		return store.ClaimResult{}, nil, errClosed
	}
	var (
		res     store.ClaimResult
		val     []byte
		storeOp string // the store's step that failed, if one did
		fnErr   error  // fn's error, if it returned one
		ran     bool
	)
	s.stats.ops.Add(2)
	err := s.w.doUnit(ctx, func(ctx context.Context, tx *sql.Tx) error {
		res, val, storeOp, fnErr, ran = store.ClaimResult{}, nil, "", nil, true
		// The claim and the completion are decided in memory and written
		// once, after fn: inside the unit nothing else writes the key, and
		// the savepoint undoes fn's writes when it fails, so the claim
		// would be undone with them. One read and one write instead of two
		// of each: the writer is what every capture waits for.
		var (
			rec   *store.Record
			ver   int64
			floor int64
			err   error
		)
		s.w.raw(func(w *driverRW) error {
			rec, ver, err = w.load(req.Key)
			if err == nil && rec == nil {
				// A new record: its first fence clears the fence floor as
				// this transaction has it.
				floor, err = w.floor()
			}
			return nil
		})
		if err != nil {
			storeOp = "claim"
			return err
		}
		next, _ := claimM(req, &res)(rec, s.now(), floor)
		if !res.Acquired {
			return nil // a claim not acquired writes nothing
		}
		if val, err = fn(ctx, tx); err != nil {
			fnErr = err
			return err
		}
		end := store.FinishRequest{Key: req.Key, Fence: res.Record.Fence, AttemptID: req.AttemptID,
			Outcome: store.OutcomeCompleted, Result: val, Retention: retention}
		// ErrLeaseLost only if the clock passed the claim's expiry while
		// fn ran: a lapsed lease alone does not refuse it, as nothing
		// could take the key over inside the unit.
		done, err := finishM(end)(next, s.now(), 0)
		if err == nil {
			s.w.raw(func(w *driverRW) error {
				_, err = storeIn(w, req.Key, rec == nil, done, ver)
				return nil
			})
		}
		if err != nil {
			storeOp = "complete"
		}
		return err
	})
	s.held.forget(req.Key)
	switch {
	case err == nil:
		return res, val, nil
	case !ran:
		return store.ClaimResult{}, nil, err // ctx's, ErrClosed, or BEGIN's
	case storeOp != "":
		return store.ClaimResult{}, nil, s.txErr(storeOp, err)
	case fnErr != nil && err == fnErr:
		return res, nil, err // unchanged, as idem.DoTx expects
	}
	// The writer's (its COMMIT failed, say): nothing of the unit's is
	// written.
	return res, nil, s.txErr("commit", err)
}

func (s *Store) txErr(op string, err error) error {
	if s.closed.Load() {
		return errClosed
	}
	var ce *store.CorruptError
	if errors.As(err, &ce) || isStmtError(err) {
		return err
	}
	return fmt.Errorf("sqlitestore: intx %s: %w", op, err)
}
