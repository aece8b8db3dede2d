package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/storeurl"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/pgstore"
	"github.com/idemkit/idem/store/redisstore"
	"github.com/idemkit/idem/store/sqlitestore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// chaosTarget names the store and queue of a chaos run; it travels to the
// workers as JSON. The harness's setup fills in the proxies.
type chaosTarget struct {
	Kind   string `json:"kind"`             // the store: "embedded", "postgres", "redis" or "dynamodb"
	Path   string `json:"path,omitempty"`   // embedded: the SQLite file; redis, dynamodb: the default queue's SQLite file
	URL    string `json:"url,omitempty"`    // postgres, redis, dynamodb: the store
	Schema string `json:"schema,omitempty"` // postgres: the run's schema; redis: its key prefix; dynamodb: its table
	Queue  string `json:"queue"`            // the queue's name
	Sync   string `json:"sync,omitempty"`   // the SQLite files' synchronous setting: full (default) or normal
	// Fused: the queue is made with sqlqueue.WithLedger on the store
	// (embedded, postgres), so the consumer receives and claims in one
	// commit, and completes and acks in another.
	Fused bool `json:"fused,omitempty"`
	// Broker is the queue when it is not the store's default (sqlqueue
	// in the store's database, or in the SQLite file Path beside Redis
	// and DynamoDB): "postgres" (sqlqueue), "nats" (JetStream), "amqp"
	// (RabbitMQ) or "sqs".
	Broker     string        `json:"broker,omitempty"`
	BrokerURL  string        `json:"broker_url,omitempty"`
	BrokerName string        `json:"broker_name,omitempty"` // the run's schema, stream, queue: its own, removed at the end
	Visibility time.Duration `json:"visibility,omitempty"`  // the broker's visibility (JetStream's AckWait, SQS's)
	// Relay and StoreProxy are the host:port of the harness's proxys to
	// the broker and to DynamoDB, which the workers dial instead.
	Proxy      string `json:"proxy,omitempty"`
	StoreProxy string `json:"store_proxy,omitempty"`
}

// sqliteSync is the synchronous pragma's value for a chaosTarget.Sync.
func sqliteSync(s string) string {
	if s == "normal" {
		return string(sqlitestore.SyncNormal)
	}
	return string(sqlitestore.SyncFull)
}

// chaosBackend is a store and a queue, opened in the harness or a worker.
type chaosBackend interface {
	Store() store.Store
	// Source opens the run's queue for receiving, with visibility vis.
	Source(ctx context.Context, vis time.Duration) (queue.Source, error)
	// Publisher opens the run's queue for publishing.
	Publisher(ctx context.Context, vis time.Duration) (queue.Publisher, error)
	// DoTx runs idem.DoTx for key with an fn that calls before, writes
	// the effect row (key, who, msgID) in the ledger's transaction, then
	// calls after.
	DoTx(ctx context.Context, l *idem.Ledger, key string, before, after func(context.Context) error, who, msgID string) (idem.Result, error)
	// Effects reads the effect rows DoTx wrote: who per key.
	Effects(ctx context.Context) (map[string][]string, error)
	// Fault breaks the workers' connections to the store and the broker
	// for real, once, and says how many it broke.
	Fault(ctx context.Context) (int, error)
	// Pending counts the messages not yet settled, and the dead letters.
	Pending(ctx context.Context) (pending, dead int64, err error)
	// FaultName says what Fault does.
	FaultName() string
	Close() error
}

// chaosStore is the store side of a backend: the ledger's store, DoTx
// where the store has it, and the store's connection fault.
type chaosStore interface {
	Store() store.Store
	DoTx(ctx context.Context, l *idem.Ledger, key string, before, after func(context.Context) error, who, msgID string) (idem.Result, error)
	Effects(ctx context.Context) (map[string][]string, error)
	Fault(ctx context.Context) (int, error)
	FaultName() string
	Close() error
}

// chaosQueue is the queue side of a backend: the run's queue, its
// pending and dead-letter counts, and the broker's connection fault.
type chaosQueue interface {
	Source(ctx context.Context, vis time.Duration) (queue.Source, error)
	Publisher(ctx context.Context, vis time.Duration) (queue.Publisher, error)
	Pending(ctx context.Context) (pending, dead int64, err error)
	Fault(ctx context.Context) (int, error)
	FaultName() string
	Close() error
}

// chaosPair is a chaosStore with a chaosQueue. When the queue lives in
// the store's database (the embedded default, PostgreSQL) they are one
// value, and one fault breaks both.
type chaosPair struct {
	chaosStore
	q chaosQueue

	mu         sync.Mutex
	storeCuts  int
	brokerCuts int
	shared     bool
}

func (p *chaosPair) Source(ctx context.Context, vis time.Duration) (queue.Source, error) {
	return p.q.Source(ctx, vis)
}

func (p *chaosPair) Publisher(ctx context.Context, vis time.Duration) (queue.Publisher, error) {
	return p.q.Publisher(ctx, vis)
}

func (p *chaosPair) Pending(ctx context.Context) (int64, int64, error) { return p.q.Pending(ctx) }

// Fault breaks the store's connections and, when the broker is apart,
// the broker's.
func (p *chaosPair) Fault(ctx context.Context) (int, error) {
	n, err := p.chaosStore.Fault(ctx)
	p.mu.Lock()
	p.storeCuts += n
	p.mu.Unlock()
	if err != nil || p.shared {
		return n, err
	}
	m, err := p.q.Fault(ctx)
	p.mu.Lock()
	p.brokerCuts += m
	p.mu.Unlock()
	return n + m, err
}

// connectionCuts says how many store and broker connections the faults
// broke (with the queue in the store's database, all are the store's).
func (p *chaosPair) connectionCuts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return map[string]int{"store": p.storeCuts, "broker": p.brokerCuts}
}

func (p *chaosPair) FaultName() string {
	if p.shared {
		return p.chaosStore.FaultName()
	}
	return p.chaosStore.FaultName() + "; " + p.q.FaultName()
}

func (p *chaosPair) Close() error {
	var err error
	if !p.shared {
		err = p.q.Close()
	}
	return errors.Join(err, p.chaosStore.Close())
}

// chaosTargetFor names the store and queue of policy's run in dir: the
// run's own schema, key prefix, table, stream or queue, named after the
// harness's pid and the policy, so that runs side by side do not meet.
func chaosTargetFor(o chaosOptions, policy, dir string) chaosTarget {
	pid := os.Getpid()
	short := strings.ReplaceAll(policy, "_", "")
	t := chaosTarget{Kind: "embedded", Path: filepath.Join(dir, "chaos.db"), Queue: "chaos", Visibility: o.visibility}
	switch {
	case o.redisURL != "":
		t.Kind, t.URL, t.Path, t.Schema = "redis", o.redisURL, filepath.Join(dir, "queue.db"), fmt.Sprintf("idemchaos:%d:%s:", pid, policy)
	case o.pgURL != "":
		t.Kind, t.URL, t.Path, t.Schema = "postgres", o.pgURL, "", fmt.Sprintf("idem_chaos_%d_%s", pid, short)
	case o.dynamoURL != "":
		t.Kind, t.URL, t.Path = "dynamodb", o.dynamoURL, filepath.Join(dir, "queue.db")
		t.Schema = fmt.Sprintf("%s-%d-%s", urlHost(o.dynamoURL), pid, short)
	}
	t.Broker, t.BrokerURL = o.broker, o.queueURL
	t.Sync, t.Fused = o.sync, o.chaosFused()
	switch o.broker {
	case "postgres":
		t.BrokerName = fmt.Sprintf("idem_chaos_q_%d_%s", pid, short)
	case "nats":
		t.BrokerName = fmt.Sprintf("IDEMCHAOS_%d_%s", pid, strings.ToUpper(short))
	case "amqp":
		t.BrokerName = fmt.Sprintf("idemchaos-%d-%s", pid, short)
	case "sqs":
		t.BrokerName = fmt.Sprintf("%s-%d-%s", urlHost(o.queueURL), pid, short)
	}
	return t
}

// chaosFused reports whether a run's queue is made with
// sqlqueue.WithLedger: --fused, and the queue is sqlqueue in the store's
// own database (the embedded default, PostgreSQL).
func (o chaosOptions) chaosFused() bool {
	return o.fused && o.broker == "" && o.redisURL == "" && o.dynamoURL == ""
}

// urlHost is the host of raw: the table of dynamodb://TABLE, the queue
// name prefix of sqs://PREFIX.
func urlHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Host
}

// chaosBusyTimeout is how long an embedded worker's write waits for
// SQLite's write lock; the harness holds it for up to chaosHoldMax at a
// time (the store-cut fault), so some writes fail with SQLITE_BUSY.
const (
	chaosBusyTimeout = 250 * time.Millisecond
	chaosHoldMin     = 100 * time.Millisecond
	chaosHoldMax     = 500 * time.Millisecond
)

// openChaosBackend opens t's store and queue; setup (in the harness,
// once) creates what the run needs, and fills in t's proxies. A queue
// not in the store's database combines with any store.
func openChaosBackend(ctx context.Context, t *chaosTarget, dir string, setup bool) (chaosBackend, error) {
	var (
		st  chaosStore
		own chaosQueue // the store's own queue, if it has one
		err error
	)
	switch t.Kind {
	case "embedded":
		var e *embedded
		e, err = openEmbedded(ctx, *t, setup)
		st, own = e, e
	case "postgres":
		var p *postgres
		p, err = openChaosPostgres(ctx, *t, setup)
		st, own = p, p
	case "redis":
		st, err = openChaosRedis(ctx, *t, setup)
	case "dynamodb":
		st, err = openChaosDynamo(ctx, t, setup)
	default:
		return nil, fmt.Errorf("unknown chaos target %q", t.Kind)
	}
	if err != nil {
		return nil, err
	}
	if t.Broker == "" && own != nil {
		return &chaosPair{chaosStore: st, q: own, shared: true}, nil
	}
	var q chaosQueue
	switch t.Broker {
	case "":
		q, err = openSQLiteQueue(ctx, *t, setup)
	case "postgres":
		q, err = openChaosPGQueue(ctx, *t, setup)
	case "nats":
		q, err = openChaosNATS(ctx, t, setup)
	case "amqp":
		q, err = openChaosAMQP(ctx, t, dir, setup)
	case "sqs":
		q, err = openChaosSQS(ctx, t, setup)
	default:
		err = fmt.Errorf("unknown chaos broker %q", t.Broker)
	}
	if err != nil {
		st.Close()
		return nil, err
	}
	return &chaosPair{chaosStore: st, q: q}, nil
}

// embedded is the default: sqlitestore and sqlqueue in one SQLite file.
type embedded struct {
	t    chaosTarget
	s    *sqlitestore.Store
	h    *sqlqueue.SQLite
	lock *sql.DB // the harness's own connection, which holds the write lock
}

func openEmbedded(ctx context.Context, t chaosTarget, setup bool) (*embedded, error) {
	opts := []sqlitestore.Option{sqlitestore.WithSynchronous(sqlitestore.Synchronous(sqliteSync(t.Sync)))}
	if !setup {
		opts = append(opts, sqlitestore.WithBusyTimeout(chaosBusyTimeout))
	}
	var (
		s   *sqlitestore.Store
		err error
	)
	for try := 0; ; try++ { // a worker may start while the harness holds the lock
		if s, err = sqlitestore.Open(ctx, t.Path, opts...); err == nil || try == 40 || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return nil, err
	}
	e := &embedded{t: t, s: s}
	if setup {
		if _, err := s.DB().ExecContext(ctx, "CREATE TABLE IF NOT EXISTS chaos_effects (key TEXT NOT NULL, who TEXT NOT NULL, message TEXT NOT NULL)"); err != nil {
			s.Close()
			return nil, err
		}
		e.lock, err = sql.Open("sqlite", t.Path+"?_pragma=busy_timeout(10000)&_txlock=immediate")
		if err != nil {
			s.Close()
			return nil, err
		}
		e.lock.SetMaxOpenConns(1)
	}
	for try := 0; ; try++ {
		qopts := []sqlqueue.Option{sqlqueue.WithGroupCommit(s), sqlqueue.WithLogger(slog.New(slog.DiscardHandler))}
		if t.Fused {
			qopts = append(qopts, sqlqueue.WithLedger(s))
		}
		if e.h, err = sqlqueue.NewSQLite(ctx, s.DB(), qopts...); err == nil || try == 40 || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

func (e *embedded) Store() store.Store { return e.s }

func (e *embedded) Source(ctx context.Context, vis time.Duration) (queue.Source, error) {
	return e.h.Queue(e.t.Queue, sqlqueue.WithVisibility(vis))
}

func (e *embedded) Publisher(ctx context.Context, vis time.Duration) (queue.Publisher, error) {
	return e.h.Queue(e.t.Queue, sqlqueue.WithVisibility(vis))
}

func (e *embedded) DoTx(ctx context.Context, l *idem.Ledger, key string, before, after func(context.Context) error, who, msgID string) (idem.Result, error) {
	return idem.DoTx(ctx, l, idem.RawKey(key), func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		if err := before(ctx); err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO chaos_effects (key, who, message) VALUES (?, ?, ?)", key, who, msgID); err != nil {
			return nil, err
		}
		return []byte(who), after(ctx)
	}, idem.WithCorrelationID(msgID))
}

func (e *embedded) Effects(ctx context.Context) (map[string][]string, error) {
	rows, err := e.s.DB().QueryContext(ctx, "SELECT key, who FROM chaos_effects")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return effectRows(rows)
}

// effectRows reads the rows of a SELECT key, who of the effects table
// (database/sql's or pgx's): who per key.
func effectRows(rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}) (map[string][]string, error) {
	m := map[string][]string{}
	for rows.Next() {
		var k, who string
		if err := rows.Scan(&k, &who); err != nil {
			return nil, err
		}
		m[k] = append(m[k], who)
	}
	return m, rows.Err()
}

// Fault holds SQLite's write lock (BEGIN IMMEDIATE) from another
// connection for 100-500 ms, longer than the workers' busy timeout: SQLite
// has no connection to cut, and this is the fault it meets for real. The
// store and the queue share the file, so both see it.
func (e *embedded) Fault(ctx context.Context) (int, error) {
	if e.lock == nil {
		return 0, errors.New("no lock connection")
	}
	tx, err := e.lock.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	sleepCtx(ctx, chaosHoldMin+rand.N(chaosHoldMax-chaosHoldMin))
	return 1, tx.Rollback()
}

func (e *embedded) Pending(ctx context.Context) (int64, int64, error) {
	q, err := e.h.Queue(e.t.Queue)
	if err != nil {
		return 0, 0, err
	}
	st, err := q.Stats(ctx)
	return st.Ready + st.InFlight + st.Delayed, st.DeadLettered, err
}

func (e *embedded) FaultName() string { return "SQLite write lock held by another connection" }

func (e *embedded) Close() error {
	if e.h != nil {
		e.h.Close()
	}
	if e.lock != nil {
		e.lock.Close()
	}
	return e.s.Close()
}

// chaosKey is the name of key i.
func chaosKey(i int) string { return "chaos:" + strconv.Itoa(i) }

// postgres is pgstore and sqlqueue in one PostgreSQL database, in a
// schema of the run's own (dropped at the end).
type postgres struct {
	t    chaosTarget
	s    *pgstore.Store
	h    *sqlqueue.Postgres
	pool *pgxpool.Pool // the harness's own pool: setup, faults, checks
}

// pgConnName is the application_name of the workers' connections, which
// the store-cut fault terminates.
func pgConnName(t chaosTarget) string { return "idemchaos-" + t.Schema }

func openChaosPostgres(ctx context.Context, t chaosTarget, setup bool) (*postgres, error) {
	u, err := url.Parse(t.URL)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	q.Set(pgstore.ParamSchema, t.Schema)
	if !setup {
		q.Set("application_name", pgConnName(t))
		q.Set("pool_max_conns", "6")
	}
	u.RawQuery = q.Encode()
	p := &postgres{t: t}
	if setup {
		if p.pool, err = pgxpool.New(ctx, t.URL); err != nil {
			return nil, err
		}
		if _, err := p.pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{t.Schema}.Sanitize()); err != nil {
			p.pool.Close()
			return nil, err
		}
	}
	for try := 0; ; try++ {
		if p.s, err = pgstore.Open(ctx, u.String()); err == nil || try == 40 || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		p.Close()
		return nil, err
	}
	if setup {
		if _, err := p.pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+p.effects()+" (key text NOT NULL, who text NOT NULL, message text NOT NULL)"); err != nil {
			p.Close()
			return nil, err
		}
	}
	for try := 0; ; try++ {
		qopts := []sqlqueue.Option{sqlqueue.WithSchema(t.Schema), sqlqueue.WithLogger(slog.New(slog.DiscardHandler))}
		if t.Fused {
			qopts = append(qopts, sqlqueue.WithLedger(p.s))
		}
		if p.h, err = sqlqueue.NewPostgres(ctx, p.s.Pool(), qopts...); err == nil || try == 40 || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

func (p *postgres) effects() string { return pgx.Identifier{p.t.Schema, "chaos_effects"}.Sanitize() }

func (p *postgres) Store() store.Store { return p.s }

func (p *postgres) Source(ctx context.Context, vis time.Duration) (queue.Source, error) {
	return p.h.Queue(p.t.Queue, sqlqueue.WithVisibility(vis))
}

func (p *postgres) Publisher(ctx context.Context, vis time.Duration) (queue.Publisher, error) {
	return p.h.Queue(p.t.Queue, sqlqueue.WithVisibility(vis))
}

func (p *postgres) DoTx(ctx context.Context, l *idem.Ledger, key string, before, after func(context.Context) error, who, msgID string) (idem.Result, error) {
	return idem.DoTx(ctx, l, idem.RawKey(key), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		if err := before(ctx); err != nil {
			return nil, err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+p.effects()+" (key, who, message) VALUES ($1, $2, $3)", key, who, msgID); err != nil {
			return nil, err
		}
		return []byte(who), after(ctx)
	}, idem.WithCorrelationID(msgID))
}

func (p *postgres) Effects(ctx context.Context) (map[string][]string, error) {
	rows, err := p.pool.Query(ctx, "SELECT key, who FROM "+p.effects())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return effectRows(rows)
}

// Fault terminates about a third of the workers' connections
// (pg_terminate_backend): the store's and the queue's, which share the
// workers' pool.
func (p *postgres) Fault(ctx context.Context) (int, error) {
	var n int
	err := p.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		FROM pg_stat_activity WHERE application_name = $1 AND random() < 1.0/3`, pgConnName(p.t)).Scan(&n)
	return n, err
}

func (p *postgres) FaultName() string { return "pg_terminate_backend of the workers' connections" }

func (p *postgres) Pending(ctx context.Context) (int64, int64, error) {
	q, err := p.h.Queue(p.t.Queue)
	if err != nil {
		return 0, 0, err
	}
	st, err := q.Stats(ctx)
	return st.Ready + st.InFlight + st.Delayed, st.DeadLettered, err
}

func (p *postgres) Close() error {
	if p.h != nil {
		p.h.Close()
	}
	if p.s != nil {
		p.s.Close()
	}
	if p.pool != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = p.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{p.t.Schema}.Sanitize()+" CASCADE")
		p.pool.Close()
	}
	return nil
}

// redisTarget is redisstore under a key prefix of the run's own (deleted
// at the end). Redis has no DoTx: the transactional policy does not run
// on it. Its default queue is sqlQueueFile.
type redisTarget struct {
	t     chaosTarget
	s     *redisstore.Store
	admin redis.UniversalClient // the harness's: CLIENT KILL, cleanup
}

func openChaosRedis(ctx context.Context, t chaosTarget, setup bool) (*redisTarget, error) {
	u, err := url.Parse(t.URL)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	q.Set(redisstore.ParamPrefix, t.Schema)
	if !setup {
		q.Set("client_name", pgConnName(t))
		q.Set("pool_size", "6")
		q.Set("max_retries", "-1") // every cut reaches the Ledger, not only go-redis
	}
	u.RawQuery = q.Encode()
	r := &redisTarget{t: t}
	for try := 0; ; try++ { // the harness may kill the connection while it opens
		if r.s, err = redisstore.Open(ctx, u.String()); err == nil || try == 40 || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return nil, err
	}
	if setup {
		r.admin = r.s.Client()
	}
	return r, nil
}

func (r *redisTarget) Store() store.Store { return r.s }

func (r *redisTarget) DoTx(context.Context, *idem.Ledger, string, func(context.Context) error, func(context.Context) error, string, string) (idem.Result, error) {
	return idem.Result{}, errors.New("redisstore has no DoTx")
}

func (r *redisTarget) Effects(context.Context) (map[string][]string, error) {
	return nil, errors.New("redisstore has no DoTx")
}

// Fault kills about a third of the workers' Redis connections (CLIENT
// KILL).
func (r *redisTarget) Fault(ctx context.Context) (int, error) {
	list, err := r.admin.ClientList(ctx).Result()
	if err != nil {
		return 0, err
	}
	n := 0
	for line := range strings.SplitSeq(list, "\n") {
		var id, name string
		for f := range strings.FieldsSeq(line) {
			if v, ok := strings.CutPrefix(f, "id="); ok {
				id = v
			} else if v, ok := strings.CutPrefix(f, "name="); ok {
				name = v
			}
		}
		if name != pgConnName(r.t) || rand.N(3) != 0 {
			continue
		}
		if err := r.admin.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err == nil {
			n++
		}
	}
	return n, nil
}

func (r *redisTarget) FaultName() string { return "CLIENT KILL of the workers' Redis connections" }

func (r *redisTarget) Close() error {
	if r.admin != nil { // the harness: remove the run's keys
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		iter := r.admin.Scan(ctx, 0, r.t.Schema+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
			if len(keys) == 1000 {
				r.admin.Del(ctx, keys...)
				keys = keys[:0]
			}
		}
		if len(keys) > 0 {
			r.admin.Del(ctx, keys...)
		}
	}
	if r.s != nil {
		return r.s.Close()
	}
	return nil
}

// sqlQueueFile is sqlqueue in a SQLite file of the run's directory: the
// broker beside a store that has no queue of its own (Redis, DynamoDB).
type sqlQueueFile struct {
	t    chaosTarget
	qdb  *sql.DB
	h    *sqlqueue.SQLite
	lock *sql.DB // the harness's: holds the queue file's write lock
}

func openSQLiteQueue(ctx context.Context, t chaosTarget, setup bool) (*sqlQueueFile, error) {
	r := &sqlQueueFile{t: t}
	var err error
	if r.qdb, err = sql.Open("sqlite", t.Path+"?_pragma=busy_timeout(250)&_pragma=journal_mode(WAL)&_pragma=synchronous("+sqliteSync(t.Sync)+")"); err != nil {
		return nil, err
	}
	for try := 0; ; try++ {
		if r.h, err = sqlqueue.NewSQLite(ctx, r.qdb, sqlqueue.WithLogger(slog.New(slog.DiscardHandler))); err == nil || try == 40 || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	if setup {
		if r.lock, err = sql.Open("sqlite", t.Path+"?_pragma=busy_timeout(10000)&_txlock=immediate"); err != nil {
			r.Close()
			return nil, err
		}
		r.lock.SetMaxOpenConns(1)
	}
	return r, nil
}

func (r *sqlQueueFile) Source(ctx context.Context, vis time.Duration) (queue.Source, error) {
	return r.h.Queue(r.t.Queue, sqlqueue.WithVisibility(vis))
}

func (r *sqlQueueFile) Publisher(ctx context.Context, vis time.Duration) (queue.Publisher, error) {
	return r.h.Queue(r.t.Queue, sqlqueue.WithVisibility(vis))
}

// Fault holds the queue file's write lock for 50-250 ms.
func (r *sqlQueueFile) Fault(ctx context.Context) (int, error) {
	tx, err := r.lock.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	sleepCtx(ctx, chaosHoldMin/2+rand.N(chaosHoldMax/2-chaosHoldMin/2))
	return 1, tx.Rollback()
}

func (r *sqlQueueFile) FaultName() string { return "the queue file's write lock held" }

func (r *sqlQueueFile) Pending(ctx context.Context) (int64, int64, error) {
	q, err := r.h.Queue(r.t.Queue)
	if err != nil {
		return 0, 0, err
	}
	st, err := q.Stats(ctx)
	return st.Ready + st.InFlight + st.Delayed, st.DeadLettered, err
}

func (r *sqlQueueFile) Close() error {
	if r.h != nil {
		r.h.Close()
	}
	if r.qdb != nil {
		r.qdb.Close()
	}
	if r.lock != nil {
		r.lock.Close()
	}
	return nil
}

// parseQueue reads --queue: sqlqueue (the store's own, the default), or
// a broker's URL.
func (o *chaosOptions) parseQueue(raw string) error {
	if raw == "" || raw == "sqlqueue" {
		return nil
	}
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok {
		return usagef("--queue: want sqlqueue or a URL (postgres://, nats://, amqp://, sqs://), not %q", storeurl.Redact(raw))
	}
	o.queueURL = strings.ToLower(scheme) + raw[len(scheme):]
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		if o.queueURL == o.pgURL {
			o.queueURL = "" // the store's own sqlqueue
			return nil
		}
		o.broker = "postgres"
	case "nats":
		o.broker = "nats"
	case "amqp", "amqps":
		o.broker = "amqp"
	case "sqs":
		o.broker = "sqs"
		if urlHost(o.queueURL) == "" {
			return usagef("--queue: write sqs://PREFIX?region=REGION (and &endpoint=URL for an emulator); the run's queues are named PREFIX-PID-POLICY")
		}
	default:
		return usagef("--queue: chaos runs sqlqueue, sqlqueue on PostgreSQL (postgres://...), JetStream (nats://...), RabbitMQ (amqp://...) or SQS (sqs://...), not %s", storeurl.Redact(raw))
	}
	return nil
}

// storeWithoutDoTx names the store when it has no idem.DoTx (the
// transactional policy needs it, whatever the broker), or is "".
func (o *chaosOptions) storeWithoutDoTx() string {
	switch {
	case o.redisURL != "":
		return "redisstore"
	case o.dynamoURL != "":
		return "dynamostore"
	}
	return ""
}

// targetName says what the run runs on, with no password.
func (o *chaosOptions) targetName() string {
	var st, q string
	switch {
	case o.pgURL != "":
		st, q = "PostgreSQL: pgstore", "sqlqueue in one database ("+storeurl.Redact(o.pgURL)+")"
		if o.broker == "" {
			return st + " + " + q
		}
		st += " (" + storeurl.Redact(o.pgURL) + ")"
	case o.redisURL != "":
		st, q = "Redis: redisstore ("+storeurl.Redact(o.redisURL)+")", "sqlqueue in a SQLite file"
	case o.dynamoURL != "":
		st, q = "DynamoDB: dynamostore ("+storeurl.Redact(o.dynamoURL)+")", "sqlqueue in a SQLite file"
	default:
		st, q = "embedded: sqlitestore", "sqlqueue in one SQLite file"
		if o.broker == "" {
			return st + " + " + q
		}
	}
	switch o.broker {
	case "postgres":
		q = "sqlqueue on PostgreSQL (" + storeurl.Redact(o.queueURL) + ")"
	case "nats":
		q = "JetStream (" + storeurl.Redact(o.queueURL) + ")"
	case "amqp":
		q = "RabbitMQ (" + storeurl.Redact(o.queueURL) + ")"
	case "sqs":
		q = "SQS (" + storeurl.Redact(o.queueURL) + ")"
	}
	return st + " + " + q
}
