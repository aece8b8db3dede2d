package sqlitestore

import (
	"errors"

	"github.com/idemkit/idem/store"
)

// rw reads and writes records inside the writer's transaction (the store's
// operations, InTx's claim and completion). Every error from the database
// is a *stmtError, so the writer can tell a failed statement (whose
// transaction may be damaged) from an outcome (ErrLeaseLost, a corrupt
// record).
type rw interface {
	// encode returns r's column values as the store writes them (see
	// encodeRecord and WithImplicitJournal), for insert and update.
	encode(r *store.Record) ([]any, error)
	// load returns the stored record of key, expired or not, and its
	// version; nil if there is none.
	load(key string) (*store.Record, int64, error)
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
	// floor returns the fence floor (migration 004): the highest fence of
	// a deleted record, which a new record's first fence must exceed.
	floor() (int64, error)
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
