package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/idemkit/idem/internal/dupshare"
	"github.com/idemkit/idem/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Store is an [store.Store] kept in one PostgreSQL table. It also
// implements [store.BatchClaimer], [store.BatchFinisher] and [store.TxStore] for [pgx.Tx]; see [SQL]
// for *sql.Tx. Make one with [Open] or [New]; it is safe for concurrent use
// by many goroutines, and any number of processes may use the same table.
type Store struct {
	pool    *pgxpool.Pool
	ownPool bool
	names   names
	q       queries
	closed  atomic.Bool
	// warm is set once the table is large enough for cached plans;
	// warmCheck is when to look at its size next (see plans.go).
	warm      atomic.Bool
	warmCheck atomic.Int64
	// reruns counts claims that ran again because their key changed
	// under them (see claimSQL), for tests.
	reruns atomic.Int64
	// dupes follows how often batch claims have a key with a row, which
	// decides whether a batch starts with claimNewSQL.
	dupes dupshare.Share
}

var (
	_ store.Store           = (*Store)(nil)
	_ store.BatchClaimer    = (*Store)(nil)
	_ store.BatchFinisher   = (*Store)(nil)
	_ store.TxStore[pgx.Tx] = (*Store)(nil)
)

// URL parameters read by [Open] (and removed before the URL is handed to
// pgx): the schema and table of the store, and whether to migrate.
const (
	ParamSchema  = "idem_schema"  // as WithSchema
	ParamTable   = "idem_table"   // as WithTable
	ParamMigrate = "idem_migrate" // "true" or "false", as WithMigrate
)

// Open connects to the database url names, with a pool of its own, and
// returns a store on it, migrating its table unless [WithMigrate](false)
// says otherwise. ctx bounds the opening only.
//
// url is anything pgxpool.ParseConfig accepts: a URL
// (postgres://user:password@host:5432/db?sslmode=disable&pool_max_conns=16)
// or keyword/value pairs (host=... dbname=...), including pgx's pool
// settings. The parameters [ParamSchema], [ParamTable] and [ParamMigrate]
// (e.g. ...?idem_table=billing_keys) set the options of the same names;
// options passed to Open take precedence over them.
//
// The pool's sessions use READ COMMITTED (default_transaction_isolation)
// unless the URL says otherwise. The pool connects on first use: with
// migrations off, Open succeeds without reaching the server.
// [Store.Close] closes the pool.
func Open(ctx context.Context, url string, opts ...Option) (*Store, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	var fromURL []Option
	rp := pc.ConnConfig.RuntimeParams
	if v, ok := rp[ParamSchema]; ok {
		fromURL = append(fromURL, WithSchema(v))
		delete(rp, ParamSchema)
	}
	if v, ok := rp[ParamTable]; ok {
		fromURL = append(fromURL, WithTable(v))
		delete(rp, ParamTable)
	}
	if v, ok := rp[ParamMigrate]; ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("pgstore: %s=%q: want true or false", ParamMigrate, v)
		}
		fromURL = append(fromURL, WithMigrate(b))
		delete(rp, ParamMigrate)
	}
	// The store's statements rely on READ COMMITTED (see claimSQL); a
	// database whose default is stricter would turn racing claims into
	// serialization failures.
	if _, ok := rp["default_transaction_isolation"]; !ok {
		rp["default_transaction_isolation"] = "read committed"
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	s, err := newStore(ctx, pool, true, append(fromURL, opts...))
	if err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// New returns a store on pool, the caller's, migrating its table unless
// [WithMigrate](false) says otherwise. ctx bounds the migration only.
// Closing the store does not close pool.
func New(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*Store, error) {
	if pool == nil {
		return nil, errors.New("pgstore: New: nil pool")
	}
	return newStore(ctx, pool, false, opts)
}

func newStore(ctx context.Context, pool *pgxpool.Pool, own bool, opts []Option) (*Store, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	n := newNames(cfg.schema, cfg.table)
	s := &Store{pool: pool, ownPool: own, names: n, q: newQueries(n.qtable, cfg.clockTable, cfg.implicit)}
	if cfg.migrate {
		if err := migrate(ctx, pool, n); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Pool returns the store's connection pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Table returns the store's table as a quoted identifier, qualified by its
// schema if one was named: for the caller's own queries on it.
func (s *Store) Table() string { return s.names.qtable }

// Close marks the store closed: later calls return an error wrapping
// [store.ErrClosed]. A store from [Open] also closes its pool, waiting for
// the calls in flight to return their connections. Close is idempotent.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	if s.ownPool {
		s.pool.Close()
	}
	return nil
}

var errClosed = fmt.Errorf("pgstore: %w", store.ErrClosed)

// check returns the error a call must return before reaching the database.
func (s *Store) check(ctx context.Context) error {
	if s.closed.Load() {
		return errClosed
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pgstore: %w", err)
	}
	return nil
}

// wrap turns a database error into the store's error for op.
func (s *Store) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if s.closed.Load() {
		return errClosed
	}
	var ce *store.CorruptError
	if errors.As(err, &ce) || errors.Is(err, store.ErrNotFound) {
		return err
	}
	if errors.Is(err, store.ErrLeaseLost) {
		if err != store.ErrLeaseLost {
			return fmt.Errorf("pgstore: %s: %w", op, err)
		}
		return err
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" { // undefined_table
		return fmt.Errorf("%w: %s (open the store with migrations on, or run Store.Migrate); %s: %w",
			ErrNoTable, s.names.qtable, op, err)
	}
	return fmt.Errorf("pgstore: %s: %w", op, err)
}

// querier runs the store's statements: the pool, or a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
