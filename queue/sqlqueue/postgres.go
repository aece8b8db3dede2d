package sqlqueue

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/internal/migrations"
	"github.com/idemkit/idem/internal/pgmigrations"
	"github.com/idemkit/idem/queue"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Postgres holds the queues kept in one PostgreSQL schema, on a pgx pool
// (a pgstore.Store's Pool(), or the program's). Make one with
// [NewPostgres]; it is safe for concurrent use, and any number of
// processes may use the same tables. Close it before the pool.
//
// Receivers are woken by LISTEN/NOTIFY on the channel "idem_queue" (in a
// named schema: "idem_queue.SCHEMA"), with the queue's name as payload.
// PublishTx, Retry, Redrive, DeadLetter and an Ack that frees the next
// message of a FIFO group notify in their own transaction (so the
// notification arrives when it commits). Publish notifies just after its
// commit, from one goroutine per handle that folds the publishes to a
// queue made meanwhile into one NOTIFY: a NOTIFY inside each publishing
// transaction would make their commits take turns (PostgreSQL queues
// notifications under a global lock at commit). Receivers of the same
// handle are woken at once. The handle listens on one connection of its
// own, taken from the pool (and out of it) at the first Receive; if that
// connection fails, receivers poll until it is back.
type Postgres struct {
	pool   *pgxpool.Pool
	cfg    config
	n      pgNames
	wakers wakers
	closed atomic.Bool

	lmu      sync.Mutex
	lstarted bool
	lready   chan struct{} // closed once LISTEN has run (or failed)
	lcancel  context.CancelFunc
	ldone    chan struct{}
	healthy  atomic.Bool // the listener is listening

	// The notifier sends the NOTIFYs of Publish after its commit, from one
	// goroutine, coalescing the publishes to a queue made meanwhile into
	// one: a NOTIFY in the publishing transaction would serialize the
	// commits of all publishers (PostgreSQL takes a global lock to queue
	// notifications at commit).
	nmu      sync.Mutex
	npending map[string]struct{}
	nkick    chan struct{}
	nstop    chan struct{}
	ndone    chan struct{}

	amu       sync.Mutex
	acks      *pgGroups[pgAck]                       // started by the first ack
	completes *pgGroups[pgCompletion]                // started by the first fused completion
	running   atomic.Pointer[pgGroups[pgCompletion]] // completes, once started: read without amu

	ledger pgLedger // WithLedger's store, or nil
}

type pgNames struct {
	schema                   string
	messages, dead, dedup    string // quoted, qualified
	seq                      string // the messages' id sequence, as a string literal
	hold, release            string // the held-message trigger functions (migration 003), quoted, qualified
	versions                 string
	channel                  string
	lockKey                  int64
	receive, publish, dedupP string
	publishQuiet, dedupQuiet string // without NOTIFY, for Publish (see notifier)
	publishMany              string // a run of messages without dedup ids, without NOTIFY
	ack, ackMany, ackNotify  string
	lockGroups               string
	retry                    string
	extend, deadLetter       string
}

func newPGNames(schema string) pgNames {
	qual := func(name string) string {
		if schema == "" {
			return pgx.Identifier{name}.Sanitize()
		}
		return pgx.Identifier{schema, name}.Sanitize()
	}
	h := fnv.New64a()
	h.Write([]byte("idem/sqlqueue\x00" + schema))
	ch := "idem_queue"
	if schema != "" {
		ch += "." + schema
	}
	if len(ch) > 63 { // identifiers are truncated to 63 bytes
		ch = ch[:63]
	}
	n := pgNames{
		schema:   schema,
		messages: qual("idem_queue_messages"),
		dead:     qual("idem_queue_dead"),
		dedup:    qual("idem_queue_dedup"),
		versions: qual("idem_queue_migrations"),
		channel:  ch,
		lockKey:  int64(h.Sum64()),
	}
	n.hold, n.release = qual("idem_queue_messages_hold"), qual("idem_queue_messages_release")
	n.seq = "'" + strings.ReplaceAll(qual("idem_queue_messages_id_seq"), "'", "''") + "'"
	// The messages behind a group's head are held (migration 003: their
	// visible_at is far ahead), so the range on visible_at never reaches
	// a backlog behind blocked groups. A group with a message in flight
	// is blocked (a redriven head may sort before a message in flight):
	// its groups are read once (on the groups' in-flight index: few rows)
	// and each candidate is looked up in that set by hash. The lower-id
	// check stays for the few unheld messages that are not heads: one in
	// flight when a redrive put a lower id before it, then retried or
	// timed out; one published under REPEATABLE READ whose snapshot
	// missed a lower id committed meanwhile. A candidate is visible, so
	// never in flight itself. The UPDATE then finds the picked rows by
	// primary key (id = ANY): joined with them instead, the cached generic
	// plan, not knowing the LIMIT, hashed the whole table on every receive
	// (24 ms for 10 messages of a 60,000-message queue, against 0.2 ms).
	n.receive = n.render(`WITH blocked AS MATERIALIZED (
	SELECT DISTINCT f.group_id FROM {{messages}} f
	WHERE f.queue = $1 AND f.group_id IS NOT NULL AND f.receipt IS NOT NULL AND f.visible_at > now()
	  AND f.visible_at < ` + pgHeldVisibleAt + `),
picked AS (
	SELECT m.id FROM {{messages}} m
	WHERE m.queue = $1 AND m.visible_at <= now()
	  AND (m.group_id IS NULL OR (m.group_id NOT IN (SELECT b.group_id FROM blocked b) AND NOT EXISTS (
		SELECT 1 FROM {{messages}} e WHERE e.queue = m.queue AND e.group_id = m.group_id AND e.id < m.id)))
	ORDER BY m.visible_at, m.id
	LIMIT $2
	FOR UPDATE SKIP LOCKED)
UPDATE {{messages}} m
SET visible_at = now() + $3 * interval '1 microsecond', receive_count = m.receive_count + 1,
	receipt = (random() * 4e18)::bigint, first_received = coalesce(m.first_received, now())
WHERE m.id = ANY (ARRAY(SELECT picked.id FROM picked))
RETURNING m.id, m.body, m.attributes::text, m.group_id, m.dedup_id, m.receive_count, m.receipt, m.first_received, m.published`)
	const insert = `INSERT INTO {{messages}} (id, queue, body, attributes, group_id, dedup_id, visible_at, published)
	SELECT id, $1, $2, $3::jsonb, $4, $5, statement_timestamp() + $6 * interval '1 microsecond', statement_timestamp() FROM newid
	RETURNING id`
	const notify = `
SELECT ins.id FROM ins, LATERAL (SELECT pg_notify($7, $1)) AS n`
	const quiet = `
SELECT ins.id FROM ins WHERE $7::text IS NOT NULL`
	publish := `WITH newid AS (SELECT nextval({{seq}}) AS id),
ins AS (` + insert + `)`
	n.publish = n.render(publish + notify)
	n.publishQuiet = n.render(publish + quiet)
	// A run of messages that take no part in dedup, in one statement: $1
	// the queue, then arrays of bodies, attributes (or NULL), group ids
	// (or NULL), delays (µs) and dedup ids (or NULL: with the dedup window
	// off a dedup id is only carried to the receiver). nextval, volatile,
	// runs after the ORDER BY, so the ids follow the messages' order.
	n.publishMany = n.render(`INSERT INTO {{messages}} (id, queue, body, attributes, group_id, dedup_id, visible_at, published)
SELECT nextval({{seq}}), $1, u.body, u.attributes::jsonb, u.group_id, u.dedup_id, statement_timestamp() + u.delay * interval '1 microsecond', statement_timestamp()
FROM unnest($2::bytea[], $3::text[], $4::text[], $5::bigint[], $6::text[]) WITH ORDINALITY AS u(body, attributes, group_id, delay, dedup_id, n)
ORDER BY u.n
RETURNING id`)
	// A dedup id claims the message id first: the upsert takes the id
	// unless an unexpired entry holds it (then nothing is inserted, and
	// the entry names the first message).
	dedup := `WITH newid AS (
	INSERT INTO {{dedup}} AS d (queue, dedup_id, message_id, expires_at)
	VALUES ($1, $8, nextval({{seq}}), statement_timestamp() + $9 * interval '1 microsecond')
	ON CONFLICT (queue, dedup_id) DO UPDATE SET message_id = excluded.message_id, expires_at = excluded.expires_at
	WHERE d.expires_at <= statement_timestamp()
	RETURNING message_id AS id),
ins AS (` + insert + `)`
	n.dedupP = n.render(dedup + notify)
	n.dedupQuiet = n.render(dedup + quiet)
	// lockGroups takes the held-message triggers' advisory locks (migration
	// 003) of the groups $1 of queue $2, in the order of the lock keys. A
	// transaction that writes into several groups takes them this way
	// before its commit, where the deferred insert trigger takes each
	// again (a no-op): two such transactions then cannot each hold a
	// group's lock while waiting for the other's, a deadlock.
	n.lockGroups = n.render(`SELECT count(*) FROM (SELECT pg_advisory_xact_lock(l.h) FROM (
	SELECT DISTINCT hashtextextended(u.g, hashtextextended($2::text, hashtextextended(ns.nspname::text, 0))) AS h
	FROM unnest($1::text[]) AS u(g), pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace
	WHERE c.oid = ` + n.messagesLit() + `::regclass AND u.g IS NOT NULL
	ORDER BY 1) AS l) AS locked`)
	n.ack = n.render(`DELETE FROM {{messages}} WHERE id = $1 AND receipt = $2`)
	n.ackMany = n.render(`DELETE FROM {{messages}} m USING unnest($1::bigint[], $2::bigint[]) AS a(id, receipt)
WHERE m.id = a.id AND m.receipt = a.receipt RETURNING m.id, m.receipt`)
	n.ackNotify = n.render(`WITH del AS (DELETE FROM {{messages}} WHERE id = $1 AND receipt = $2 RETURNING queue)
SELECT pg_notify($3, queue) FROM del`)
	n.retry = n.render(`WITH up AS (
	UPDATE {{messages}} SET visible_at = now() + $3 * interval '1 microsecond', receipt = NULL
	WHERE id = $1 AND receipt = $2 RETURNING queue)
SELECT pg_notify($4, queue) FROM up`)
	n.extend = n.render(`UPDATE {{messages}} SET visible_at = now() + $3 * interval '1 microsecond' WHERE id = $1 AND receipt = $2`)
	n.deadLetter = n.render(`WITH del AS (DELETE FROM {{messages}} WHERE id = $1 AND receipt = $2 RETURNING *),
ins AS (
	INSERT INTO {{dead}} (id, queue, body, attributes, group_id, dedup_id, receive_count, first_received, published, reason, dead_at)
	SELECT id, queue, body, attributes, group_id, dedup_id, receive_count, first_received, published, $3, now() FROM del
	ON CONFLICT (id) DO UPDATE SET reason = excluded.reason, dead_at = excluded.dead_at, receive_count = excluded.receive_count
	RETURNING queue)
SELECT pg_notify($4, queue) FROM ins`)
	return n
}

func (n pgNames) render(sql string) string {
	id := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	return strings.NewReplacer(
		"{{messages}}", n.messages,
		"{{dead}}", n.dead,
		"{{dedup}}", n.dedup,
		"{{seq}}", n.seq,
		"{{hold}}", n.hold,
		"{{release}}", n.release,
		"{{messages_visible}}", id("idem_queue_messages_visible"),
		"{{messages_group}}", id("idem_queue_messages_group"),
		"{{messages_group_in_flight}}", id("idem_queue_messages_group_in_flight"),
		"{{dead_queue}}", id("idem_queue_dead_queue"),
		"{{dedup_expires}}", id("idem_queue_dedup_expires"),
	).Replace(sql)
}

// NewPostgres returns the queues of pool's database, creating or updating
// their tables unless [WithMigrate](false) says otherwise: the tables
// idem_queue_messages, idem_queue_dead and idem_queue_dedup and their
// version table idem_queue_migrations, in the schema [WithSchema] names
// (default: the search_path's first). The migrations run in one
// transaction under an advisory lock, so processes may start together.
// ctx bounds the opening only. Closing the handle does not close pool.
//
// Times are the server's: each statement's own start (a publish inside a
// caller's transaction, PublishTx, measures its delay and its dedup window
// from the publish, not from the transaction's start); the
// handle's statements need READ COMMITTED, the default: NewPostgres fails
// with [ErrIsolation] when the pool's connections default to another
// level (default_transaction_isolation). Under another level the delete
// of a FIFO group's head could miss a message published behind it, so
// the migration's trigger refuses it, and the group would stall.
func NewPostgres(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (*Postgres, error) {
	if pool == nil {
		return nil, errors.New("sqlqueue: NewPostgres: nil pool")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	var level string
	if err := pool.QueryRow(ctx, "SELECT current_setting('default_transaction_isolation')").Scan(&level); err != nil {
		return nil, fmt.Errorf("sqlqueue: %w", err)
	}
	if level != "read committed" {
		return nil, fmt.Errorf("%w: the pool's connections default to %s (set default_transaction_isolation to read committed for them, e.g. in the pool config's RuntimeParams)", ErrIsolation, level)
	}
	p := &Postgres{pool: pool, cfg: cfg, n: newPGNames(cfg.schema)}
	if cfg.ledger != nil {
		l, err := checkLedger(ctx, pool, cfg.ledger)
		if err != nil {
			return nil, err
		}
		p.ledger = l
	}
	if cfg.migrate {
		if err := p.migrate(ctx); err != nil {
			return nil, err
		}
	} else {
		var exists bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", p.n.messages).Scan(&exists); err != nil {
			return nil, fmt.Errorf("sqlqueue: %w", err)
		}
		if !exists {
			return nil, fmt.Errorf("%w: no table %s (open the queue with migrations on)", ErrNoTables, p.n.messages)
		}
	}
	return p, nil
}

func (p *Postgres) migrate(ctx context.Context) error {
	ms, err := migrations.Load(migrationFiles, "migrations/postgres", "sqlqueue")
	if err != nil {
		return err
	}
	return pgmigrations.Apply(ctx, p.pool, ms, pgmigrations.Target{
		Component: "sqlqueue",
		Object:    p.n.messages,
		Schema:    p.n.schema,
		Versions:  p.n.versions,
		LockKey:   p.n.lockKey,
		Render:    p.n.render,
		Log:       p.cfg.logger,
	})
}

// notify announces a publish to name's receivers: this handle's at once,
// other processes' by a NOTIFY that the notifier sends shortly.
func (p *Postgres) notify(name string) {
	p.wakers.wakeName(name)
	p.nmu.Lock()
	defer p.nmu.Unlock()
	if p.nstop == nil {
		p.npending = map[string]struct{}{}
		p.nkick = make(chan struct{}, 1)
		p.nstop = make(chan struct{})
		p.ndone = make(chan struct{})
		go p.notifyLoop()
	}
	p.npending[name] = struct{}{}
	select {
	case p.nkick <- struct{}{}:
	default:
	}
}

func (p *Postgres) notifyLoop() {
	defer close(p.ndone)
	for {
		stopping := false
		select {
		case <-p.nkick:
		case <-p.nstop:
			stopping = true
		}
		p.nmu.Lock()
		names := make([]string, 0, len(p.npending))
		for n := range p.npending {
			names = append(names, n)
		}
		clear(p.npending)
		p.nmu.Unlock()
		for _, n := range names {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if _, err := p.pool.Exec(ctx, "SELECT pg_notify($1, $2)", p.n.channel, n); err != nil {
				p.cfg.logger.Warn("sqlqueue: NOTIFY after a publish failed; other processes' receivers find the message at their next poll",
					"queue", n, "err", err)
			}
			cancel()
		}
		if stopping {
			return
		}
	}
}

// Schema returns the schema [WithSchema] named ("" for the search_path's).
func (p *Postgres) Schema() string { return p.n.schema }

// Close stops the handle's listener (and closes its connection); it does
// not close the pool. Later calls fail with [ErrClosed]. Closing twice
// does nothing.
func (p *Postgres) Close() error {
	p.amu.Lock() // acker sees closed, or Close sees its acker
	already := p.closed.Swap(true)
	p.amu.Unlock()
	if already {
		return nil
	}
	p.lmu.Lock()
	started := p.lstarted
	p.lmu.Unlock()
	if started {
		p.lcancel()
		<-p.ldone
	}
	p.nmu.Lock()
	stop, done := p.nstop, p.ndone
	p.nmu.Unlock()
	if stop != nil {
		close(stop) // sends what is pending, then returns
		<-done
	}
	p.amu.Lock()
	acks, completes := p.acks, p.completes
	p.amu.Unlock()
	if acks != nil {
		acks.close() // acks a loop has taken finish; the others get ErrClosed
	}
	if completes != nil {
		completes.close()
	}
	return nil
}

func (p *Postgres) wrapErr(err error) error {
	if err == nil {
		return nil
	}
	if p.closed.Load() && !errors.Is(err, ErrClosed) {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" { // undefined_table
		return fmt.Errorf("%w: %s (open the queue with migrations on): %w", ErrNoTables, p.n.messages, err)
	}
	if errors.As(err, &pe) && pe.Code == "42703" && strings.Contains(pe.Message, "held_visible_at") { // undefined_column
		return fmt.Errorf("%w: %s is older than this build (migration 003; open the queue with migrations on once): %w", ErrNoTables, p.n.messages, err)
	}
	return err
}

// listen starts the listener once and waits until it has run LISTEN (or
// failed to), or ctx is done.
func (p *Postgres) listen(ctx context.Context) {
	p.lmu.Lock()
	if !p.lstarted && !p.closed.Load() {
		p.lstarted = true
		lctx, cancel := context.WithCancel(context.Background())
		p.lcancel = cancel
		p.lready = make(chan struct{})
		p.ldone = make(chan struct{})
		go p.listenLoop(lctx)
	}
	ready := p.lready
	p.lmu.Unlock()
	if ready == nil {
		return
	}
	select {
	case <-ready:
	case <-ctx.Done():
	}
}

func (p *Postgres) listenLoop(ctx context.Context) {
	defer close(p.ldone)
	readyOnce := sync.OnceFunc(func() { close(p.lready) })
	defer readyOnce()
	for ctx.Err() == nil {
		err := p.listenOnce(ctx, readyOnce)
		p.healthy.Store(false)
		p.wakers.wakeAll() // receivers fall back to polling
		if ctx.Err() != nil {
			return
		}
		p.cfg.logger.Warn("sqlqueue: LISTEN connection failed; receivers poll until it is back", "err", err)
		readyOnce()
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
}

func (p *Postgres) listenOnce(ctx context.Context, ready func()) error {
	pc, err := p.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pc.Hijack() // the listener's own, out of the pool
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{p.n.channel}.Sanitize()); err != nil {
		return err
	}
	p.healthy.Store(true)
	// Messages published while no listener ran were not announced.
	p.wakers.wakeAll()
	ready()
	for {
		nt, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		p.wakers.wakeName(nt.Payload)
	}
}

// Queue returns the queue name of the database (queues need no creating:
// a name with no messages is an empty queue). opts apply after the
// handle's [WithDefaults].
func (p *Postgres) Queue(name string, opts ...QueueOption) (*PostgresQueue, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	cfg := p.cfg.queue
	for _, o := range opts {
		o(&cfg)
	}
	return &PostgresQueue{p: p, name: name, cfg: cfg, wake: p.wakers.get(name)}, nil
}

// Stats returns the stats of every queue that has messages or dead
// letters, sorted by name. It scans the tables: an operator's call.
func (p *Postgres) Stats(ctx context.Context) ([]Stats, error) {
	return p.stats(ctx, "")
}

func (p *Postgres) stats(ctx context.Context, only string) ([]Stats, error) {
	if p.closed.Load() {
		return nil, ErrClosed
	}
	rows, err := p.pool.Query(ctx, `WITH m AS (
	SELECT queue,
		count(*) FILTER (WHERE coalesce(held_visible_at, visible_at) <= now()) AS ready,
		count(*) FILTER (WHERE visible_at > now() AND receipt IS NOT NULL) AS in_flight,
		count(*) FILTER (WHERE coalesce(held_visible_at, visible_at) > now() AND receipt IS NULL) AS delayed,
		coalesce(extract(epoch FROM now() - min(published)) * 1e6, 0)::bigint AS oldest
	FROM `+p.n.messages+` WHERE $1 = '' OR queue = $1 GROUP BY queue),
d AS (SELECT queue, count(*) AS dead FROM `+p.n.dead+` WHERE $1 = '' OR queue = $1 GROUP BY queue)
SELECT coalesce(m.queue, d.queue), coalesce(m.ready, 0), coalesce(m.in_flight, 0), coalesce(m.delayed, 0),
	coalesce(d.dead, 0), coalesce(m.oldest, 0)
FROM m FULL JOIN d ON m.queue = d.queue ORDER BY 1`, only)
	if err != nil {
		return nil, p.wrapErr(fmt.Errorf("sqlqueue: stats: %w", err))
	}
	defer rows.Close()
	var out []Stats
	for rows.Next() {
		var st Stats
		var oldest int64
		if err := rows.Scan(&st.Queue, &st.Ready, &st.InFlight, &st.Delayed, &st.DeadLettered, &oldest); err != nil {
			return nil, fmt.Errorf("sqlqueue: stats: %w", err)
		}
		st.OldestAge = max(time.Duration(oldest)*time.Microsecond, 0)
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, p.wrapErr(fmt.Errorf("sqlqueue: stats: %w", err))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Queue < out[j].Queue })
	return out, nil
}

// Sweep deletes up to limit dedup ids whose window has passed and returns
// how many it deleted. An expired id already behaves as absent (a publish
// takes it over); sweeping only reclaims space. Run it from time to time
// (the handle does not on its own).
func (p *Postgres) Sweep(ctx context.Context, limit int) (int, error) {
	if p.closed.Load() {
		return 0, ErrClosed
	}
	if limit <= 0 {
		return 0, nil
	}
	tag, err := p.pool.Exec(ctx, `DELETE FROM `+p.n.dedup+` WHERE (queue, dedup_id) IN (
	SELECT queue, dedup_id FROM `+p.n.dedup+` WHERE expires_at <= now() LIMIT $1 FOR UPDATE SKIP LOCKED)`, limit)
	if err != nil {
		return 0, p.wrapErr(fmt.Errorf("sqlqueue: sweep: %w", err))
	}
	return int(tag.RowsAffected()), nil
}

// PostgresQueue is one named queue of a [Postgres] database. It
// implements [queue.Source], [queue.Publisher] and [queue.TxPublisher] for
// [pgx.Tx].
type PostgresQueue struct {
	p    *Postgres
	name string
	cfg  queueConfig
	wake *waker
}

var (
	_ queue.Source              = (*PostgresQueue)(nil)
	_ queue.Publisher           = (*PostgresQueue)(nil)
	_ queue.TxPublisher[pgx.Tx] = (*PostgresQueue)(nil)
)

// Name returns the queue's name.
func (q *PostgresQueue) Name() string { return q.name }

// Visibility implements [queue.Source]: the queue's visibility timeout.
func (q *PostgresQueue) Visibility() time.Duration { return q.cfg.visibility }

// querier is the pool or a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Publish implements [queue.Publisher]: one INSERT (and NOTIFY) that has
// committed when Publish returns. With a dedup id (Outgoing.DedupID, or
// the body's hash under [WithContentDedup]) seen inside the dedup window,
// nothing is inserted and the first message's id comes back with
// Duplicate set; concurrent publishes of one id insert one message.
func (q *PostgresQueue) Publish(ctx context.Context, m queue.Outgoing) (queue.Published, error) {
	if q.p.closed.Load() {
		return queue.Published{}, ErrClosed
	}
	p, err := q.publishOn(ctx, q.p.pool, m, q.p.n.publishQuiet, q.p.n.dedupQuiet)
	if err == nil && !p.Duplicate {
		q.p.notify(q.name)
	}
	return p, err
}

// PublishTx implements [queue.TxPublisher]: it inserts the message in
// tx, the caller's transaction on the same database (for instance the one
// idem.DoTx hands to its function on a pgstore.Store), so the message is
// queued if and only if tx commits; receivers are notified at the commit.
// Dedup works as for Publish; under REPEATABLE READ or SERIALIZABLE a
// concurrent publish of the same dedup id makes tx fail with a
// serialization error instead of waiting.
func (q *PostgresQueue) PublishTx(ctx context.Context, tx pgx.Tx, m queue.Outgoing) (queue.Published, error) {
	if q.p.closed.Load() {
		return queue.Published{}, ErrClosed
	}
	if tx == nil {
		return queue.Published{}, fmt.Errorf("%w: nil transaction", ErrBadMessage)
	}
	return q.publishOn(ctx, tx, m, q.p.n.publish, q.p.n.dedupP)
}

// PublishBatch publishes ms in one transaction (which commits all or none
// of them), in order, and returns what each publish got, as Publish would
// have. A run of messages without a dedup id is one statement (of up to
// 1,000 rows). Use it to load many messages at once. Two batches
// publishing the same dedup ids at once in opposite orders may deadlock:
// PostgreSQL aborts one, which returns the error having published nothing.
func (q *PostgresQueue) PublishBatch(ctx context.Context, ms []queue.Outgoing) ([]queue.Published, error) {
	if q.p.closed.Load() {
		return nil, ErrClosed
	}
	args := make([][]any, len(ms))
	dedups := make([]string, len(ms)) // once per message: under content dedup it hashes the body
	for i, m := range ms {
		var err error
		if args[i], err = q.publishArgs(m); err != nil {
			return nil, err
		}
		dedups[i] = q.cfg.dedupFor(m)
	}
	out := make([]queue.Published, len(ms))
	err := pgx.BeginFunc(ctx, q.p.pool, func(tx pgx.Tx) error {
		for i := 0; i < len(ms); {
			if dedups[i] != "" {
				p, err := q.publishArgsOn(ctx, tx, args[i], dedups[i], q.p.n.publishQuiet, q.p.n.dedupQuiet)
				if err != nil {
					return err
				}
				out[i] = p
				i++
				continue
			}
			j := i + 1
			for j < len(ms) && j-i < publishManyRows && dedups[j] == "" {
				j++
			}
			if err := q.publishRun(ctx, tx, args[i:j], out[i:j]); err != nil {
				return err
			}
			i = j
		}
		return q.lockGroups(ctx, tx, groupsOf(ms))
	})
	if err != nil {
		return nil, q.p.wrapErr(fmt.Errorf("sqlqueue: publish to %s: %w", q.name, err))
	}
	for _, p := range out {
		if !p.Duplicate {
			q.p.notify(q.name)
			break
		}
	}
	return out, nil
}

// publishManyRows bounds the rows of one publishMany statement, and so
// the arrays a statement carries.
const publishManyRows = 1000

// publishRun inserts the messages of args (publishArgs, none with a dedup
// id) in tx with one statement and sets their ids in out.
func (q *PostgresQueue) publishRun(ctx context.Context, tx pgx.Tx, args [][]any, out []queue.Published) error {
	bodies, attrs, groups, delays, dedups := make([][]byte, len(args)), make([]any, len(args)), make([]any, len(args)), make([]int64, len(args)), make([]any, len(args))
	for i, a := range args { // publishArgs' $2 body, $3 attributes, $4 group id, $5 dedup id, $6 delay
		bodies[i], attrs[i], groups[i], dedups[i], delays[i] = a[1].([]byte), a[2], a[3], a[4], a[5].(int64)
	}
	rows, err := tx.Query(ctx, q.p.n.publishMany, q.name, bodies, attrs, groups, delays, dedups)
	if err != nil {
		return err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return err
	}
	// The ids were drawn in the messages' order (ORDER BY).
	return publishedInOrder(ids, out)
}

// lockGroups takes, in tx, the locks of the FIFO groups (distinct ids)
// that tx writes into, when there is more than one (see
// pgNames.lockGroups): a transaction writing into several groups then
// cannot deadlock with another.
func (q *PostgresQueue) lockGroups(ctx context.Context, tx pgx.Tx, groups []string) error {
	if len(groups) < 2 {
		return nil
	}
	var n int64
	return tx.QueryRow(ctx, q.p.n.lockGroups, groups, q.name).Scan(&n)
}

// groupsOf returns the distinct group ids of ms.
func groupsOf(ms []queue.Outgoing) []string {
	var groups []string
	seen := map[string]bool{}
	for _, m := range ms {
		if m.GroupID != "" && !seen[m.GroupID] {
			seen[m.GroupID] = true
			groups = append(groups, m.GroupID)
		}
	}
	return groups
}

// publishArgs checks m and returns the arguments of the publish
// statements ($1 – $7).
func (q *PostgresQueue) publishArgs(m queue.Outgoing) ([]any, error) {
	if err := checkOutgoing(m); err != nil {
		return nil, err
	}
	attrs, err := encodeAttrs(m.Attributes)
	if err != nil {
		return nil, err
	}
	body := m.Body
	if body == nil {
		body = []byte{}
	}
	var attrArg any
	if attrs != nil {
		attrArg = string(attrs)
	}
	return []any{q.name, body, attrArg, nullString(m.GroupID), nullString(m.DedupID), m.Delay.Microseconds(), q.p.n.channel}, nil
}

func (q *PostgresQueue) publishOn(ctx context.Context, db querier, m queue.Outgoing, plain, withDedup string) (queue.Published, error) {
	args, err := q.publishArgs(m)
	if err != nil {
		return queue.Published{}, err
	}
	return q.publishArgsOn(ctx, db, args, q.cfg.dedupFor(m), plain, withDedup)
}

// publishArgsOn publishes the message of args (publishArgs) with dedup id
// dedup ("" for none).
func (q *PostgresQueue) publishArgsOn(ctx context.Context, db querier, args []any, dedup, plain, withDedup string) (queue.Published, error) {
	for range 3 {
		var id int64
		var err error
		if dedup == "" {
			err = db.QueryRow(ctx, plain, args...).Scan(&id)
		} else {
			err = db.QueryRow(ctx, withDedup, append(args, dedup, q.cfg.dedupWindow.Microseconds())...).Scan(&id)
		}
		if err == nil {
			return queue.Published{ID: formatID(id)}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return queue.Published{}, q.p.wrapErr(fmt.Errorf("sqlqueue: publish to %s: %w", q.name, err))
		}
		// An unexpired entry holds the id: a duplicate of its message.
		err = db.QueryRow(ctx, `SELECT message_id FROM `+q.p.n.dedup+` WHERE queue = $1 AND dedup_id = $2`, q.name, dedup).Scan(&id)
		if err == nil {
			return queue.Published{ID: formatID(id), Duplicate: true}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return queue.Published{}, q.p.wrapErr(fmt.Errorf("sqlqueue: publish to %s: %w", q.name, err))
		}
		// Swept between the two statements: try again.
	}
	return queue.Published{}, fmt.Errorf("sqlqueue: publish to %s: dedup id %q keeps changing", q.name, dedup)
}

// Receive implements [queue.Source]. It hands out up to max messages
// (max < 1 means 1) that are visible, oldest visible first, with one
// UPDATE over a SELECT ... FOR UPDATE SKIP LOCKED, so concurrent receivers
// (in any process) never get the same message while it is hidden. A
// message of a FIFO group is handed out only when every earlier message of
// its group has been acked or dead-lettered (so one per group per call).
// When none is visible, Receive waits for a notification, for the next
// message to fall due (a delay or a visibility timeout ending), or for
// the poll interval, whichever comes first. It returns ctx's error when
// ctx is done first; a receive statement already sent runs to its end
// (bounded at 30 s) and its messages are then handed back, visible at
// once and the receive uncounted.
func (q *PostgresQueue) Receive(ctx context.Context, n int) ([]queue.Delivery, error) {
	var ds []queue.Delivery
	err := q.waitFor(ctx, func() (bool, error) {
		var err error
		ds, err = q.receive(ctx, max(n, 1))
		return len(ds) > 0, err
	})
	return ds, err
}

// waitFor calls try until it finds messages or fails, waiting between
// tries as Receive does.
func (q *PostgresQueue) waitFor(ctx context.Context, try func() (found bool, err error)) error {
	q.p.listen(ctx)
	for {
		if q.p.closed.Load() {
			return ErrClosed
		}
		wake := q.wake.wait()
		found, err := try()
		if err != nil || found {
			return err
		}
		wait := q.p.cfg.poll
		var due *int64
		err = q.p.pool.QueryRow(ctx, `SELECT (extract(epoch FROM min(visible_at) - now()) * 1e6)::bigint FROM `+q.p.n.messages+`
WHERE queue = $1 AND visible_at > now() AND visible_at < `+pgHeldVisibleAt, q.name).Scan(&due)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return q.p.wrapErr(fmt.Errorf("sqlqueue: receive from %s: %w", q.name, err))
		}
		if due != nil {
			wait = min(wait, max(time.Duration(*due)*time.Microsecond, time.Millisecond))
		}
		if err := sleep(ctx, wait, wake); err != nil {
			return err
		}
	}
}

// messagesLit is the messages table's qualified name as a string literal
// (for a regclass).
func (n pgNames) messagesLit() string {
	return "'" + strings.ReplaceAll(n.messages, "'", "''") + "'"
}

// pgHeldVisibleAt is the visible_at of held messages (migration 003):
// the messages of a FIFO group behind its head, which only the head's
// delete makes visible.
const pgHeldVisibleAt = `'2200-01-01 00:00:00+00'`

// receiveTimeout bounds a receive statement, which runs to its end even
// when the caller gives up meanwhile.
const receiveTimeout = 30 * time.Second

// receive runs one receive statement. It runs to its end even if ctx ends
// meanwhile (a statement cancelled after its commit would hide the
// messages it took for the visibility timeout); if ctx has ended by then,
// it hands the messages back and returns ctx's error.
func (q *PostgresQueue) receive(ctx context.Context, n int) ([]queue.Delivery, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), receiveTimeout)
	defer cancel()
	ds, err := q.receiveRows(sctx, n)
	if ctx.Err() != nil {
		q.handBack(ds)
		return nil, ctx.Err()
	}
	return ds, err
}

// handBack returns messages received after the caller gave up: visible
// at once, the receive uncounted.
func (q *PostgresQueue) handBack(ds []queue.Delivery) {
	if len(ds) == 0 {
		return
	}
	ids := make([]int64, len(ds))
	receipts := make([]int64, len(ds))
	for i, d := range ds {
		ids[i], receipts[i] = d.(*delivery).id, d.(*delivery).receipt
	}
	ctx, cancel := context.WithTimeout(context.Background(), receiveTimeout)
	defer cancel()
	_, err := q.p.pool.Exec(ctx, `WITH up AS (
	UPDATE `+q.p.n.messages+` m SET visible_at = now(), receipt = NULL, receive_count = m.receive_count - 1,
		first_received = CASE WHEN m.receive_count = 1 THEN NULL ELSE m.first_received END
	FROM unnest($1::bigint[], $2::bigint[]) AS r(id, receipt)
	WHERE m.id = r.id AND m.receipt = r.receipt
	RETURNING m.queue)
SELECT pg_notify($3, queue) FROM up`, ids, receipts, q.p.n.channel)
	if err != nil {
		q.p.cfg.logger.Warn("sqlqueue: handing back messages received after the receiver gave up; they return after the visibility timeout",
			"queue", q.name, "messages", len(ds), "err", err)
	}
}

func (q *PostgresQueue) receiveRows(ctx context.Context, max int) ([]queue.Delivery, error) {
	ds, corrupt, err := q.receiveOn(ctx, q.p.pool, max)
	if err != nil {
		return nil, err
	}
	deadLetterCorrupt(q.p.cfg.logger, q.name, corrupt, q.deadLetter)
	return ds, nil
}

// receiveOn runs the receive statement on db and returns the deliveries
// in id order, and the messages it took whose attributes cannot be read,
// for the caller to dead-letter once the receive has committed.
func (q *PostgresQueue) receiveOn(ctx context.Context, db querier, max int) ([]queue.Delivery, []corruptRow, error) {
	rows, err := db.Query(ctx, q.p.n.receive, q.name, max, q.cfg.visibility.Microseconds())
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, q.p.wrapErr(fmt.Errorf("sqlqueue: receive from %s: %w", q.name, err))
	}
	defer rows.Close()
	var (
		ds      []queue.Delivery
		corrupt []corruptRow
	)
	for rows.Next() {
		d := &delivery{s: q}
		var attrs, group, dedup *string
		var first *time.Time
		if err := rows.Scan(&d.id, &d.msg.Body, &attrs, &group, &dedup, &d.msg.ReceiveCount, &d.receipt, &first, &d.msg.Published); err != nil {
			return nil, nil, fmt.Errorf("sqlqueue: receive from %s: %w", q.name, err)
		}
		if attrs != nil {
			if d.msg.Attributes, err = decodeAttrs([]byte(*attrs)); err != nil {
				corrupt = append(corrupt, corruptRow{d, err})
				continue
			}
		}
		d.msg.ID = formatID(d.id)
		if group != nil {
			d.msg.GroupID = *group
		}
		if dedup != nil {
			d.msg.DedupID = *dedup
		}
		if first != nil {
			d.msg.FirstReceived = *first
		}
		ds = append(ds, d)
	}
	if err := rows.Err(); err != nil {
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, q.p.wrapErr(fmt.Errorf("sqlqueue: receive from %s: %w", q.name, err))
	}
	rows.Close()
	sort.Slice(ds, func(i, j int) bool { return ds[i].(*delivery).id < ds[j].(*delivery).id })
	return ds, corrupt, nil
}

func (q *PostgresQueue) settle(ctx context.Context, d *delivery, what, sql string, args ...any) error {
	if q.p.closed.Load() {
		return ErrClosed
	}
	tag, err := q.p.pool.Exec(ctx, sql, args...)
	if err != nil {
		return q.p.wrapErr(fmt.Errorf("sqlqueue: %s message %d of %s: %w", what, d.id, q.name, err))
	}
	if tag.RowsAffected() == 0 {
		return expired(d.id)
	}
	return nil
}

func (q *PostgresQueue) ack(ctx context.Context, d *delivery) error {
	if d.msg.GroupID != "" {
		return q.settle(ctx, d, "ack", q.p.n.ackNotify, d.id, d.receipt, q.p.n.channel)
	}
	a := q.p.acker()
	if a == nil {
		return ErrClosed
	}
	return a.call(ctx, pgAck{d.id, d.receipt})
}

func (q *PostgresQueue) retry(ctx context.Context, d *delivery, delay time.Duration) error {
	return q.settle(ctx, d, "retry", q.p.n.retry, d.id, d.receipt, delay.Microseconds(), q.p.n.channel)
}

func (q *PostgresQueue) extend(ctx context.Context, d *delivery, dur time.Duration) error {
	return q.settle(ctx, d, "extend", q.p.n.extend, d.id, d.receipt, dur.Microseconds())
}

func (q *PostgresQueue) deadLetter(ctx context.Context, d *delivery, reason string) error {
	return q.settle(ctx, d, "dead-letter", q.p.n.deadLetter, d.id, d.receipt, reason, q.p.n.channel)
}

// Stats returns the queue's stats.
func (q *PostgresQueue) Stats(ctx context.Context) (Stats, error) {
	sts, err := q.p.stats(ctx, q.name)
	if err != nil || len(sts) == 0 {
		return Stats{Queue: q.name}, err
	}
	return sts[0], nil
}

// DeadLetters returns up to limit (limit < 1: 100) of the queue's dead
// letters, oldest message first, as they were when dead-lettered.
func (q *PostgresQueue) DeadLetters(ctx context.Context, limit int) ([]DeadLetter, error) {
	if q.p.closed.Load() {
		return nil, ErrClosed
	}
	if limit < 1 {
		limit = 100
	}
	rows, err := q.p.pool.Query(ctx, `SELECT id, body, attributes::text, group_id, dedup_id, receive_count, first_received, published, reason, dead_at
FROM `+q.p.n.dead+` WHERE queue = $1 ORDER BY id LIMIT $2`, q.name, limit)
	if err != nil {
		return nil, q.p.wrapErr(fmt.Errorf("sqlqueue: dead letters of %s: %w", q.name, err))
	}
	defer rows.Close()
	var out []DeadLetter
	for rows.Next() {
		var dl DeadLetter
		var id int64
		var attrs, group, dedup *string
		var first *time.Time
		if err := rows.Scan(&id, &dl.Message.Body, &attrs, &group, &dedup, &dl.Message.ReceiveCount, &first, &dl.Message.Published, &dl.Reason, &dl.At); err != nil {
			return nil, fmt.Errorf("sqlqueue: dead letters of %s: %w", q.name, err)
		}
		if attrs != nil {
			// Attributes that cannot be read (the reason says so: a
			// receive dead-lettered the message for them) are left out,
			// not the list.
			dl.Message.Attributes, _ = decodeAttrs([]byte(*attrs))
		}
		dl.Message.ID = formatID(id)
		if group != nil {
			dl.Message.GroupID = *group
		}
		if dedup != nil {
			dl.Message.DedupID = *dedup
		}
		if first != nil {
			dl.Message.FirstReceived = *first
		}
		out = append(out, dl)
	}
	if err := rows.Err(); err != nil {
		return nil, q.p.wrapErr(fmt.Errorf("sqlqueue: dead letters of %s: %w", q.name, err))
	}
	return out, nil
}

// RedriveMessage moves the queue's dead letter with id (a
// [DeadLetter]'s Message.ID) back into the queue as [PostgresQueue.Redrive]
// moves each one. It reports false when the queue has no dead letter with
// that id (never dead-lettered, already redriven, or not this queue's),
// and [ErrBadID] when id is not a message id.
func (q *PostgresQueue) RedriveMessage(ctx context.Context, id string) (bool, error) {
	if q.p.closed.Load() {
		return false, ErrClosed
	}
	n, err := parseMessageID(id)
	if err != nil {
		return false, err
	}
	moved, err := q.moveDead(ctx, `SELECT id FROM `+q.p.n.dead+` WHERE queue = $1 AND id = $2 FOR UPDATE`, n)
	if err != nil {
		return false, q.p.wrapErr(fmt.Errorf("sqlqueue: redrive %s message %s: %w", q.name, id, err))
	}
	return moved == 1, nil
}

// Redrive moves up to limit of the queue's dead letters (limit < 1: all
// of them), oldest first, back into the queue, visible at once, with
// their receive count reset to 0 and their id, body, attributes, group
// and publish time kept. It returns how many it moved. It works in
// statements of up to 1,000 messages: if it fails part way, what was
// moved stays moved.
func (q *PostgresQueue) Redrive(ctx context.Context, limit int) (int, error) {
	if q.p.closed.Load() {
		return 0, ErrClosed
	}
	total, err := redrive(limit, func(n int) (int, error) {
		return q.moveDead(ctx, `SELECT id FROM `+q.p.n.dead+` WHERE queue = $1 ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED`, int64(n))
	})
	if err != nil {
		return total, q.p.wrapErr(fmt.Errorf("sqlqueue: redrive %s (after %d): %w", q.name, total, err))
	}
	return total, nil
}

// moveDead moves the dead letters that pick selects (a query of their ids
// whose parameters are $1, the queue's name, and $2, arg) back into the
// queue in one transaction, and returns how many it moved. The messages'
// groups are locked in order before the commit, as PublishBatch does (see
// lockGroups).
func (q *PostgresQueue) moveDead(ctx context.Context, pick string, arg int64) (int, error) {
	var moved int
	err := pgx.BeginFunc(ctx, q.p.pool, func(tx pgx.Tx) error {
		var groups []string
		err := tx.QueryRow(ctx, `WITH picked AS (`+pick+`),
moved AS (DELETE FROM `+q.p.n.dead+` d USING picked WHERE d.id = picked.id RETURNING d.*),
ins AS (
	INSERT INTO `+q.p.n.messages+` (id, queue, body, attributes, group_id, dedup_id, visible_at, receive_count, published)
	SELECT id, queue, body, attributes, group_id, dedup_id, now(), 0, published FROM moved
	RETURNING id, group_id)
SELECT count(*), coalesce(array_agg(DISTINCT ins.group_id) FILTER (WHERE ins.group_id IS NOT NULL), '{}')
FROM ins, LATERAL (SELECT pg_notify($3, $1)) AS n`, q.name, arg, q.p.n.channel).Scan(&moved, &groups)
		if err != nil {
			return err
		}
		return q.lockGroups(ctx, tx, groups)
	})
	if err != nil {
		return 0, err // rolled back
	}
	return moved, nil
}
