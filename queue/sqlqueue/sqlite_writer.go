package sqlqueue

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
)

// sqliteWriter is the group commit of a [SQLite] handle: one goroutine
// that owns one connection of the pool, takes the operations queued since
// its last commit (receives, settles, publishes; up to maxBatch), runs
// them in one BEGIN IMMEDIATE ... COMMIT and answers each after the
// COMMIT. Concurrent consumers and publishers so share one sync of the
// write-ahead log instead of paying one each, and take SQLite's write lock
// once per batch instead of once per call.
type sqliteWriter struct {
	s     *SQLite
	conn  *sql.Conn
	st    sqliteStmts
	rows  rowStmts // on conn
	queue chan *sqliteOp

	closing chan struct{}
	done    chan struct{}
	batch   []*sqliteOp
}

const maxBatch = 256

type sqliteOp struct {
	ctx context.Context
	run func(st *sqliteStmts, now int64) error
	// late, if set, runs (in its own goroutine) after an op that committed
	// although its caller had given up waiting: a receive hands its
	// messages back.
	late  func()
	state atomic.Int32 // opQueued, opTaken (by the writer) or opAbandoned (by the caller)
	err   error
	done  chan struct{}
}

const (
	opQueued int32 = iota
	opTaken
	opAbandoned
)

// sqliteWrites runs the writes of a [SQLite] handle: its own group-commit
// writer, or the units of work of a [GroupCommitter]'s.
type sqliteWrites interface {
	// do runs run in a write transaction and waits for its answer. If ctx
	// ends first, do returns ctx's error: the operation does not run if the
	// writer has not taken it yet; otherwise it may or may not commit, and
	// late (if not nil) runs once it has.
	do(ctx context.Context, run func(st *sqliteStmts, now int64) error, late func()) error
	close()
}

// sqliteStmts are the prepared statements of a write transaction, and the
// transaction's connection (or *sql.Tx) for other statements.
type sqliteStmts struct {
	receive, ack, retry, extend, deadCopy, deadDelete,
	dedupGet, insert, dedupPut, sweep, handBack *sql.Stmt

	// insertRows returns the statement that inserts n messages, n a power
	// of two from 2 to sqliteInsertRows (see insertRowsSQL), prepared once
	// per writer: a statement of hundreds of parameters costs more to
	// parse than to run.
	insertRows func(n int) *sql.Stmt

	// ctx is the context of the group committer's unit the statements
	// run in (WithGroupCommit), which the ledger store's claims and
	// finishes inside the unit need; nil on the handle's own writer.
	ctx context.Context

	x interface {
		ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
		QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	}
}

func (st *sqliteStmts) all() []**sql.Stmt {
	return []**sql.Stmt{&st.receive, &st.ack, &st.retry, &st.extend, &st.deadCopy, &st.deadDelete,
		&st.dedupGet, &st.insert, &st.dedupPut, &st.sweep, &st.handBack}
}

var sqliteQueries = [...]string{
	sqliteReceive, sqliteAck, sqliteRetry, sqliteExtend, sqliteDeadCopy, sqliteDeadDelete,
	sqliteDedupGet, sqliteInsert, sqliteDedupPut, sqliteSweep, sqliteHandBack,
}

// sqliteHeldVisibleAt is the visible_at of held messages (migration
// 003), 2200-01-01 in unix µs: the messages of a FIFO group behind its
// head, which only the head's delete makes visible.
const sqliteHeldVisibleAt = "7258118400000000"

const (
	// sqliteReceive hands out up to ?4 visible messages of queue ?3 at
	// ?2 (now), hidden until ?1. A message of a group is eligible only
	// while no earlier message of its group is in the table (in flight,
	// delayed or waiting): the group's head; and while no other message
	// of its group is in flight (a redriven message keeps its id, so it
	// may come back before a later message that is being handled). The
	// messages behind a group's head are held (migration 003: their
	// visible_at is far in the future), so the range on visible_at never
	// reaches them and a backlog behind blocked groups costs nothing per
	// message: the receive runs on the writer, which every other write
	// waits for. The lower-id check stays for the one unheld message that
	// is not a head: one in flight when a redrive put a lower id before
	// it, then retried or timed out. The groups with a message in flight
	// are read once and each candidate is tested against them. They are
	// read on their partial index, named: SQLite has no statistics here
	// and took the range on (queue, visible_at) instead, which passes
	// every delayed or retried message of the queue as well. The limit is
	// an expression (?4 + 0), not a bare parameter: SQLite plans with the
	// value bound to a bare LIMIT parameter and prepares the statement
	// again whenever that value changes, and the Consumer asks for as many
	// messages as it has free handlers, a different number nearly every
	// time (see TestSQLiteLimitsAreNotBoundValues).
	sqliteReceive = `UPDATE idem_queue_messages
SET visible_at = ?1, receive_count = receive_count + 1, receipt = random(), first_received = COALESCE(first_received, ?2)
WHERE id IN (
	SELECT m.id FROM idem_queue_messages m
	WHERE m.queue = ?3 AND m.visible_at <= ?2
	  AND (m.group_id IS NULL OR (m.group_id NOT IN (
		SELECT f.group_id FROM idem_queue_messages f INDEXED BY idem_queue_messages_group_in_flight
		WHERE f.queue = ?3 AND f.group_id IS NOT NULL AND f.receipt IS NOT NULL AND f.visible_at > ?2 AND f.visible_at < ` + sqliteHeldVisibleAt + `)
	  AND NOT EXISTS (
		SELECT 1 FROM idem_queue_messages e WHERE e.queue = m.queue AND e.group_id = m.group_id AND e.id < m.id)))
	ORDER BY m.visible_at, m.id
	LIMIT ?4 + 0)
RETURNING id, body, attributes, group_id, dedup_id, receive_count, receipt, first_received, published`
	sqliteAck      = `DELETE FROM idem_queue_messages WHERE id = ? AND receipt = ?`
	sqliteRetry    = `UPDATE idem_queue_messages SET visible_at = ?, receipt = NULL WHERE id = ? AND receipt = ?`
	sqliteExtend   = `UPDATE idem_queue_messages SET visible_at = ? WHERE id = ? AND receipt = ?`
	sqliteDeadCopy = `INSERT OR REPLACE INTO idem_queue_dead (id, queue, body, attributes, group_id, dedup_id, receive_count, first_received, published, reason, dead_at)
SELECT id, queue, body, attributes, group_id, dedup_id, receive_count, first_received, published, ?, ? FROM idem_queue_messages WHERE id = ? AND receipt = ?`
	sqliteDeadDelete = `DELETE FROM idem_queue_messages WHERE id = ?`
	sqliteDedupGet   = `SELECT message_id, expires_at FROM idem_queue_dedup WHERE queue = ? AND dedup_id = ?`
	sqliteInsert     = sqliteInsertHead + `(?, ?, ?, ?, ?, ?, ?) RETURNING id`
	// sqliteInsertHead starts the insert of messages; insertRowsSQL adds
	// many rows of VALUES to it.
	sqliteInsertHead = `INSERT INTO idem_queue_messages (queue, body, attributes, group_id, dedup_id, visible_at, published)
VALUES `
	// sqliteHandBack undoes a receive whose caller never saw it.
	sqliteHandBack = `UPDATE idem_queue_messages
SET visible_at = ?, receipt = NULL, receive_count = receive_count - 1,
	first_received = CASE WHEN receive_count = 1 THEN NULL ELSE first_received END
WHERE id = ? AND receipt = ?`
	sqliteDedupPut = `INSERT OR REPLACE INTO idem_queue_dedup (queue, dedup_id, message_id, expires_at) VALUES (?, ?, ?, ?)`
	sqliteSweep    = `DELETE FROM idem_queue_dedup WHERE (queue, dedup_id) IN (
	SELECT queue, dedup_id FROM idem_queue_dedup WHERE expires_at <= ? LIMIT ? + 0)`
)

func newSQLiteWriter(ctx context.Context, s *SQLite) (*sqliteWriter, error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	w := &sqliteWriter{
		s:       s,
		conn:    conn,
		queue:   make(chan *sqliteOp, maxBatch),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
		batch:   make([]*sqliteOp, 0, maxBatch),
	}
	w.st.x = conn
	w.st.insertRows = w.rows.get
	fail := func(err error) (*sqliteWriter, error) {
		w.closeStmts()
		conn.Close()
		return nil, err
	}
	// The writer waits for the write lock like the ledger's writer does:
	// keep the pool's busy timeout if it has one, else wait 10 s.
	var busy int64
	if err := conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy); err != nil {
		return fail(err)
	}
	if busy == 0 {
		if _, err := conn.ExecContext(ctx, "PRAGMA busy_timeout = 10000"); err != nil {
			return fail(err)
		}
	}
	for i, p := range w.st.all() {
		if *p, err = conn.PrepareContext(ctx, sqliteQueries[i]); err != nil {
			return fail(fmt.Errorf("preparing %q: %w", sqliteQueries[i], err))
		}
	}
	if err := w.rows.prepare(func(q string) (*sql.Stmt, error) { return conn.PrepareContext(ctx, q) }); err != nil {
		return fail(err)
	}
	go w.loop()
	return w, nil
}

func (w *sqliteWriter) closeStmts() {
	for _, p := range w.st.all() {
		if *p != nil {
			(*p).Close()
		}
	}
	w.rows.close()
}

// rowStmts are the statements of insertRowsSQL for 2, 4, ...,
// sqliteInsertRows rows, by log2 of their rows.
type rowStmts [8]*sql.Stmt

func (r *rowStmts) prepare(prepare func(q string) (*sql.Stmt, error)) error {
	for n := 2; n <= sqliteInsertRows; n *= 2 {
		st, err := prepare(insertRowsSQL(n))
		if err != nil {
			return fmt.Errorf("preparing the insert of %d messages: %w", n, err)
		}
		r[rowIndex(n)] = st
	}
	return nil
}

// get returns the statement that inserts n rows, n a power of two from 2
// to sqliteInsertRows.
func (r *rowStmts) get(n int) *sql.Stmt { return r[rowIndex(n)] }

// rowIndex is the index in rowStmts of the statement that inserts n rows.
func rowIndex(n int) int { return bits.TrailingZeros(uint(n)) }

// close closes the statements but keeps them: a unit that the group
// committer already holds may still bind one to its transaction, which
// then prepares it again on the transaction's connection (as for the
// other statements of gcWriter.prepared).
func (r *rowStmts) close() {
	for _, st := range r {
		if st != nil {
			st.Close()
		}
	}
}

// insertRowsSQL inserts n messages that take no part in dedup and returns
// their ids: 7 parameters a row (queue, body, attributes, group, dedup id,
// visible at, published). A dedup id is only carried to the receiver here
// (the queue's dedup window is off).
func insertRowsSQL(n int) string {
	var b strings.Builder
	b.WriteString(sqliteInsertHead)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?, ?, ?, ?, ?)")
	}
	b.WriteString(" RETURNING id")
	return b.String()
}

// do queues run and waits for its answer. If ctx ends first, do returns
// ctx's error: the operation does not run if the writer has not taken it
// yet; otherwise it may or may not commit, and late (if not nil) runs
// once it has.
func (w *sqliteWriter) do(ctx context.Context, run func(st *sqliteStmts, now int64) error, late func()) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	o := &sqliteOp{ctx: ctx, run: run, late: late, done: make(chan struct{})}
	select {
	case w.queue <- o:
	case <-w.closing:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-o.done:
		return o.err
	case <-ctx.Done():
		if !o.state.CompareAndSwap(opQueued, opAbandoned) && o.late != nil {
			go func() {
				<-o.done
				if o.err == nil {
					o.late()
				}
			}()
		}
		return ctx.Err()
	case <-w.done:
		select {
		case <-o.done:
			return o.err
		default:
			return ErrClosed
		}
	}
}

func (o *sqliteOp) finish(err error) {
	o.err = err
	close(o.done)
}

func (w *sqliteWriter) loop() {
	defer func() {
		w.closeStmts()
		w.conn.Close()
		close(w.done)
	}()
	for {
		select {
		case o := <-w.queue:
			w.batch = append(w.batch[:0], o)
		case <-w.closing:
			for {
				select {
				case o := <-w.queue:
					o.finish(ErrClosed)
				default:
					return
				}
			}
		}
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

func (w *sqliteWriter) close() {
	close(w.closing)
	<-w.done
}

var bg = context.Background()

func (w *sqliteWriter) exec(q string) error {
	_, err := w.conn.ExecContext(bg, q)
	return err
}

// runBatch runs batch in one transaction and answers every operation. If
// an operation fails, the transaction (which the failure may have
// damaged) rolls back, that operation gets its error and the others run
// again in a new one. If the COMMIT fails, every operation gets the error.
func (w *sqliteWriter) runBatch(batch []*sqliteOp) {
	s := w.s
	live := batch[:0]
	for _, o := range batch {
		if !o.state.CompareAndSwap(opQueued, opTaken) {
			continue // the caller gave up: it does not run
		}
		if err := o.ctx.Err(); err != nil {
			o.finish(err) // the caller is giving up: it does not run either
			continue
		}
		live = append(live, o)
	}
	batch = live
	for len(batch) > 0 {
		unlock := s.lockWrites()
		if err := w.exec("BEGIN IMMEDIATE"); err != nil {
			// A transaction left open by a failed COMMIT: end it, try once more.
			if w.exec("ROLLBACK") == nil {
				err = w.exec("BEGIN IMMEDIATE")
			}
			if err != nil {
				unlock()
				err = fmt.Errorf("sqlqueue: begin: %w", err)
				s.cfg.logger.Error("sqlqueue: write transaction failed to begin", "err", err, "ops", len(batch))
				for _, o := range batch {
					o.finish(s.wrapErr(err))
				}
				return
			}
		}
		now := s.now()
		failed := -1
		for i, o := range batch {
			if o.err = o.run(&w.st, now); o.err != nil && !errors.Is(o.err, ErrReceiptExpired) {
				failed = i
				break
			}
		}
		if failed < 0 {
			s.sweepDue(&w.st, now)
		}
		if failed >= 0 {
			w.exec("ROLLBACK")
			unlock()
			o := batch[failed]
			o.finish(s.wrapErr(o.err))
			batch = append(batch[:failed], batch[failed+1:]...)
			continue
		}
		err := w.exec("COMMIT")
		if err != nil {
			w.exec("ROLLBACK")
		}
		unlock()
		if err != nil {
			err = fmt.Errorf("sqlqueue: commit: %w", err)
			s.cfg.logger.Error("sqlqueue: write transaction failed to commit", "err", err, "ops", len(batch))
			for _, o := range batch {
				o.finish(s.wrapErr(err))
			}
			return
		}
		for _, o := range batch {
			o.finish(o.err)
		}
		return
	}
}

// sweepDue deletes up to 1,000 expired dedup ids inside the current write
// transaction, once a minute.
func (s *SQLite) sweepDue(st *sqliteStmts, now int64) {
	if now-s.lastSweep.Load() <= int64(time.Minute/time.Microsecond) {
		return
	}
	s.lastSweep.Store(now)
	if _, err := st.sweep.Exec(now, 1000); err != nil {
		s.cfg.logger.Warn("sqlqueue: sweeping expired dedup ids", "err", err)
	}
}

// GroupCommitter runs units of work in the write transactions of another
// writer: fn runs in a savepoint of the writer's next transaction (its
// error rolls back its writes only) and the call returns once that
// transaction has committed, or failed. If ctx ends while fn is still
// queued, the call returns ctx's error and fn does not run; once fn has
// begun, the call waits for the transaction's outcome. tx must be a
// transaction of the *sql.DB the [SQLite] handle was made on.
// *sqlitestore.Store implements it with its WriteTx, its group-commit
// writer; see [WithGroupCommit].
type GroupCommitter interface {
	WriteTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error
}

// gcWriter is sqliteWrites on a GroupCommitter: every write of the handle
// is a unit of work of the committer's writer.
type gcWriter struct {
	s        *SQLite
	gc       GroupCommitter
	prepared sqliteStmts // on the pool; bound to each transaction
	rows     rowStmts    // on the pool; bound to a transaction when it uses them
	rowsTx   rowStmts    // rows bound to tx (closed with it), when used

	// The statements bound to the last transaction a unit ran in. Units
	// run one at a time (the committer's writer runs them in turn), so
	// only they touch these.
	tx *sql.Tx
	st sqliteStmts
}

func newGCWriter(ctx context.Context, s *SQLite, gc GroupCommitter) (*gcWriter, error) {
	g := &gcWriter{s: s, gc: gc}
	g.st.insertRows = g.boundRows
	var err error
	for i, p := range g.prepared.all() {
		if *p, err = s.db.PrepareContext(ctx, sqliteQueries[i]); err != nil {
			g.close()
			return nil, fmt.Errorf("preparing %q: %w", sqliteQueries[i], err)
		}
	}
	if err := g.rows.prepare(func(q string) (*sql.Stmt, error) { return s.db.PrepareContext(ctx, q) }); err != nil {
		g.close()
		return nil, err
	}
	// Check that the committer's transactions are on s.db (a statement
	// of another pool fails only when it runs).
	err = gc.WriteTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		st := g.bind(tx)
		var id, exp int64
		err := st.dedupGet.QueryRowContext(ctx, "", "").Scan(&id, &exp)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		return err
	})
	if err != nil {
		g.close()
		return nil, fmt.Errorf("the group committer's transactions are not on the handle's database: %w", err)
	}
	return g, nil
}

// bind returns the statements bound to tx.
func (g *gcWriter) bind(tx *sql.Tx) *sqliteStmts {
	if g.tx != tx {
		g.tx = tx
		pp, bp := g.prepared.all(), g.st.all()
		for i := range pp {
			*bp[i] = tx.StmtContext(bg, *pp[i]) // closed when tx ends
		}
		g.st.x = tx
		g.rowsTx = rowStmts{}
	}
	return &g.st
}

// boundRows is g.st.insertRows: the statement of g.rows for n rows, bound
// to the unit's transaction the first time the transaction uses it.
func (g *gcWriter) boundRows(n int) *sql.Stmt {
	i := rowIndex(n)
	if g.rowsTx[i] == nil {
		g.rowsTx[i] = g.tx.StmtContext(bg, g.rows[i])
	}
	return g.rowsTx[i]
}

// do runs run as a unit of work. late is not needed: the committer answers
// a unit it has begun with its outcome, whatever ctx does (a receive whose
// ctx ended meanwhile hands its messages back itself).
func (g *gcWriter) do(ctx context.Context, run func(st *sqliteStmts, now int64) error, _ func()) error {
	err := g.gc.WriteTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		st := g.bind(tx)
		st.ctx = ctx
		now := g.s.now()
		err := run(st, now)
		if err == nil {
			g.s.sweepDue(st, now)
		}
		return err
	})
	if errors.Is(err, idem.ErrClosed) && !errors.Is(err, ErrClosed) {
		// The committer (the ledger's store) was closed under the queue:
		// the queue can write no more, as if it were closed itself.
		err = fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return err
}

func (g *gcWriter) close() {
	for _, p := range g.prepared.all() {
		if *p != nil {
			(*p).Close()
		}
	}
	g.rows.close()
}
