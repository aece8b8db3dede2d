package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// writer is the group commit: one goroutine that owns one connection, takes
// the operations queued by the store's callers (up to MaxBatch at a time),
// runs them in one IMMEDIATE transaction and answers each caller once the
// COMMIT (and its sync) is done. Callers that arrive while a batch commits
// queue up and share the next one, so the number of syncs per operation
// falls as concurrency grows.
//
// The transaction is a *sql.Tx on the writer's connection, so that units of
// work from outside the store ([Store.WriteTx], [Store.InTx]) can run in it;
// the store's own operations run on the driver's statements (driverRW)
// through sql.Conn.Raw, which skips database/sql's per-statement work.
type writer struct {
	s     *Store
	conn  *sql.Conn
	rw    *driverRW // used only by the loop, inside conn.Raw
	queue chan *op

	closing chan struct{} // closed by close: stop taking batches
	done    chan struct{} // closed when the loop has returned
	exited  chan struct{} // closed when the connection is closed

	batch []*op
	sp    *savepoints // of the current transaction; nil until a unit needs them
}

// op is one queued operation: a store operation (run) or a unit of work
// (unit).
type op struct {
	ctx context.Context
	run func(w rw, now time.Time) error
	// atomic: run writes more than once and must be undone as a whole when
	// it fails (ClaimBatch).
	atomic bool
	// unit runs in a savepoint of the writer's transaction (see
	// Store.WriteTx).
	unit     func(ctx context.Context, tx *sql.Tx) error
	panicked any // what unit panicked with, re-raised in the caller

	// state says who owns the op: the caller may abandon it while it is
	// queued; once the writer has taken it (inside a transaction), the
	// caller waits for its answer.
	state atomic.Int32
	err   error
	done  chan struct{}
}

const (
	opQueued int32 = iota
	opTaken
	opAbandoned
)

// take claims o for the writer's current transaction; false if its caller
// abandoned it.
func (o *op) take() bool {
	return o.state.CompareAndSwap(opQueued, opTaken) || o.state.Load() == opTaken
}

// newWriter takes a connection from s.db for the writer and starts the
// loop on it.
func newWriter(ctx context.Context, s *Store) (*writer, error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	w := &writer{
		s:       s,
		conn:    conn,
		queue:   make(chan *op, s.cfg.maxBatch),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
		exited:  make(chan struct{}),
		batch:   make([]*op, 0, s.cfg.maxBatch),
	}
	// Savepoints (WriteTx's units, ClaimBatch) copy each page they change
	// to a sub-journal, which SQLite spills to a temporary file past 64 KiB
	// unless temporary files are kept in memory: a write system call per
	// page otherwise.
	if _, err := conn.ExecContext(ctx, "PRAGMA temp_store = MEMORY"); err != nil {
		conn.Close()
		return nil, err
	}
	// The driver's statements are prepared once and used only inside later
	// Raw calls on the same connection, which hold its lock.
	err = conn.Raw(func(dc any) (err error) {
		w.rw, err = newDriverRW(dc, s.cfg.implicit, &s.floorSeen)
		return err
	})
	if err != nil {
		conn.Close()
		return nil, err
	}
	go func() {
		defer close(w.exited)
		w.loop()
		conn.Raw(func(any) error { w.rw.close(); return nil })
		conn.Close()
	}()
	return w, nil
}

// do queues run and waits for its answer. If ctx ends while the operation
// is still queued, do returns ctx's error and the operation does not run;
// once the writer has taken it, do waits for its transaction's outcome.
func (w *writer) do(ctx context.Context, atomic bool, run func(w rw, now time.Time) error) error {
	return w.wait(ctx, &op{ctx: ctx, run: run, atomic: atomic})
}

// doUnit queues unit, to run in a savepoint of the writer's next
// transaction, and waits for its answer as do does.
func (w *writer) doUnit(ctx context.Context, unit func(ctx context.Context, tx *sql.Tx) error) error {
	o := &op{ctx: ctx, unit: unit}
	err := w.wait(ctx, o)
	if o.panicked != nil {
		panic(o.panicked)
	}
	return err
}

func (w *writer) wait(ctx context.Context, o *op) error {
	if w.s.closed.Load() {
		return errClosed
	}
	if ctx.Value(onWriterKey{}) == w {
		return ErrOnWriter
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	o.done = make(chan struct{})
	select {
	case w.queue <- o:
	case <-w.closing:
		return errClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-o.done:
		return o.err
	case <-ctx.Done():
		if o.state.CompareAndSwap(opQueued, opAbandoned) {
			return ctx.Err()
		}
		// Taken: it runs in a transaction that is already open, and its
		// answer (after the COMMIT) says what happened to it.
		<-o.done
		return o.err
	case <-w.done:
		// The loop returned; it answered o unless o slipped into the queue
		// after the loop's last look.
		select {
		case <-o.done:
			return o.err
		default:
			return errClosed
		}
	}
}

func (o *op) finish(err error) {
	o.err = err
	close(o.done)
}

func (w *writer) loop() {
	defer close(w.done)
	for {
		var first *op
		select {
		case first = <-w.queue:
		case <-w.closing:
		}
		select {
		case <-w.closing:
			// Closing (select picks at random when both are ready): what
			// is queued fails, as Close says.
			if first != nil {
				first.finish(errClosed)
			}
			for {
				select {
				case o := <-w.queue:
					o.finish(errClosed)
				default:
					return
				}
			}
		default:
		}
		w.batch = append(w.batch[:0], first)
	fill:
		for len(w.batch) < cap(w.batch) {
			select {
			case o := <-w.queue:
				w.batch = append(w.batch, o)
			default:
				break fill
			}
		}
		w.runBatch(w.batch)
		clear(w.batch)
	}
}

// close stops the loop and closes the writer's connection.
func (w *writer) close() error {
	close(w.closing)
	<-w.exited
	return nil
}

// raw runs f on the writer's connection with the driver's statements.
func (w *writer) raw(f func(rw *driverRW) error) error {
	return w.conn.Raw(func(any) error { return f(w.rw) })
}

// rollbackRaw ends whatever transaction the connection has open, if any,
// without database/sql (whose *sql.Tx may already count as done).
func (w *writer) rollbackRaw() error {
	return w.raw(func(rw *driverRW) error { return rw.rollback() })
}

func (w *writer) begin() (*sql.Tx, error) {
	tx, err := w.conn.BeginTx(bg, nil) // BEGIN IMMEDIATE (_txlock=immediate)
	if err != nil && w.rollbackRaw() == nil {
		// A transaction was left open (by a failed COMMIT or ROLLBACK) and
		// is ended now: try once more.
		tx, err = w.conn.BeginTx(bg, nil)
	}
	return tx, err
}

// errTxEnded answers the operations of a transaction that a unit of work
// committed or rolled back itself.
var errTxEnded = errors.New("sqlitestore: a unit of work ended the writer's transaction (it must not call Commit or Rollback); the outcome of this operation is unknown")

// runBatch runs batch in one transaction and answers every operation. An
// operation whose outcome is an error (ErrLeaseLost, a corrupt record, a
// unit's own error after its savepoint rolled back) is answered with it
// and does not disturb the others. A failed statement may have damaged the
// transaction (SQLite rolls it back on SQLITE_FULL, SQLITE_IOERR, an
// interrupted write), so the writer rolls back, answers that operation
// with the error and runs the others again in a new transaction. If the
// COMMIT fails, every operation of the batch gets the error: none is
// reported done unless it is durable.
func (w *writer) runBatch(batch []*op) {
	s := w.s
	for len(batch) > 0 {
		live := batch[:0]
		for _, o := range batch {
			if err := o.ctx.Err(); err != nil && o.state.CompareAndSwap(opQueued, opAbandoned) {
				o.finish(err) // the caller gave up before it ran
				continue
			}
			live = append(live, o)
		}
		batch = live
		if len(batch) == 0 {
			return
		}
		unlock := s.lockWrites(bg)
		tx, err := w.begin()
		if err != nil {
			unlock()
			err = fmt.Errorf("sqlitestore: begin: %w", err)
			s.cfg.logger.Error("sqlitestore: write transaction failed to begin", "err", err, "ops", len(batch))
			for _, o := range batch {
				o.finish(err)
			}
			return
		}
		w.sp = nil
		w.rw.wrote = false
		now := s.now()
		failed, ended := -1, -1
		for i := 0; i < len(batch) && failed < 0 && ended < 0; {
			o := batch[i]
			if !o.take() {
				batch[i] = nil // abandoned by its caller, who has its answer
				i++
				continue
			}
			switch {
			case o.unit != nil:
				failed, ended = w.runUnit(tx, o, i)
				i++
			case o.atomic:
				failed = w.runAtomic(o, now, i)
				i++
			default:
				// This and the plain operations after it, in one Raw call.
				w.raw(func(rw *driverRW) error {
					for ; i < len(batch); i++ {
						o := batch[i]
						if o.unit != nil || o.atomic {
							return nil
						}
						if !o.take() {
							batch[i] = nil
							continue
						}
						o.err = o.run(rw, now)
						if isStmtError(o.err) {
							failed = i
							return nil
						}
					}
					return nil
				})
			}
		}
		switch {
		case ended >= 0:
			// A unit committed or rolled back the transaction: what ran
			// before it may or may not be durable. Those operations get an
			// error; the ones that did not run yet run in a new
			// transaction.
			w.rollbackRaw()
			unlock()
			s.cfg.logger.Error("sqlitestore: a unit of work ended the write transaction", "ops", ended+1)
			for _, o := range batch[:ended+1] {
				if o != nil {
					o.finish(errTxEnded)
				}
			}
			batch = compact(batch[ended+1:])
			continue
		case failed >= 0:
			tx.Rollback()
			w.rollbackRaw() // in case database/sql thinks the transaction over while SQLite does not
			unlock()
			s.stats.rollbacks.Add(1)
			o := batch[failed]
			s.cfg.logger.Warn("sqlitestore: operation failed, batch rolled back and retried", "err", o.err, "ops", len(batch)-1)
			o.finish(o.err)
			batch[failed] = nil
			batch = compact(batch)
			continue
		}
		batch = compact(batch)
		err = tx.Commit()
		if err != nil {
			w.rollbackRaw()
		}
		unlock()
		if err != nil {
			err = fmt.Errorf("sqlitestore: commit: %w", err)
			s.cfg.logger.Error("sqlitestore: write transaction failed to commit", "err", err, "ops", len(batch))
			for _, o := range batch {
				o.finish(err)
			}
			return
		}
		s.stats.batches.Add(1)
		s.stats.batchedOps.Add(int64(len(batch)))
		if w.rw.wrote || w.sp != nil {
			// A unit's writes are not counted: assume it wrote.
			s.stats.commits.Add(1)
			if s.cfg.sync == SyncFull {
				s.stats.syncs.Add(1) // the COMMIT synced the log
			}
		}
		for _, o := range batch {
			o.finish(o.err)
		}
		return
	}
}

// compact removes the nil entries of batch, in place.
func compact(batch []*op) []*op {
	out := batch[:0]
	for _, o := range batch {
		if o != nil {
			out = append(out, o)
		}
	}
	return out
}

// runAtomic runs o (which writes more than once) in a savepoint, so that
// its failure undoes its own writes only. It returns i if the failure
// needs the whole transaction rolled back, else -1.
func (w *writer) runAtomic(o *op, now time.Time, i int) (failed int) {
	failed = -1
	w.raw(func(rw *driverRW) error {
		if err := rw.savepoint(); err != nil {
			o.err = &stmtError{"savepoint", err}
			failed = i
			return nil
		}
		o.err = o.run(rw, now)
		if o.err == nil {
			if err := rw.release(); err != nil {
				o.err = &stmtError{"release", err}
				failed = i
			}
			return nil
		}
		if isStmtError(o.err) || rw.rollbackTo() != nil || rw.release() != nil {
			failed = i
		}
		return nil
	})
	return failed
}

// runUnit runs the unit of work o in a savepoint of tx. It returns
// failed = i if the transaction must be rolled back as a whole (the unit
// failed and its savepoint could not be rolled back: SQLite had rolled the
// transaction back), ended = i if the unit ended tx itself, else -1s.
func (w *writer) runUnit(tx *sql.Tx, o *op, i int) (failed, ended int) {
	failed, ended = -1, -1
	sp, err := w.savepoints(tx)
	if err == nil {
		_, err = sp.save.Exec()
	}
	if err != nil {
		if w.txEnded(tx, err) {
			return -1, i
		}
		o.err = fmt.Errorf("sqlitestore: savepoint: %w", err)
		return i, -1
	}
	o.err = w.callUnit(tx, o)
	if o.err == nil {
		if _, err := sp.release.Exec(); err != nil {
			if w.txEnded(tx, err) {
				return -1, i
			}
			// fn's writes are gone with the transaction (an interrupted
			// statement whose error fn ignored, say).
			o.err = fmt.Errorf("sqlitestore: the unit of work's transaction was rolled back: %w", err)
			return i, -1
		}
		return -1, -1
	}
	_, err = sp.rollbackTo.Exec()
	if err == nil {
		_, err = sp.release.Exec()
	}
	switch {
	case err != nil && w.txEnded(tx, err):
		return -1, i
	case err != nil:
		return i, -1 // o.err stays the unit's error
	}
	return -1, -1
}

// txEnded reports whether tx is over (a unit called its Commit or
// Rollback), after a statement on it failed with err: the statements bound
// to tx fail with "statement is closed" then, so ask tx itself.
func (w *writer) txEnded(tx *sql.Tx, err error) bool {
	if errors.Is(err, sql.ErrTxDone) {
		return true
	}
	var one int
	return errors.Is(tx.StmtContext(bg, w.s.spStmts[3]).QueryRow().Scan(&one), sql.ErrTxDone)
}

// callUnit calls o's unit, turning a panic into an error (the caller's
// goroutine panics again with it) so that the writer survives it.
func (w *writer) callUnit(tx *sql.Tx, o *op) (err error) {
	defer func() {
		if p := recover(); p != nil {
			o.panicked = p
			err = fmt.Errorf("sqlitestore: unit of work panicked: %v", p)
		}
	}()
	return o.unit(context.WithValue(o.ctx, onWriterKey{}, w), tx)
}

// onWriterKey marks the context a unit of work runs with: a store call
// made with it would wait for the writer, which is running the unit.
type onWriterKey struct{}

// ErrOnWriter is returned by a store call made from inside a WriteTx or
// InTx function, with the context that function was given: the call would
// wait for the writer, which waits for the function (a deadlock). Use the
// function's tx instead.
var ErrOnWriter = errors.New("sqlitestore: store called from inside its own WriteTx or InTx function (it would deadlock): use the function's tx")

// savepoints are the statements that isolate a unit of work, bound to one
// transaction.
type savepoints struct {
	save, release, rollbackTo *sql.Stmt
}

// The name is unusual so that a unit's own savepoints do not shadow it.
const (
	sqlSavepoint  = `SAVEPOINT idem_sqlitestore_unit`
	sqlRelease    = `RELEASE idem_sqlitestore_unit`
	sqlRollbackTo = `ROLLBACK TO idem_sqlitestore_unit`
)

func (w *writer) savepoints(tx *sql.Tx) (*savepoints, error) {
	if w.sp == nil {
		st := w.s.spStmts
		w.sp = &savepoints{
			save:       tx.StmtContext(bg, st[0]),
			release:    tx.StmtContext(bg, st[1]),
			rollbackTo: tx.StmtContext(bg, st[2]),
		}
	}
	return w.sp, nil
}
