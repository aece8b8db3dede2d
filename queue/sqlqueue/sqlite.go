package sqlqueue

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"math/bits"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/internal/migrations"
	"github.com/idemkit/idem/queue"
)

//go:embed migrations
var migrationFiles embed.FS

// sqliteComponent names the queue's rows in idem_migrations, the table it
// shares with store/sqlitestore.
const sqliteComponent = "sqlqueue"

// SQLite holds the queues kept in one SQLite database, usually the file of
// a store/sqlitestore.Store (open it on the store's DB()). Make one with
// [NewSQLite]; it is safe for concurrent use. Its writes (receives,
// settles, publishes) are group-committed: by the store's writer with
// [WithGroupCommit], else by a writer of its own on one connection of the
// pool. Close it before the store and the database.
type SQLite struct {
	db        *sql.DB
	cfg       config
	w         sqliteWrites
	wakers    wakers
	closed    atomic.Bool
	lastSweep atomic.Int64
	acks      unitGroups[*sqliteAckCall]
	completes unitGroups[*sqliteCompleteCall] // the fused path's (WithLedger)
	ledger    sqliteLedger                    // WithLedger's store, or nil

	// txStmts are PublishTx's statements, prepared on db once it
	// succeeds (a failure, such as tables not made yet, is tried again
	// next time): a transaction reuses the copy its connection already
	// prepared.
	txStmts struct {
		ready atomic.Pointer[[3]*sql.Stmt] // sqliteDedupGet, sqliteInsert, sqliteDedupPut
		mu    sync.Mutex                   // preparing them
	}
}

// NewSQLite returns the queues of db, creating or updating their tables
// unless [WithMigrate](false) says otherwise. db must be a
// modernc.org/sqlite pool on a file in WAL mode (a sqlitestore.Store's
// DB() is); the tables are idem_queue_messages, idem_queue_dead and
// idem_queue_dedup, versioned in idem_migrations under the component
// "sqlqueue". ctx bounds the opening only.
//
// With [WithGroupCommit] the handle's writes run in the committer's
// transactions. Otherwise the handle keeps one connection of db for its
// writer until [SQLite.Close]; its writes wait up to the connection's busy
// timeout (10 s if the pool sets none) for SQLite's write lock, which the
// store's writer and other processes also take.
func NewSQLite(ctx context.Context, db *sql.DB, opts ...Option) (*SQLite, error) {
	if db == nil {
		return nil, errors.New("sqlqueue: NewSQLite: nil db")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	s := &SQLite{db: db, cfg: cfg}
	if cfg.ledger != nil {
		l, err := s.checkLedger()
		if err != nil {
			return nil, err
		}
		s.ledger = l
	}
	if cfg.migrate {
		if err := s.migrate(ctx); err != nil {
			return nil, err
		}
	}
	var err error
	if s.cfg.groupCommit != nil { // WithGroupCommit, or WithLedger's store
		s.w, err = newGCWriter(ctx, s, s.cfg.groupCommit)
	} else {
		s.w, err = newSQLiteWriter(ctx, s)
	}
	if err != nil {
		return nil, s.wrapErr(fmt.Errorf("sqlqueue: starting the writer: %w", err))
	}
	s.lastSweep.Store(s.now())
	return s, nil
}

// Close stops the writer (calls queued for it fail with [ErrClosed]) and
// returns its connection to the pool; it does not close the pool. With
// [WithGroupCommit], the calls whose units the committer already holds
// still run and get their answer. Waiting receives and later calls fail
// with ErrClosed. Closing twice does nothing.
func (s *SQLite) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.w.close()
	s.wakers.wakeAll() // waiting receivers return ErrClosed
	s.txStmts.mu.Lock()
	if sts := s.txStmts.ready.Load(); sts != nil {
		for _, st := range sts {
			st.Close()
		}
	}
	s.txStmts.mu.Unlock()
	return nil
}

// publishTxStmts returns PublishTx's statements prepared on the pool.
func (s *SQLite) publishTxStmts(ctx context.Context) ([3]*sql.Stmt, error) {
	if sts := s.txStmts.ready.Load(); sts != nil {
		return *sts, nil
	}
	s.txStmts.mu.Lock()
	defer s.txStmts.mu.Unlock()
	if sts := s.txStmts.ready.Load(); sts != nil {
		return *sts, nil
	}
	var sts [3]*sql.Stmt
	for i, q := range []string{sqliteDedupGet, sqliteInsert, sqliteDedupPut} {
		st, err := s.db.PrepareContext(context.WithoutCancel(ctx), q)
		if err != nil {
			for _, p := range sts[:i] {
				p.Close()
			}
			return sts, err
		}
		sts[i] = st
	}
	s.txStmts.ready.Store(&sts)
	return sts, nil
}

func (s *SQLite) now() int64 { return s.cfg.clock().UnixMicro() }

// lockWrites takes the process-local write turn of [WithWriteLock], if
// one was given; SQLite's own lock serializes the writers either way.
func (s *SQLite) lockWrites() (unlock func()) {
	if s.cfg.writeLock == nil {
		return func() {}
	}
	return s.cfg.writeLock(bg)
}

func (s *SQLite) wrapErr(err error) error {
	if err == nil {
		return nil
	}
	if s.closed.Load() && !errors.Is(err, ErrClosed) {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	// The pool was closed under the handle (with WithGroupCommit, the
	// store closes it): the handle can do no more, as if closed itself.
	// database/sql does not export the error.
	if !errors.Is(err, ErrClosed) && strings.Contains(err.Error(), "sql: database is closed") {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	if strings.Contains(err.Error(), "no such table: idem_queue_") {
		return fmt.Errorf("%w (open the queue with migrations on): %w", ErrNoTables, err)
	}
	if strings.Contains(err.Error(), "no such index: idem_queue_messages_group_in_flight") {
		return fmt.Errorf("%w: they are older than this build (migration 002; open the queue with migrations on once): %w", ErrNoTables, err)
	}
	if strings.Contains(err.Error(), "no such column: held_visible_at") {
		return fmt.Errorf("%w: they are older than this build (migration 003; open the queue with migrations on once): %w", ErrNoTables, err)
	}
	return err
}

func (s *SQLite) migrate(ctx context.Context) error {
	ms, err := migrations.Load(migrationFiles, "migrations/sqlite", "sqlqueue")
	if err != nil {
		return err
	}
	// Migrations only add: an older build works on a newer schema.
	return migrations.ApplySQLite(ctx, s.db, sqliteComponent, ms, s.now(), true, s.cfg.logger)
}

// Queue returns the queue name of the database (queues need no creating:
// a name with no messages is an empty queue). opts apply after the
// handle's [WithDefaults]. Two values for the same name are the same
// queue; each has its own options (visibility, dedup window).
func (s *SQLite) Queue(name string, opts ...QueueOption) (*SQLiteQueue, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	cfg := s.cfg.queue
	for _, o := range opts {
		o(&cfg)
	}
	return &SQLiteQueue{s: s, name: name, cfg: cfg, wake: s.wakers.get(name)}, nil
}

// Stats returns the stats of every queue that has messages or dead
// letters, sorted by name. It scans the tables: an operator's call, not a
// hot path.
func (s *SQLite) Stats(ctx context.Context) ([]Stats, error) {
	return s.stats(ctx, "")
}

func (s *SQLite) stats(ctx context.Context, only string) ([]Stats, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	now := s.now()
	where, args := "", []any{now, now, now}
	if only != "" {
		where = " WHERE queue = ?"
	}
	qargs := args
	if only != "" {
		qargs = append(qargs, only)
	}
	byName := map[string]*Stats{}
	get := func(q string) *Stats {
		st := byName[q]
		if st == nil {
			st = &Stats{Queue: q}
			byName[q] = st
		}
		return st
	}
	rows, err := s.db.QueryContext(ctx, `SELECT queue,
	COALESCE(SUM(COALESCE(held_visible_at, visible_at) <= ?), 0),
	COALESCE(SUM(visible_at > ? AND receipt IS NOT NULL), 0),
	COALESCE(SUM(COALESCE(held_visible_at, visible_at) > ? AND receipt IS NULL), 0),
	MIN(published)
FROM idem_queue_messages`+where+` GROUP BY queue`, qargs...)
	if err != nil {
		return nil, s.wrapErr(fmt.Errorf("sqlqueue: stats: %w", err))
	}
	for rows.Next() {
		var q string
		var ready, inFlight, delayed, oldest int64
		if err := rows.Scan(&q, &ready, &inFlight, &delayed, &oldest); err != nil {
			rows.Close()
			return nil, fmt.Errorf("sqlqueue: stats: %w", err)
		}
		st := get(q)
		st.Ready, st.InFlight, st.Delayed = ready, inFlight, delayed
		st.OldestAge = max(time.Duration(now-oldest)*time.Microsecond, 0)
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("sqlqueue: stats: %w", err)
	}
	var dargs []any
	if only != "" {
		dargs = append(dargs, only)
	}
	rows, err = s.db.QueryContext(ctx, `SELECT queue, COUNT(*) FROM idem_queue_dead`+where+` GROUP BY queue`, dargs...)
	if err != nil {
		return nil, s.wrapErr(fmt.Errorf("sqlqueue: stats: %w", err))
	}
	for rows.Next() {
		var q string
		var n int64
		if err := rows.Scan(&q, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("sqlqueue: stats: %w", err)
		}
		get(q).DeadLettered = n
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("sqlqueue: stats: %w", err)
	}
	out := make([]Stats, 0, len(byName))
	for _, st := range byName {
		out = append(out, *st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Queue < out[j].Queue })
	return out, nil
}

// Sweep deletes up to limit dedup ids whose window has passed, and
// returns how many it deleted. An expired id already behaves as absent;
// the writer also sweeps up to 1,000 of them a minute on its own.
func (s *SQLite) Sweep(ctx context.Context, limit int) (int, error) {
	if s.closed.Load() {
		return 0, ErrClosed
	}
	if limit <= 0 {
		return 0, nil
	}
	var n int64
	err := s.w.do(ctx, func(st *sqliteStmts, now int64) error {
		res, err := st.sweep.Exec(now, limit)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	}, nil)
	return int(n), s.wrapErr(err)
}

// SQLiteQueue is one named queue of a [SQLite] database. It implements
// [queue.Source], [queue.Publisher] and [queue.TxPublisher] for *sql.Tx.
type SQLiteQueue struct {
	s    *SQLite
	name string
	cfg  queueConfig
	wake *waker
}

var (
	_ queue.Source               = (*SQLiteQueue)(nil)
	_ queue.Publisher            = (*SQLiteQueue)(nil)
	_ queue.TxPublisher[*sql.Tx] = (*SQLiteQueue)(nil)
)

// Name returns the queue's name.
func (q *SQLiteQueue) Name() string { return q.name }

// Visibility implements [queue.Source]: the queue's visibility timeout.
func (q *SQLiteQueue) Visibility() time.Duration { return q.cfg.visibility }

// Publish implements [queue.Publisher]: it inserts the message in the
// writer's next transaction and returns once that has committed. With a
// dedup id (Outgoing.DedupID, or the body's hash under
// [WithContentDedup]) seen inside the dedup window, nothing is inserted
// and the first message's id comes back with Duplicate set. A publish
// wakes this process's receivers of the queue at once; other processes'
// find the message at their next poll.
func (q *SQLiteQueue) Publish(ctx context.Context, m queue.Outgoing) (queue.Published, error) {
	if q.s.closed.Load() {
		return queue.Published{}, ErrClosed
	}
	if err := checkOutgoing(m); err != nil {
		return queue.Published{}, err
	}
	attrs, err := encodeAttrs(m.Attributes)
	if err != nil {
		return queue.Published{}, err
	}
	var p queue.Published
	dedup := q.cfg.dedupFor(m)
	err = q.s.w.do(ctx, func(st *sqliteStmts, now int64) (err error) {
		p, err = q.publishIn(st.dedupGet, st.insert, st.dedupPut, m, dedup, attrs, now)
		return err
	}, nil)
	if err != nil {
		return queue.Published{}, q.s.wrapErr(fmt.Errorf("sqlqueue: publish to %s: %w", q.name, err))
	}
	if !p.Duplicate {
		q.wake.wake()
	}
	return p, nil
}

// PublishBatch publishes ms in one transaction (which commits all or
// none of them), in order, and returns what each publish got, as Publish
// would have. Use it to load many messages at once.
func (q *SQLiteQueue) PublishBatch(ctx context.Context, ms []queue.Outgoing) ([]queue.Published, error) {
	if q.s.closed.Load() {
		return nil, ErrClosed
	}
	attrs := make([][]byte, len(ms))
	dedups := make([]string, len(ms)) // computed off the writer: content dedup hashes the body
	for i, m := range ms {
		if err := checkOutgoing(m); err != nil {
			return nil, err
		}
		var err error
		if attrs[i], err = encodeAttrs(m.Attributes); err != nil {
			return nil, err
		}
		dedups[i] = q.cfg.dedupFor(m)
	}
	out := make([]queue.Published, len(ms))
	err := q.s.w.do(ctx, func(st *sqliteStmts, now int64) error {
		for i := 0; i < len(ms); {
			if dedups[i] != "" {
				var err error
				if out[i], err = q.publishIn(st.dedupGet, st.insert, st.dedupPut, ms[i], dedups[i], attrs[i], now); err != nil {
					return err
				}
				i++
				continue
			}
			// A run of messages without a dedup id: many rows per INSERT,
			// a power of two of them (a statement for each size is
			// prepared once).
			n := 1
			for n < sqliteInsertRows && i+n < len(ms) && dedups[i+n] == "" {
				n++
			}
			n = 1 << (bits.Len(uint(n)) - 1)
			if err := q.insertRows(st, ms[i:i+n], attrs[i:i+n], out[i:i+n], now); err != nil {
				return err
			}
			i += n
		}
		return nil
	}, nil)
	if err != nil {
		return nil, q.s.wrapErr(fmt.Errorf("sqlqueue: publish to %s: %w", q.name, err))
	}
	q.wake.wake()
	return out, nil
}

// PublishTx implements [queue.TxPublisher]: it inserts the message in
// tx, the caller's transaction on the same database (for instance the one
// idem.DoTx hands to its function on a sqlitestore.Store), so the message
// is queued if and only if tx commits. Dedup works as for Publish, inside
// tx. Receivers of this process are woken at once (they find the message
// once tx has committed, polling from 5 ms on).
func (q *SQLiteQueue) PublishTx(ctx context.Context, tx *sql.Tx, m queue.Outgoing) (queue.Published, error) {
	if q.s.closed.Load() {
		return queue.Published{}, ErrClosed
	}
	if tx == nil {
		return queue.Published{}, fmt.Errorf("%w: nil transaction", ErrBadMessage)
	}
	if err := checkOutgoing(m); err != nil {
		return queue.Published{}, err
	}
	attrs, err := encodeAttrs(m.Attributes)
	if err != nil {
		return queue.Published{}, err
	}
	prepared, err := q.s.publishTxStmts(ctx)
	if err != nil {
		return queue.Published{}, q.s.wrapErr(fmt.Errorf("sqlqueue: publish to %s: %w", q.name, err))
	}
	dedup := q.cfg.dedupFor(m)
	var stmts [3]*sql.Stmt
	for i, st := range prepared {
		if i != 1 && dedup == "" {
			continue
		}
		stmts[i] = tx.StmtContext(ctx, st)
		defer stmts[i].Close()
	}
	p, err := q.publishIn(stmts[0], stmts[1], stmts[2], m, dedup, attrs, q.s.now())
	if err != nil {
		return queue.Published{}, q.s.wrapErr(fmt.Errorf("sqlqueue: publish to %s: %w", q.name, err))
	}
	if !p.Duplicate {
		q.wake.wake()
	}
	return p, nil
}

// publishIn publishes m, whose dedup id is dedup ("" for none: see
// dedupFor), inside a write transaction.
func (q *SQLiteQueue) publishIn(get, insert, put *sql.Stmt, m queue.Outgoing, dedup string, attrs []byte, now int64) (queue.Published, error) {
	if dedup != "" {
		var id, exp int64
		err := get.QueryRow(q.name, dedup).Scan(&id, &exp)
		switch {
		case err == nil && exp > now:
			return queue.Published{ID: formatID(id), Duplicate: true}, nil
		case err != nil && !errors.Is(err, sql.ErrNoRows):
			return queue.Published{}, err
		}
	}
	body := m.Body
	if body == nil {
		body = []byte{}
	}
	var id int64
	err := insert.QueryRow(q.name, body, nullBytes(attrs), nullString(m.GroupID), nullString(m.DedupID),
		now+m.Delay.Microseconds(), now).Scan(&id)
	if err != nil {
		return queue.Published{}, err
	}
	if dedup != "" {
		if _, err := put.Exec(q.name, dedup, id, now+q.cfg.dedupWindow.Microseconds()); err != nil {
			return queue.Published{}, err
		}
	}
	return queue.Published{ID: formatID(id)}, nil
}

// sqliteInsertRows is the most messages PublishBatch inserts with one
// statement (6 parameters each, well under SQLite's 32,766); a power of
// two.
const sqliteInsertRows = 128

// insertRows inserts ms (none with a dedup id; a power of two of them, up
// to sqliteInsertRows) with one INSERT and sets out to their ids. One
// statement for many rows saves a statement's cost per message, and
// AUTOINCREMENT's update of sqlite_sequence, which SQLite makes once per
// statement.
func (q *SQLiteQueue) insertRows(st *sqliteStmts, ms []queue.Outgoing, attrs [][]byte, out []queue.Published, now int64) error {
	if len(ms) == 1 {
		p, err := q.publishIn(st.dedupGet, st.insert, st.dedupPut, ms[0], "", attrs[0], now)
		out[0] = p
		return err
	}
	stmt := st.insertRows(len(ms))
	args := make([]any, 0, 7*len(ms))
	for i, m := range ms {
		body := m.Body
		if body == nil {
			body = []byte{}
		}
		args = append(args, q.name, body, nullBytes(attrs[i]), nullString(m.GroupID), nullString(m.DedupID), now+m.Delay.Microseconds(), now)
	}
	ids, err := scanIDs(stmt.QueryContext(bg, args...))
	if err != nil {
		return err
	}
	// The rows are inserted in the order of VALUES, and AUTOINCREMENT
	// gives each a larger id than any before it.
	return publishedInOrder(ids, out)
}

// scanIDs reads the rows of a statement that returns one id per row:
// scanIDs(stmt.QueryContext(...)).
func scanIDs(rows *sql.Rows, err error) ([]int64, error) {
	if err != nil {
		return nil, err
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Close()
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func nullBytes(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}

// Receive implements [queue.Source]. It hands out up to max messages
// (max < 1 means 1) that are visible, oldest visible first, hiding each
// for the queue's visibility timeout and counting the receive. A message
// of a FIFO group is handed out only when every earlier message of its
// group has been acked or dead-lettered (so one per group per call). When
// none is visible, Receive waits: a publish through this process's
// handle wakes it at once; otherwise it looks again after 5 ms, doubling
// the wait up to the poll interval ([WithPollInterval]). It returns ctx's
// error when ctx is done first; a receive that the writer had already
// begun is then undone (its messages visible again, the receive
// uncounted) rather than hidden for the visibility timeout.
func (q *SQLiteQueue) Receive(ctx context.Context, max int) ([]queue.Delivery, error) {
	if max < 1 {
		max = 1
	}
	backoff := 5 * time.Millisecond
	for {
		if q.s.closed.Load() {
			return nil, ErrClosed
		}
		// Take the wake-up channel before looking, so that a publish
		// committed during the look is not missed.
		wake := q.wake.wait()
		ds, err := q.receive(ctx, max)
		if err != nil || len(ds) > 0 {
			return ds, err
		}
		if err := q.waitVisible(ctx, &backoff, wake); err != nil {
			return nil, err
		}
	}
}

// waitVisible waits until a read (which takes no lock) finds a visible
// message, backing off while none is.
func (q *SQLiteQueue) waitVisible(ctx context.Context, backoff *time.Duration, wake <-chan struct{}) error {
	for {
		select {
		case <-wake:
			*backoff = 5 * time.Millisecond
			return nil
		default:
		}
		if err := sleep(ctx, *backoff, wake); err != nil {
			return err
		}
		*backoff = min(2**backoff, q.s.cfg.poll)
		var one int
		err := q.s.db.QueryRowContext(ctx,
			`SELECT 1 FROM idem_queue_messages WHERE queue = ? AND visible_at <= ? LIMIT 1`, q.name, q.s.now()).Scan(&one)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, sql.ErrNoRows):
		case ctx.Err() != nil:
			return ctx.Err()
		default:
			return q.s.wrapErr(fmt.Errorf("sqlqueue: receive from %s: %w", q.name, err))
		}
	}
}

func (q *SQLiteQueue) receive(ctx context.Context, max int) ([]queue.Delivery, error) {
	var (
		ds      []queue.Delivery
		corrupt []corruptRow
	)
	err := q.s.w.do(ctx, func(st *sqliteStmts, now int64) (err error) {
		ds, corrupt, err = q.receiveIn(st, now, max)
		return err
	}, func() { q.handBack(ds) })
	if err != nil {
		return nil, q.s.wrapErr(fmt.Errorf("sqlqueue: receive from %s: %w", q.name, err))
	}
	if err := ctx.Err(); err != nil {
		// The caller gave up while the writer ran the receive (a group
		// committer answers a unit it has begun whatever ctx does): hand
		// the messages back rather than to a caller that has gone.
		q.handBack(ds)
		return nil, err
	}
	deadLetterCorrupt(q.s.cfg.logger, q.name, corrupt, q.deadLetter)
	return ds, nil
}

// receiveIn runs the receive statement in a unit of the writer and
// returns the deliveries in id order, and the messages it took whose
// attributes cannot be read, for the caller to dead-letter once the unit
// has committed.
func (q *SQLiteQueue) receiveIn(st *sqliteStmts, now int64, max int) ([]queue.Delivery, []corruptRow, error) {
	var (
		ds      []queue.Delivery
		corrupt []corruptRow
	)
	rows, err := st.receive.Query(now+q.cfg.visibility.Microseconds(), now, q.name, max)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		d := &delivery{s: q}
		var attrs, group, dedup sql.NullString
		var first sql.NullInt64
		var published int64
		if err := rows.Scan(&d.id, &d.msg.Body, &attrs, &group, &dedup, &d.msg.ReceiveCount,
			&d.receipt, &first, &published); err != nil {
			return nil, nil, err
		}
		if d.msg.Attributes, err = decodeAttrs([]byte(attrs.String)); err != nil {
			corrupt = append(corrupt, corruptRow{d, err})
			continue
		}
		d.msg.ID = formatID(d.id)
		d.msg.GroupID, d.msg.DedupID = group.String, dedup.String
		d.msg.FirstReceived = time.UnixMicro(first.Int64)
		d.msg.Published = time.UnixMicro(published)
		ds = append(ds, d)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].(*delivery).id < ds[j].(*delivery).id })
	return ds, corrupt, nil
}

// handBack returns messages that a receive took after its caller had
// given up: visible at once, the receive uncounted.
func (q *SQLiteQueue) handBack(ds []queue.Delivery) {
	if len(ds) == 0 {
		return
	}
	err := q.s.w.do(bg, func(st *sqliteStmts, now int64) error {
		for _, d := range ds {
			d := d.(*delivery)
			if _, err := st.handBack.Exec(now, d.id, d.receipt); err != nil {
				return err
			}
		}
		return nil
	}, nil)
	if err != nil {
		q.s.cfg.logger.Warn("sqlqueue: handing back messages received after the receiver gave up; they return after the visibility timeout",
			"queue", q.name, "messages", len(ds), "err", err)
		return
	}
	q.wake.wake()
}

// settle runs one conditional write of a delivery in the writer.
func (q *SQLiteQueue) settle(ctx context.Context, d *delivery, what string, wake bool,
	run func(st *sqliteStmts, now int64) (sql.Result, error)) error {
	if q.s.closed.Load() {
		return ErrClosed
	}
	err := q.s.w.do(ctx, func(st *sqliteStmts, now int64) error {
		res, err := run(st, now)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return expired(d.id)
		}
		return nil
	}, nil)
	if err != nil {
		if errors.Is(err, ErrReceiptExpired) {
			return err
		}
		return q.s.wrapErr(fmt.Errorf("sqlqueue: %s message %d of %s: %w", what, d.id, q.name, err))
	}
	if wake {
		q.wake.wake()
	}
	return nil
}

func (q *SQLiteQueue) retry(ctx context.Context, d *delivery, delay time.Duration) error {
	return q.settle(ctx, d, "retry", delay == 0, func(st *sqliteStmts, now int64) (sql.Result, error) {
		return st.retry.Exec(now+delay.Microseconds(), d.id, d.receipt)
	})
}

func (q *SQLiteQueue) extend(ctx context.Context, d *delivery, dur time.Duration) error {
	return q.settle(ctx, d, "extend", false, func(st *sqliteStmts, now int64) (sql.Result, error) {
		return st.extend.Exec(now+dur.Microseconds(), d.id, d.receipt)
	})
}

func (q *SQLiteQueue) deadLetter(ctx context.Context, d *delivery, reason string) error {
	return q.settle(ctx, d, "dead-letter", d.msg.GroupID != "", func(st *sqliteStmts, now int64) (sql.Result, error) {
		res, err := st.deadCopy.Exec(reason, now, d.id, d.receipt)
		if err != nil {
			return nil, err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return res, err
		}
		return st.deadDelete.Exec(d.id)
	})
}

// Stats returns the queue's stats.
func (q *SQLiteQueue) Stats(ctx context.Context) (Stats, error) {
	sts, err := q.s.stats(ctx, q.name)
	if err != nil || len(sts) == 0 {
		return Stats{Queue: q.name}, err
	}
	return sts[0], nil
}

// DeadLetters returns up to limit (limit < 1: 100) of the queue's dead
// letters, oldest message first, with the message as it was when it was
// dead-lettered (receive count included).
func (q *SQLiteQueue) DeadLetters(ctx context.Context, limit int) ([]DeadLetter, error) {
	if q.s.closed.Load() {
		return nil, ErrClosed
	}
	if limit < 1 {
		limit = 100
	}
	rows, err := q.s.db.QueryContext(ctx, `SELECT id, body, attributes, group_id, dedup_id, receive_count, first_received, published, reason, dead_at
FROM idem_queue_dead WHERE queue = ? ORDER BY id LIMIT ?`, q.name, limit)
	if err != nil {
		return nil, q.s.wrapErr(fmt.Errorf("sqlqueue: dead letters of %s: %w", q.name, err))
	}
	defer rows.Close()
	var out []DeadLetter
	for rows.Next() {
		var dl DeadLetter
		var id, published, at int64
		var attrs, group, dedup sql.NullString
		var first sql.NullInt64
		if err := rows.Scan(&id, &dl.Message.Body, &attrs, &group, &dedup, &dl.Message.ReceiveCount, &first, &published, &dl.Reason, &at); err != nil {
			return nil, fmt.Errorf("sqlqueue: dead letters of %s: %w", q.name, err)
		}
		// Attributes that cannot be read (the reason says so: a receive
		// dead-lettered the message for them) are left out, not the list.
		dl.Message.Attributes, _ = decodeAttrs([]byte(attrs.String))
		dl.Message.ID = formatID(id)
		dl.Message.GroupID, dl.Message.DedupID = group.String, dedup.String
		if first.Valid {
			dl.Message.FirstReceived = time.UnixMicro(first.Int64)
		}
		dl.Message.Published = time.UnixMicro(published)
		dl.At = time.UnixMicro(at)
		out = append(out, dl)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlqueue: dead letters of %s: %w", q.name, err)
	}
	return out, nil
}

// RedriveMessage moves the queue's dead letter with id (a
// [DeadLetter]'s Message.ID) back into the queue as [SQLiteQueue.Redrive]
// moves each one. It reports false when the queue has no dead letter with
// that id (never dead-lettered, already redriven, or not this queue's),
// and [ErrBadID] when id is not a message id.
func (q *SQLiteQueue) RedriveMessage(ctx context.Context, id string) (bool, error) {
	if q.s.closed.Load() {
		return false, ErrClosed
	}
	n, err := parseMessageID(id)
	if err != nil {
		return false, err
	}
	moved := false
	err = q.s.w.do(ctx, func(st *sqliteStmts, now int64) error {
		res, err := st.x.ExecContext(bg, `INSERT INTO idem_queue_messages (id, queue, body, attributes, group_id, dedup_id, visible_at, receive_count, published)
SELECT id, queue, body, attributes, group_id, dedup_id, ?, 0, published FROM idem_queue_dead WHERE queue = ? AND id = ?`, now, q.name, n)
		if err != nil {
			return err
		}
		if rows, err := res.RowsAffected(); err != nil || rows == 0 {
			moved = false
			return err
		}
		if _, err := st.x.ExecContext(bg, `DELETE FROM idem_queue_dead WHERE id = ?`, n); err != nil {
			return err
		}
		moved = true
		return nil
	}, nil)
	if err != nil {
		return false, q.s.wrapErr(fmt.Errorf("sqlqueue: redrive %s message %s: %w", q.name, id, err))
	}
	if moved {
		q.wake.wake()
	}
	return moved, nil
}

// Redrive moves up to limit of the queue's dead letters (limit < 1: all
// of them), oldest first, back into the queue, visible at once, with
// their receive count reset to 0 and their id, body, attributes, group
// and publish time kept. It returns how many it moved. It works in
// transactions of up to 1,000 messages: if it fails part way, what was
// moved stays moved.
func (q *SQLiteQueue) Redrive(ctx context.Context, limit int) (int, error) {
	if q.s.closed.Load() {
		return 0, ErrClosed
	}
	total, err := redrive(limit, func(n int) (int, error) {
		var moved int
		err := q.s.w.do(ctx, func(st *sqliteStmts, now int64) error {
			moved = 0
			ids, err := scanIDs(st.x.QueryContext(bg, `INSERT INTO idem_queue_messages (id, queue, body, attributes, group_id, dedup_id, visible_at, receive_count, published)
SELECT id, queue, body, attributes, group_id, dedup_id, ?, 0, published FROM idem_queue_dead WHERE queue = ? ORDER BY id LIMIT ?
RETURNING id`, now, q.name, n))
			if err != nil {
				return err
			}
			for _, id := range ids {
				if _, err := st.x.ExecContext(bg, `DELETE FROM idem_queue_dead WHERE id = ?`, id); err != nil {
					return err
				}
			}
			moved = len(ids)
			return nil
		}, nil)
		if err == nil && moved > 0 {
			q.wake.wake()
		}
		return moved, err
	})
	if err != nil {
		return total, q.s.wrapErr(fmt.Errorf("sqlqueue: redrive %s (after %d): %w", q.name, total, err))
	}
	return total, nil
}
