package sqlitestore

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/idemkit/idem/store"
)

// driverRW is rw on the driver's own prepared statements, for the writer,
// which owns its connection for its whole life (sql.Conn.Raw) and so skips
// database/sql's per-statement work. Statements run with a background
// context: a batch is not interrupted by one caller giving up, and the
// driver starts no watcher goroutine per statement.
type driverRW struct {
	conn                               driver.Conn
	insertS, loadS, updateS, removeS   driver.Stmt
	sweepS, beginS, commitS, rollbackS driver.Stmt
	savepointS, releaseS, rollbackToS  driver.Stmt
	floorS                             driver.Stmt
	args                               [numColumns + 2]driver.NamedValue
	dest                               [numColumns + 1]driver.Value
	vals                               [numColumns + 1]any
	wrote                              bool // a statement changed a row since the flag was cleared
	implicit                           bool // the store's WithImplicitJournal
	// floorSeen is the store's copy of the highest fence floor read, for
	// the claims decided before the writer (Store.floorSeen).
	floorSeen *atomic.Int64
}

var bg = context.Background()

func newDriverRW(dc any, implicit bool, floorSeen *atomic.Int64) (*driverRW, error) {
	conn, ok := dc.(driver.Conn)
	if !ok {
		return nil, fmt.Errorf("sqlitestore: driver connection is %T", dc)
	}
	prep, ok := dc.(driver.ConnPrepareContext)
	if !ok {
		return nil, fmt.Errorf("sqlitestore: driver connection %T cannot prepare with a context", dc)
	}
	w := &driverRW{conn: conn, implicit: implicit, floorSeen: floorSeen}
	for _, x := range []struct {
		dst *driver.Stmt
		q   string
	}{
		{&w.insertS, sqlInsert},
		{&w.loadS, sqlLoad},
		{&w.updateS, sqlUpdate},
		{&w.removeS, sqlDelete},
		{&w.sweepS, sqlSweep},
		{&w.beginS, "BEGIN IMMEDIATE"},
		{&w.commitS, "COMMIT"},
		{&w.rollbackS, "ROLLBACK"},
		{&w.savepointS, sqlSavepoint},
		{&w.releaseS, sqlRelease},
		{&w.rollbackToS, sqlRollbackTo},
		{&w.floorS, sqlFloor},
	} {
		st, err := prep.PrepareContext(bg, x.q)
		if err != nil {
			w.close()
			return nil, fmt.Errorf("sqlitestore: preparing %q: %w", x.q, err)
		}
		if _, ok := st.(driver.StmtExecContext); !ok {
			st.Close()
			w.close()
			return nil, fmt.Errorf("sqlitestore: driver statement %T cannot execute with a context", st)
		}
		if _, ok := st.(driver.StmtQueryContext); !ok {
			st.Close()
			w.close()
			return nil, fmt.Errorf("sqlitestore: driver statement %T cannot query with a context", st)
		}
		*x.dst = st
	}
	for i := range w.args {
		w.args[i].Ordinal = i + 1
	}
	return w, nil
}

func (w *driverRW) close() {
	for _, st := range []driver.Stmt{w.insertS, w.loadS, w.updateS, w.removeS, w.sweepS, w.beginS, w.commitS, w.rollbackS, w.savepointS, w.releaseS, w.rollbackToS, w.floorS} {
		if st != nil {
			st.Close()
		}
	}
}

// bind fills the argument array with vals and returns its used part.
func (w *driverRW) bind(vals ...any) []driver.NamedValue {
	a := w.args[:len(vals)]
	for i, v := range vals {
		a[i].Value = v
	}
	return a
}

func (w *driverRW) unbind(a []driver.NamedValue) {
	for i := range a {
		a[i].Value = nil
	}
}

// exec runs st and returns the number of rows it changed.
func (w *driverRW) exec(st driver.Stmt, args []driver.NamedValue) (int64, error) {
	res, err := st.(driver.StmtExecContext).ExecContext(bg, args)
	w.unbind(args)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if n > 0 {
		w.wrote = true
	}
	return n, err
}

// queryRow runs st and reads its first row into w.dest; false if it has
// none.
func (w *driverRW) queryRow(st driver.Stmt, args []driver.NamedValue, n int) (bool, error) {
	rows, err := st.(driver.StmtQueryContext).QueryContext(bg, args)
	w.unbind(args)
	if err != nil {
		return false, err
	}
	err = rows.Next(w.dest[:n])
	cerr := rows.Close()
	if errors.Is(err, io.EOF) {
		return false, cerr
	}
	if err == nil {
		err = cerr
	}
	return err == nil, err
}

// begin, commit and rollback do not go through exec: the rows-affected
// count the driver reports for them is the last INSERT, UPDATE or DELETE's
// (sqlite3_changes), which must not mark the batch as having written.

func (w *driverRW) begin() error { return w.control(w.beginS) }

func (w *driverRW) commit() error { return w.control(w.commitS) }

func (w *driverRW) rollback() error { return w.control(w.rollbackS) }

func (w *driverRW) savepoint() error { return w.control(w.savepointS) }

func (w *driverRW) release() error { return w.control(w.releaseS) }

func (w *driverRW) rollbackTo() error { return w.control(w.rollbackToS) }

func (w *driverRW) control(st driver.Stmt) error {
	_, err := st.(driver.StmtExecContext).ExecContext(bg, nil)
	return err
}

func (w *driverRW) load(key string) (*store.Record, int64, error) {
	found, err := w.queryRow(w.loadS, w.bind(key), numColumns+1)
	if err != nil {
		return nil, 0, &stmtError{"load", err}
	}
	if !found {
		return nil, 0, nil
	}
	for i, v := range w.dest {
		w.vals[i] = v
	}
	clear(w.dest[:])
	r, ver, err := decodeVersioned(w.vals[:])
	clear(w.vals[:])
	return r, ver, err
}

func (w *driverRW) encode(r *store.Record) ([]any, error) { return encodeRecord(r, w.implicit) }

func (w *driverRW) insert(args []any, version int64) (bool, error) {
	n, err := w.exec(w.insertS, w.bind(append(args[:numColumns], version, args[fenceColumn])...))
	if err != nil {
		return false, &stmtError{"insert", err}
	}
	return n > 0, nil
}

func (w *driverRW) update(args []any, version int64) (bool, error) {
	n, err := w.exec(w.updateS, w.bind(append(args[:numColumns], version)...))
	if err != nil {
		return false, &stmtError{"update", err}
	}
	return n > 0, nil
}

func (w *driverRW) remove(key string, now int64) (bool, error) {
	n, err := w.exec(w.removeS, w.bind(key, now))
	if err != nil {
		return false, &stmtError{"delete", err}
	}
	return n > 0, nil
}

func (w *driverRW) sweep(now int64, limit int) (int, error) {
	n, err := w.exec(w.sweepS, w.bind(now, int64(limit)))
	if err != nil {
		return 0, &stmtError{"sweep", err}
	}
	return int(n), nil
}

func (w *driverRW) floor() (int64, error) {
	found, err := w.queryRow(w.floorS, nil, 1)
	v := w.dest[0]
	w.dest[0] = nil
	if err != nil {
		return 0, &stmtError{"fence floor", err}
	}
	floor, ok := v.(int64)
	if !found || !ok {
		return 0, &stmtError{"fence floor", fmt.Errorf("the fence floor is %T, not an integer", v)}
	}
	noteFloor(w.floorSeen, floor)
	return floor, nil
}
