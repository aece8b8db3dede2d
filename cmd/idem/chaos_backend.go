package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
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
// workers as JSON.
type chaosTarget struct {
	Kind   string `json:"kind"`             // "embedded", "postgres" or "redis"
	Path   string `json:"path,omitempty"`   // embedded: the SQLite file; redis: the queue's SQLite file
	URL    string `json:"url,omitempty"`    // postgres, redis: the store
	Schema string `json:"schema,omitempty"` // postgres: the run's schema; redis: its key prefix
	Queue  string `json:"queue"`            // the queue's name
	Sync   string `json:"sync,omitempty"`   // the SQLite files' synchronous setting: full (default) or normal
	// Fused: the queue is made with sqlqueue.WithLedger on the store
	// (embedded, postgres), so the consumer receives and claims in one
	// commit, and completes and acks in another.
	Fused bool `json:"fused,omitempty"`
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

// chaosBusyTimeout is how long an embedded worker's write waits for
// SQLite's write lock; the harness holds it for up to chaosHoldMax at a
// time (the store-cut fault), so some writes fail with SQLITE_BUSY.
const (
	chaosBusyTimeout = 250 * time.Millisecond
	chaosHoldMin     = 100 * time.Millisecond
	chaosHoldMax     = 500 * time.Millisecond
)

// openChaosBackend opens t; setup (in the harness, once) creates what the
// run needs.
func openChaosBackend(ctx context.Context, t chaosTarget, dir string, setup bool) (chaosBackend, error) {
	switch t.Kind {
	case "embedded":
		return openEmbedded(ctx, t, setup)
	case "postgres":
		return openChaosPostgres(ctx, t, setup)
	case "redis":
		return openChaosRedis(ctx, t, setup)
	}
	return nil, fmt.Errorf("unknown chaos target %q", t.Kind)
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
// at the end), with sqlqueue in a SQLite file of the run's directory as
// the broker. Redis has no DoTx: the transactional policy does not run
// on it.
type redisTarget struct {
	t     chaosTarget
	s     *redisstore.Store
	qdb   *sql.DB
	h     *sqlqueue.SQLite
	lock  *sql.DB               // the harness's: holds the queue file's write lock
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
	if r.qdb, err = sql.Open("sqlite", t.Path+"?_pragma=busy_timeout(250)&_pragma=journal_mode(WAL)&_pragma=synchronous("+sqliteSync(t.Sync)+")"); err != nil {
		r.Close()
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

func (r *redisTarget) Store() store.Store { return r.s }

func (r *redisTarget) Source(ctx context.Context, vis time.Duration) (queue.Source, error) {
	return r.h.Queue(r.t.Queue, sqlqueue.WithVisibility(vis))
}

func (r *redisTarget) Publisher(ctx context.Context, vis time.Duration) (queue.Publisher, error) {
	return r.h.Queue(r.t.Queue, sqlqueue.WithVisibility(vis))
}

func (r *redisTarget) DoTx(context.Context, *idem.Ledger, string, func(context.Context) error, func(context.Context) error, string, string) (idem.Result, error) {
	return idem.Result{}, errors.New("redisstore has no DoTx")
}

func (r *redisTarget) Effects(context.Context) (map[string][]string, error) {
	return nil, errors.New("redisstore has no DoTx")
}

// Fault kills about a third of the workers' Redis connections (CLIENT
// KILL) and holds the queue file's write lock for a moment (the broker's
// fault).
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
	tx, err := r.lock.BeginTx(ctx, nil)
	if err != nil {
		return n, err
	}
	sleepCtx(ctx, chaosHoldMin/2+rand.N(chaosHoldMax/2-chaosHoldMin/2))
	return n + 1, tx.Rollback()
}

func (r *redisTarget) FaultName() string {
	return "CLIENT KILL of the workers' Redis connections; the queue file's write lock held"
}

func (r *redisTarget) Pending(ctx context.Context) (int64, int64, error) {
	q, err := r.h.Queue(r.t.Queue)
	if err != nil {
		return 0, 0, err
	}
	st, err := q.Stats(ctx)
	return st.Ready + st.InFlight + st.Delayed, st.DeadLettered, err
}

func (r *redisTarget) Close() error {
	if r.h != nil {
		r.h.Close()
	}
	if r.qdb != nil {
		r.qdb.Close()
	}
	if r.lock != nil {
		r.lock.Close()
	}
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
