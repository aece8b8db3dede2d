package pgstore

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idem/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// InTx implements [store.TxStore] for [pgx.Tx] (see [idem.DoTx]). It begins
// a READ COMMITTED transaction on the store's pool and claims req in it.
// If the claim is not acquired, the transaction rolls back and InTx
// returns the claim's result without calling fn. Otherwise it calls fn
// with the transaction: when fn returns nil, the key is completed with fn's
// result (kept for retention) in the same transaction, which then commits,
// so fn's writes and the completion happen together or not at all; when fn
// returns an error, the transaction rolls back (fn's writes and the claim
// are undone, the key is as it was) and InTx returns the error unchanged.
//
// The claimed row stays locked until the transaction ends: a concurrent
// claim of the key (in or out of a transaction) waits for it, then finds
// the key completed, or claims it if this transaction rolled back. Keep fn
// short. fn must not commit or roll back tx itself.
//
// The claim's clock is the statement's (statement_timestamp()), so the
// completion records the time fn ended.
func (s *Store) InTx(ctx context.Context, req store.ClaimRequest, retention time.Duration,
	fn func(ctx context.Context, tx pgx.Tx) ([]byte, error)) (store.ClaimResult, []byte, error) {
	if err := s.check(ctx); err != nil {
		return store.ClaimResult{}, nil, err
	}
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return store.ClaimResult{}, nil, s.wrap("begin", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // after Commit, a no-op
	return s.runTx(ctx, req, retention,
		func(op func(q querier) error) error { return op(tx) },
		func(ctx context.Context) ([]byte, error) { return fn(ctx, tx) },
		func() error { return tx.Commit(ctx) })
}

// runTx is InTx on a transaction already begun: on runs the store's
// statements in it, fn is the caller's function, commit commits it. The
// caller rolls the transaction back unless commit was called.
func (s *Store) runTx(ctx context.Context, req store.ClaimRequest, retention time.Duration,
	on func(op func(q querier) error) error, fn func(ctx context.Context) ([]byte, error), commit func() error) (store.ClaimResult, []byte, error) {
	if err := req.Check(); err != nil {
		return store.ClaimResult{}, nil, err
	}
	var res store.ClaimResult
	err := on(func(q querier) (err error) {
		res, err = s.claimOne(ctx, q, req)
		return err
	})
	if err != nil {
		return store.ClaimResult{}, nil, s.wrap("claim", err)
	}
	if !res.Acquired {
		return res, nil, nil
	}
	val, err := fn(ctx)
	if err != nil {
		return res, nil, err
	}
	err = on(func(q querier) error {
		return s.finish(ctx, q, store.FinishRequest{Key: req.Key, Fence: res.Record.Fence, AttemptID: res.Record.AttemptID,
			Outcome: store.OutcomeCompleted, Result: val, Retention: retention})
	})
	if err != nil {
		// ErrLeaseLost only if the record's retention passed while fn ran:
		// nobody else can write the row while the transaction holds it.
		return res, nil, s.wrap("complete", err)
	}
	if err := commit(); err != nil {
		return res, nil, s.wrap("commit", err)
	}
	return res, val, nil
}

// SQLStore is a [Store] for database/sql users: it implements
// [store.TxStore] for *sql.Tx, so [idem.DoTx] can run the caller's
// database/sql code in the transaction of the claim. Make one with [SQL].
//
// A Go type has one InTx method, so one type cannot implement
// store.TxStore for both pgx.Tx and *sql.Tx: Store does the former,
// SQLStore (which embeds it) the latter.
type SQLStore struct {
	*Store
	once sync.Once
	db   *sql.DB
}

var _ store.TxStore[*sql.Tx] = (*SQLStore)(nil)

// SQL returns s for database/sql users. Its transactions run on a *sql.DB
// (pgx's stdlib driver) over s's pool, so they share the pool's
// connections and settings; [SQLStore.DB] returns it for the caller's
// other queries. Closing the SQLStore closes that *sql.DB and s.
func SQL(s *Store) *SQLStore { return &SQLStore{Store: s} }

// DB returns the *sql.DB over the store's pool that InTx uses.
func (s *SQLStore) DB() *sql.DB {
	s.once.Do(func() { s.db = stdlib.OpenDBFromPool(s.pool) })
	return s.db
}

// Close closes the *sql.DB of [SQLStore.DB] and the Store.
func (s *SQLStore) Close() error {
	s.once.Do(func() {}) // no *sql.DB to make from now on
	if s.db != nil {
		s.db.Close()
	}
	return s.Store.Close()
}

// InTx implements [store.TxStore] for *sql.Tx: what [Store.InTx] does, on a
// database/sql transaction. The store's own statements run through pgx on
// the transaction's connection (sql.Conn.Raw), inside the transaction.
func (s *SQLStore) InTx(ctx context.Context, req store.ClaimRequest, retention time.Duration,
	fn func(ctx context.Context, tx *sql.Tx) ([]byte, error)) (store.ClaimResult, []byte, error) {
	if err := s.check(ctx); err != nil {
		return store.ClaimResult{}, nil, err
	}
	conn, err := s.DB().Conn(ctx)
	if err != nil {
		return store.ClaimResult{}, nil, s.wrap("begin", err)
	}
	defer conn.Close()
	tx, err := conn.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return store.ClaimResult{}, nil, s.wrap("begin", err)
	}
	defer tx.Rollback() // after Commit, a no-op
	return s.runTx(ctx, req, retention,
		func(op func(q querier) error) error {
			return conn.Raw(func(dc any) error {
				c, ok := dc.(*stdlib.Conn)
				if !ok {
					return fmt.Errorf("pgstore: database/sql connection is %T, not pgx's", dc)
				}
				return op(c.Conn())
			})
		},
		func(ctx context.Context) ([]byte, error) { return fn(ctx, tx) },
		tx.Commit)
}
