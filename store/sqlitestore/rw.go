package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idemkit/idem"
)

// rw reads and writes records inside a write transaction: the writer's batch
// or an InTx transaction. Every error from the database is a *stmtError, so
// the writer can tell a failed statement (whose transaction may be damaged)
// from an outcome (ErrLeaseLost, a corrupt record).
type rw interface {
	// load returns the stored record of key, expired or not, and its
	// version; nil if there is none.
	load(key string) (*idem.Record, int64, error)
	// insert writes a record (args from encodeRecord) with the given
	// version if its key is absent, and reports whether it did.
	insert(args []any, version int64) (bool, error)
	// update overwrites a record (args from encodeRecord) if its stored
	// version is still version, and reports whether it did.
	update(args []any, version int64) (bool, error)
	// remove deletes key unless it expired at or before now (unix
	// microseconds), and reports whether it did.
	remove(key string, now int64) (bool, error)
	// sweep deletes at most limit records that expired at or before now
	// (unix microseconds).
	sweep(now int64, limit int) (int, error)
}

// stmtError is a statement that failed. Its transaction may have been rolled
// back by SQLite (SQLITE_FULL, SQLITE_IOERR, SQLITE_NOMEM), so the writer
// rolls back and runs the batch's other operations again.
type stmtError struct {
	op  string
	err error
}

func (e *stmtError) Error() string { return "sqlitestore: " + e.op + ": " + e.err.Error() }
func (e *stmtError) Unwrap() error { return e.err }

func isStmtError(err error) bool {
	var se *stmtError
	return errors.As(err, &se)
}

// stmts are the prepared statements of the record table on one connection.
type stmts struct {
	insert, load, update, remove, sweep *sql.Stmt
}

type preparer interface {
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

func prepareStmts(ctx context.Context, p preparer) (*stmts, error) {
	var st stmts
	for _, x := range []struct {
		dst **sql.Stmt
		q   string
	}{
		{&st.insert, sqlInsert},
		{&st.load, sqlLoad},
		{&st.update, sqlUpdate},
		{&st.remove, sqlDelete},
		{&st.sweep, sqlSweep},
	} {
		s, err := p.PrepareContext(ctx, x.q)
		if err != nil {
			st.close()
			return nil, fmt.Errorf("sqlitestore: preparing %q: %w", x.q, err)
		}
		*x.dst = s
	}
	return &st, nil
}

// inTx returns the statements bound to tx.
func (st *stmts) inTx(ctx context.Context, tx *sql.Tx) *stmts {
	return &stmts{
		insert: tx.StmtContext(ctx, st.insert),
		load:   tx.StmtContext(ctx, st.load),
		update: tx.StmtContext(ctx, st.update),
		remove: tx.StmtContext(ctx, st.remove),
		sweep:  tx.StmtContext(ctx, st.sweep),
	}
}

func (st *stmts) close() {
	for _, s := range []*sql.Stmt{st.insert, st.load, st.update, st.remove, st.sweep} {
		if s != nil {
			s.Close()
		}
	}
}

// sqlRW is rw on database/sql prepared statements.
type sqlRW struct {
	ctx   context.Context
	st    *stmts
	vals  [numColumns + 1]any
	ptrs  [numColumns + 1]any
	wrote bool // some statement changed a row since the flag was cleared
}

func newSQLRW(ctx context.Context, st *stmts) *sqlRW {
	w := &sqlRW{ctx: ctx, st: st}
	for i := range w.vals {
		w.ptrs[i] = &w.vals[i]
	}
	return w
}

func (w *sqlRW) load(key string) (*idem.Record, int64, error) {
	err := w.st.load.QueryRowContext(w.ctx, key).Scan(w.ptrs[:]...)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, &stmtError{"load", err}
	}
	r, ver, err := decodeVersioned(w.vals[:])
	clear(w.vals[:])
	return r, ver, err
}

func (w *sqlRW) exec(op string, s *sql.Stmt, args []any) (bool, error) {
	res, err := s.ExecContext(w.ctx, args...)
	if err != nil {
		return false, &stmtError{op, err}
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, &stmtError{op, err}
	}
	if n > 0 {
		w.wrote = true
	}
	return n > 0, nil
}

func (w *sqlRW) insert(args []any, version int64) (bool, error) {
	return w.exec("insert", w.st.insert, append(args[:numColumns], version))
}

func (w *sqlRW) update(args []any, version int64) (bool, error) {
	return w.exec("update", w.st.update, append(args[:numColumns], version))
}

func (w *sqlRW) remove(key string, now int64) (bool, error) {
	return w.exec("delete", w.st.remove, []any{key, now})
}

func (w *sqlRW) sweep(now int64, limit int) (int, error) {
	res, err := w.st.sweep.ExecContext(w.ctx, now, int64(limit))
	if err != nil {
		return 0, &stmtError{"sweep", err}
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, &stmtError{"sweep", err}
	}
	if n > 0 {
		w.wrote = true
	}
	return int(n), nil
}
