package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/internal/dupshare"
	"github.com/idemkit/idem/store"

	"modernc.org/sqlite" // registers the "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"
)

// Store is an [store.Store] kept in one SQLite database file. It also
// implements [store.BatchClaimer] and [store.TxStore] for *sql.Tx. Open one
// with [Open]; it is safe for concurrent use by many goroutines, and any
// number of processes may open the same file.
type Store struct {
	cfg  config
	path string

	db  *sql.DB // read-write pool: DB(), the writer's connection, migrations
	rdb *sql.DB // read-only pool: Get, List

	spStmts [4]*sql.Stmt // on db: sqlSavepoint, sqlRelease, sqlRollbackTo, SELECT 1; bound to the writer's transactions
	getStmt *sql.Stmt    // on rdb

	w     *writer
	held  heldRecords
	dupes dupshare.Share
	// floorSeen is the highest fence floor (migration 004) a transaction
	// of this store has read: claims of new keys decided before the writer
	// start above it, and the insert's condition checks the floor as it is.
	floorSeen atomic.Int64
	// wlock is this process's turn at SQLite's write lock, taken by the
	// writer for each batch and by callers of LockWrites for their
	// transactions, so that they hand the lock over at once instead of polling for it in SQLite's
	// busy handler (which sleeps up to 100 ms between tries). Other
	// processes and the callers' own transactions on DB() still meet at
	// SQLite's lock.
	wlock chan struct{}

	closeOnce sync.Once
	closed    atomic.Bool

	stats struct {
		ops, commits, syncs, batches, batchedOps, rollbacks atomic.Int64
	}
}

// Stats are counters of a [Store]'s work since it was opened.
type Stats struct {
	// Ops counts mutating calls: claims (each claim of a ClaimBatch
	// counts), finishes (each of a FinishBatch counts), extends,
	// resolves, deletes, sweeps, and InTx calls (as two: the claim and the
	// completion). A call answered without a write (a duplicate, a busy
	// key) counts too.
	Ops int64
	// Commits counts committed write transactions that changed the
	// database.
	Commits int64
	// Syncs counts the syncs of the write-ahead log that made commits
	// durable (none under SyncNormal). Group commit shares one sync among
	// many operations: Syncs/Ops is the syncs per operation.
	Syncs int64
	// Batches counts the transactions of the group-commit writer, and
	// BatchedOps the operations they ran; BatchedOps/Batches is the mean
	// batch size.
	Batches, BatchedOps int64
	// Rollbacks counts writer transactions rolled back because a statement
	// failed; the batch's other operations ran again in a new transaction.
	Rollbacks int64
}

// Open opens (creating it if needed) the SQLite database at path, applies
// the store's migrations, and starts the store's writer. path is a file
// name, not a URI; it must not contain '?'. ctx bounds the opening only.
// With [WithMigrate](false) it neither creates, migrates nor switches the
// file to WAL mode, and refuses a file without this build's schema.
//
// The database is put in WAL mode; the write connections use
// synchronous=FULL unless [WithSynchronous] says otherwise, and wait
// [DefaultBusyTimeout] for the write lock unless [WithBusyTimeout] says
// otherwise.
func Open(ctx context.Context, path string, opts ...Option) (*Store, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case path == "" || path == ":memory:" || strings.HasPrefix(path, "file:"):
		return nil, fmt.Errorf("sqlitestore: open %q: path must name a database file", path)
	case strings.ContainsRune(path, '?'):
		return nil, fmt.Errorf("sqlitestore: open %q: path must not contain '?'", path)
	}
	switch cfg.sync {
	case SyncFull, SyncNormal:
	default:
		return nil, fmt.Errorf("sqlitestore: unknown synchronous mode %q", cfg.sync)
	}

	if !cfg.migrate {
		if err := fileExists(path); err != nil {
			return nil, fmt.Errorf("sqlitestore: open %q: %w", path, err)
		}
	}
	s := &Store{cfg: cfg, path: path, wlock: make(chan struct{}, 1)}
	busy := strconv.FormatInt(cfg.busyTimeout.Milliseconds(), 10)
	q := url.Values{}
	q.Add("_pragma", "busy_timeout("+busy+")")
	q.Add("_pragma", "synchronous("+string(cfg.sync)+")")
	q.Set("_txlock", "immediate")
	var err error
	if s.db, err = sql.Open("sqlite", path+"?"+q.Encode()); err != nil {
		return nil, fmt.Errorf("sqlitestore: open %q: %w", path, err)
	}
	s.db.SetMaxIdleConns(4)
	s.db.SetConnMaxIdleTime(time.Minute)

	fail := func(err error) (*Store, error) {
		s.closeDBs()
		return nil, fmt.Errorf("sqlitestore: open %q: %w", path, err)
	}
	if cfg.migrate {
		if err := s.walMode(ctx); err != nil {
			return fail(err)
		}
		if err := migrate(ctx, s.db, s.now(), cfg.logger); err != nil {
			return fail(err)
		}
	} else if err := checkSchema(ctx, s.db); err != nil {
		return fail(err)
	}

	rq := url.Values{}
	rq.Add("_pragma", "busy_timeout("+busy+")")
	rq.Add("_pragma", "query_only(1)")
	if s.rdb, err = sql.Open("sqlite", path+"?"+rq.Encode()); err != nil {
		return fail(err)
	}
	s.rdb.SetMaxOpenConns(cfg.readConns)
	s.rdb.SetMaxIdleConns(cfg.readConns)
	if s.getStmt, err = s.rdb.PrepareContext(ctx, sqlLoad); err != nil {
		return fail(err)
	}
	for i, q := range []string{sqlSavepoint, sqlRelease, sqlRollbackTo, "SELECT 1"} {
		if s.spStmts[i], err = s.db.PrepareContext(ctx, q); err != nil {
			return fail(err)
		}
	}
	if s.w, err = newWriter(ctx, s); err != nil {
		return fail(err)
	}
	return s, nil
}

// walMode puts the database in WAL mode, which the file keeps. Switching
// takes an exclusive lock for which SQLite does not wait (it fails with
// SQLITE_BUSY at once while another process opens the file too), so
// walMode tries again until the busy timeout has passed.
func (s *Store) walMode(ctx context.Context) error {
	deadline := time.Now().Add(s.cfg.busyTimeout)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		var mode string
		err := s.db.QueryRowContext(ctx, "PRAGMA journal_mode = WAL").Scan(&mode)
		switch {
		case err == nil && strings.EqualFold(mode, "wal"):
			return nil
		case err == nil:
			return fmt.Errorf("sqlitestore: the database stays in journal mode %q, not WAL", mode)
		case !isBusy(err) || time.Now().After(deadline):
			return fmt.Errorf("sqlitestore: setting WAL mode: %w", err)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// isBusy reports whether err is SQLite's SQLITE_BUSY or SQLITE_LOCKED.
func isBusy(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	code := se.Code() & 0xff
	return code == sqlite3.SQLITE_BUSY || code == sqlite3.SQLITE_LOCKED
}

// closeDBs closes the pools and statements; used by Close and a failed Open.
func (s *Store) closeDBs() error {
	if s.getStmt != nil {
		s.getStmt.Close()
	}
	for _, st := range s.spStmts {
		if st != nil {
			st.Close()
		}
	}
	var errs []error
	if s.rdb != nil {
		errs = append(errs, s.rdb.Close())
	}
	if s.db != nil {
		errs = append(errs, s.db.Close())
	}
	return errors.Join(errs...)
}

// Close stops the writer, waits for the batch it is running, fails the
// operations still queued with an error wrapping [store.ErrClosed], and
// closes the database. Every later call returns an error wrapping
// store.ErrClosed. Closing a closed store does nothing and returns nil.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		err = s.w.close()
		err = errors.Join(err, s.closeDBs())
	})
	return err
}

// DB returns the store's read-write connection pool, so that callers can
// keep their own tables in the same database file (and write them in the
// claim's transaction with InTx, or in the writer's with WriteTx). Its
// transactions begin IMMEDIATE (they take the write lock at BEGIN). Do not
// close it; [Store.Close] does.
func (s *Store) DB() *sql.DB { return s.db }

// Path returns the database file's name as given to [Open].
func (s *Store) Path() string { return s.path }

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	return Stats{
		Ops:        s.stats.ops.Load(),
		Commits:    s.stats.commits.Load(),
		Syncs:      s.stats.syncs.Load(),
		Batches:    s.stats.batches.Load(),
		BatchedOps: s.stats.batchedOps.Load(),
		Rollbacks:  s.stats.rollbacks.Load(),
	}
}

// lockWrites takes this process's turn at the write lock. It gives up
// waiting after the busy timeout (SQLite's busy handler then decides) or
// when ctx ends; unlock is a no-op then.
func (s *Store) lockWrites(ctx context.Context) (unlock func()) {
	select {
	case s.wlock <- struct{}{}:
		return s.unlockWrites
	default:
	}
	t := time.NewTimer(s.cfg.busyTimeout)
	defer t.Stop()
	select {
	case s.wlock <- struct{}{}:
		return s.unlockWrites
	case <-t.C:
	case <-ctx.Done():
	}
	return func() {}
}

func (s *Store) unlockWrites() { <-s.wlock }

// LockWrites takes this process's turn at the database's write lock: the
// turn the store's group-commit writer takes around each of its
// transactions. Code that writes the same file through [Store.DB] on a
// connection of its own takes it around each of its write transactions
// too, so that the two hand SQLite's lock over at once instead of polling
// for it in SQLite's busy handler (which sleeps up to 100 ms between
// tries). [Store.WriteTx] is usually better: the caller's writes then
// share the writer's transactions and syncs instead of taking turns. It waits at most the busy timeout,
// or until ctx ends; it then returns without the turn (unlock does
// nothing) and the caller's BEGIN IMMEDIATE waits in SQLite as it would
// without it. Call unlock once, after COMMIT or ROLLBACK.
func (s *Store) LockWrites(ctx context.Context) (unlock func()) { return s.lockWrites(ctx) }

// now reads the clock at the precision the store keeps.
func (s *Store) now() time.Time { return truncate(s.cfg.clock()) }

var errClosed = fmt.Errorf("sqlitestore: %w", store.ErrClosed)

// readErr wraps an error of the read pool, as ErrClosed if the store was
// closed meanwhile.
func (s *Store) readErr(op string, err error) error {
	if s.closed.Load() {
		return errClosed
	}
	return fmt.Errorf("sqlitestore: %s: %w", op, err)
}

// Claim implements [store.Store]. A claim of a new key is one INSERT ... ON
// CONFLICT DO NOTHING in the writer's next transaction, shared with the
// other operations queued meanwhile; if the key has a record, the writer
// reads it and decides in the same transaction. While many claims find
// their key's record (a flood of duplicates), Claim reads first instead,
// and answers a duplicate or a busy key from that read without the writer.
//
// A new record's first fence is [store.FirstFence] of the clock and the
// fence floor: the highest fence of a record deleted from the file (by
// Delete, Sweep, or a DELETE from outside the store), which the INSERT
// reads in its own transaction, so fences never repeat for a key, even
// across processes and when the clock has not moved since the delete.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if err := req.Check(); err != nil {
		return store.ClaimResult{}, err
	}
	var res store.ClaimResult
	from := fromAbsent
	if s.dupes.Often() {
		from = fromRead
	}
	if err := s.apply(ctx, req.Key, from, &s.dupes, claimM(req, &res)); err != nil {
		return store.ClaimResult{}, err
	}
	return res, nil
}

// ClaimBatch implements [store.BatchClaimer]: the claims run in order in one
// write operation, so a later request for a key sees an earlier one, and
// each is decided as [Store.Claim] decides it (new keys are inserted
// without a read when keys are mostly new). A corrupt record fails its own
// key (ClaimResult.Err); if a claim fails otherwise (a store error), none
// of the batch is written and the error is returned. A request that
// [store.ClaimRequest.Check] refuses fails the whole batch before anything
// is written.
func (s *Store) ClaimBatch(ctx context.Context, reqs []store.ClaimRequest) ([]store.ClaimResult, error) {
	for _, req := range reqs {
		if err := req.Check(); err != nil {
			return nil, err
		}
	}
	if len(reqs) == 0 {
		if s.closed.Load() {
			return nil, errClosed
		}
		return []store.ClaimResult{}, nil
	}
	out := make([]store.ClaimResult, len(reqs))
	from := fromAbsent
	if s.dupes.Often() {
		from = fromRead
	}
	items := make([]keyOp, len(reqs))
	for i, req := range reqs {
		items[i] = keyOp{key: req.Key, from: from, dupes: &s.dupes, m: claimM(req, &out[i])}
	}
	if err := s.applyBatch(ctx, items); err != nil {
		return nil, err
	}
	for i, it := range items {
		if it.err != nil {
			out[i] = store.ClaimResult{Record: store.Record{Key: it.key}, Err: it.err}
		}
	}
	return out, nil
}

// FinishBatch implements [store.BatchFinisher]: the requests run in order
// in one write operation, each as [Store.Finish] runs it (an attempt this
// process claimed is ended without a read), whatever its outcome. errs[i]
// is ErrLeaseLost or ErrNotFound when reqs[i]'s attempt no longer holds
// its key, or the error of a record that cannot be read; a store error
// writes none of them and is returned. A request that
// [store.FinishRequest.Check] refuses fails the whole batch before
// anything is written.
func (s *Store) FinishBatch(ctx context.Context, reqs []store.FinishRequest) ([]error, error) {
	items := make([]keyOp, len(reqs))
	for i, req := range reqs {
		if err := req.Check(); err != nil {
			return nil, err
		}
		items[i] = keyOp{key: req.Key, from: fromHeld, m: finishM(req)}
	}
	if err := s.applyBatch(ctx, items); err != nil {
		return nil, err
	}
	errs := make([]error, len(reqs))
	for i, it := range items {
		errs[i] = it.err
	}
	return errs, nil
}

// Finish implements [store.Store]. An attempt this process claimed is
// ended without a read: one UPDATE of the version its claim wrote, which
// the writer decides again on the record as it is if another process
// changed it meanwhile.
func (s *Store) Finish(ctx context.Context, req store.FinishRequest) error {
	if err := req.Check(); err != nil {
		return err
	}
	return s.apply(ctx, req.Key, fromHeld, nil, finishM(req))
}

// Extend implements [store.Store], without a read as Finish.
func (s *Store) Extend(ctx context.Context, req store.ExtendRequest) (time.Time, error) {
	if err := req.Check(); err != nil {
		return time.Time{}, err
	}
	var until time.Time
	if err := s.apply(ctx, req.Key, fromHeld, nil, extendM(req, &until)); err != nil {
		return time.Time{}, err
	}
	return until, nil
}

// Resolve implements [store.Store].
func (s *Store) Resolve(ctx context.Context, r store.ResolveRequest) (store.Record, error) {
	var rec store.Record
	if err := s.apply(ctx, r.Key, fromRead, nil, resolveM(r, &rec)); err != nil {
		return store.Record{}, err
	}
	return rec, nil
}

// Delete implements [store.Store]. An expired record counts as absent
// (ErrNotFound) and stays until Sweep deletes it. The deleted record's
// fence raises the fence floor in the same transaction, so the key's next
// record starts above it (see [Store.Claim]).
func (s *Store) Delete(ctx context.Context, key string) error {
	if s.closed.Load() {
		return errClosed
	}
	s.stats.ops.Add(1)
	defer s.held.forget(key)
	return s.w.do(ctx, false, func(w rw, now time.Time) error {
		return remove(w, key, now)
	})
}

// Sweep implements [store.Store]. Deleting expired records is housekeeping
// only: an expired record behaves as absent whether or not it was swept.
// The fences of the records it deletes raise the fence floor, as Delete's
// does.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	if s.closed.Load() {
		return 0, errClosed
	}
	if limit <= 0 {
		return 0, nil
	}
	s.stats.ops.Add(1)
	var n int
	err := s.w.do(ctx, false, func(w rw, now time.Time) (err error) {
		n, err = w.sweep(now.UnixMicro(), limit)
		return err
	})
	return n, err
}

// Now implements [store.Store]: the clock given to [WithClock], at
// microsecond precision.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	if s.closed.Load() {
		return time.Time{}, errClosed
	}
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	return s.now(), nil
}

// Get implements [store.Store]. It reads on the read-only pool, concurrently
// with the writer.
func (s *Store) Get(ctx context.Context, key string) (store.Record, error) {
	if s.closed.Load() {
		return store.Record{}, errClosed
	}
	rec, _, err := s.read(ctx, key)
	if err != nil {
		return store.Record{}, err
	}
	if rec == nil || rec.Expired(s.now()) {
		return store.Record{}, store.ErrNotFound
	}
	return *rec, nil
}

// read reads key's row and its version on the read pool, expired or not;
// nil if there is none.
func (s *Store) read(ctx context.Context, key string) (*store.Record, int64, error) {
	var vals [numColumns + 1]any
	var ptrs [numColumns + 1]any
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	err := s.getStmt.QueryRowContext(ctx, key).Scan(ptrs[:]...)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, s.readErr("get", err)
	}
	return decodeVersioned(vals[:])
}

// List implements [store.Store]. Expired records are never listed. A record
// that cannot be decoded fails the whole call with a *store.CorruptError
// naming its key (so an operator can Delete it).
//
// The query walks the primary key from q.After (or q.Prefix, to the end of
// its key range), or the partial index of its status for in_progress
// (also q.Stuck and q.Indeterminate), failed and released records, and
// stops at q.Limit matches. UpdatedAfter and UpdatedBefore have no index:
// a query that sets them reads records in key order until it has q.Limit
// that match, so its cost grows with the records it passes over.
func (s *Store) List(ctx context.Context, q store.ListQuery) ([]store.Record, error) {
	if s.closed.Load() {
		return nil, errClosed
	}
	if err := q.Check(); err != nil {
		return nil, err
	}
	query, args := listSQL(q, s.now().UnixMicro())
	rows, err := s.rdb.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, s.readErr("list", err)
	}
	defer rows.Close()
	var vals [numColumns]any
	var ptrs [numColumns]any
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	var out []store.Record
	for rows.Next() {
		if err := rows.Scan(ptrs[:]...); err != nil {
			return nil, s.readErr("list", err)
		}
		rec, err := decodeRecord(vals[:])
		if err != nil {
			return nil, err
		}
		out = append(out, *rec)
	}
	if err := rows.Err(); err != nil {
		return nil, s.readErr("list", err)
	}
	return out, nil
}

// listSQL is the statement of [Store.List] for q (checked) at now, in unix
// microseconds, and its arguments.
func listSQL(q store.ListQuery, now int64) (string, []any) {
	// One lower bound of the key, so that SQLite reads the index from it:
	// the cursor, or the prefix when it comes later.
	lo, op := q.After, ">"
	if q.Prefix != "" && q.Prefix > q.After {
		lo, op = q.Prefix, ">="
	}
	var b strings.Builder
	b.WriteString(`SELECT ` + columns + ` FROM idem_records WHERE key ` + op + ` ? AND expires_at > ?`)
	args := []any{lo, now}
	// Statuses are literals (checked by the caller), so that SQLite can use
	// the partial index of each.
	if q.Status != "" {
		b.WriteString(` AND status = '` + string(q.Status) + `'`)
	}
	if q.Stuck || q.Indeterminate {
		b.WriteString(` AND status = 'in_progress' AND lease_until <= ?`)
		args = append(args, now)
	}
	if q.Indeterminate {
		b.WriteString(` AND policy = '` + store.AtMostOnce.String() + `'`)
	}
	if q.Prefix != "" {
		// The end of the prefix's key range, which the primary key (or a
		// partial index of keys) reads as a range from lo.
		if end := store.PrefixEnd(q.Prefix); end != "" {
			b.WriteString(` AND key < ?`)
			args = append(args, end)
		}
	}
	// UpdatedAt is in whole microseconds: after t is after t's microsecond
	// (cut), before t is before t's microsecond rounded up.
	if !q.UpdatedAfter.IsZero() {
		b.WriteString(` AND updated_at > ?`)
		args = append(args, q.UpdatedAfter.UnixMicro())
	}
	if !q.UpdatedBefore.IsZero() {
		b.WriteString(` AND updated_at < ?`)
		args = append(args, ceilMicro(q.UpdatedBefore))
	}
	b.WriteString(` ORDER BY key LIMIT ?`)
	args = append(args, int64(q.PageSize()))
	return b.String(), args
}

// ceilMicro is t in unix microseconds, rounded up.
func ceilMicro(t time.Time) int64 {
	us := t.UnixMicro()
	if t.Sub(time.UnixMicro(us)) > 0 {
		us++
	}
	return us
}

var (
	_ store.Store            = (*Store)(nil)
	_ store.BatchClaimer     = (*Store)(nil)
	_ store.BatchFinisher    = (*Store)(nil)
	_ store.TxStore[*sql.Tx] = (*Store)(nil)
)
