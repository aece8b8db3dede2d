package webhook

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store/sqlitestore"
)

// sqlitePub is a small queue over a table in the sqlitestore's own database
// file: Publish writes the row on its own, PublishTx in the caller's
// transaction (so with PublishTx the row commits with the claim and the
// completion, or not at all). It is kept beside queue/sqlqueue (see
// sqlqueue_test.go) because it keeps every publish, duplicates included (no
// dedup window on DedupID), so the tests see every copy the receiver makes,
// and because it can fail or block on demand.
type sqlitePub struct {
	db *sql.DB
	// hook, when set, runs before each publish; an error from it fails the
	// publish (a fault a real SQLite cannot produce on demand).
	hook atomic.Pointer[func(ctx context.Context) error]
}

var (
	_ queue.Publisher            = (*sqlitePub)(nil)
	_ queue.TxPublisher[*sql.Tx] = (*sqlitePub)(nil)
)

func newSQLitePub(t testing.TB, db *sql.DB) *sqlitePub {
	t.Helper()
	_, err := db.Exec(`CREATE TABLE IF NOT EXISTS webhook_test_queue (
		id INTEGER PRIMARY KEY, dedup_id TEXT NOT NULL, body BLOB NOT NULL, attrs TEXT NOT NULL)`)
	if err != nil {
		t.Fatal(err)
	}
	return &sqlitePub{db: db}
}

type execer interface {
	ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error)
}

func (p *sqlitePub) publish(ctx context.Context, x execer, m queue.Outgoing) (queue.Published, error) {
	if h := p.hook.Load(); h != nil {
		if err := (*h)(ctx); err != nil {
			return queue.Published{}, err
		}
	}
	attrs, _ := json.Marshal(m.Attributes)
	res, err := x.ExecContext(ctx, `INSERT INTO webhook_test_queue (dedup_id, body, attrs) VALUES (?, ?, ?)`, m.DedupID, m.Body, string(attrs))
	if err != nil {
		return queue.Published{}, err
	}
	id, _ := res.LastInsertId()
	return queue.Published{ID: "m" + itoa(id)}, nil
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

func (p *sqlitePub) Publish(ctx context.Context, m queue.Outgoing) (queue.Published, error) {
	return p.publish(ctx, p.db, m)
}

func (p *sqlitePub) PublishTx(ctx context.Context, tx *sql.Tx, m queue.Outgoing) (queue.Published, error) {
	return p.publish(ctx, tx, m)
}

func (p *sqlitePub) setHook(f func(ctx context.Context) error) {
	if f == nil {
		p.hook.Store(nil)
		return
	}
	p.hook.Store(&f)
}

type queued struct {
	DedupID string
	Body    []byte
	Attrs   map[string]string
}

func (p *sqlitePub) messages(t testing.TB) []queued {
	t.Helper()
	rows, err := p.db.Query(`SELECT dedup_id, body, attrs FROM webhook_test_queue ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []queued
	for rows.Next() {
		var q queued
		var attrs string
		if err := rows.Scan(&q.DedupID, &q.Body, &attrs); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(attrs), &q.Attrs); err != nil {
			t.Fatal(err)
		}
		out = append(out, q)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

var quiet = slog.New(slog.DiscardHandler)

// env is a receiver on a real SQLite store and the test queue.
type env struct {
	store *sqlitestore.Store
	pub   *sqlitePub
	l     *idem.Ledger
	clock *fakeClock
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newEnv(t testing.TB, opts ...idem.Option) *env {
	t.Helper()
	clock := &fakeClock{t: time.Now()}
	s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"),
		sqlitestore.WithSynchronous(sqlitestore.SyncNormal), sqlitestore.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &env{store: s, pub: newSQLitePub(t, s.DB()), clock: clock,
		l: idem.New(s, append([]idem.Option{idem.WithLogger(quiet)}, opts...)...)}
}

// captures are the two capture modes, for tests that hold for both.
func captures(e *env) map[string]Capture {
	return map[string]Capture{"plain": Publish(e.pub), "tx": PublishTx[*sql.Tx](e.pub)}
}

const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// swRequest is a Standard Webhooks delivery of body as event id, signed
// now (every retry of a sender has a new timestamp and signature).
func swRequest(t testing.TB, s *Standard, id, body string, now time.Time) *http.Request {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/hooks", bytes.NewBufferString(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Webhook-Id", id)
	r.Header.Set("Webhook-Timestamp", formatUnix(now))
	r.Header.Set("Webhook-Signature", s.Sign(id, now, []byte(body)))
	return r
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func serve(h http.Handler, r *http.Request) answer {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	b, _ := io.ReadAll(w.Result().Body)
	return answer{w.Code, w.Result().Header, b}
}

// problemBody is the RFC 9457 document a Receiver answers with.
type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

func problemOf(t testing.TB, a answer) problemBody {
	t.Helper()
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("status %d Content-Type %q, want application/problem+json; body %s", a.status, ct, a.body)
	}
	var p problemBody
	if err := json.Unmarshal(a.body, &p); err != nil {
		t.Fatalf("problem body %s: %v", a.body, err)
	}
	if p.Status != a.status {
		t.Fatalf("problem status %d, answered %d", p.Status, a.status)
	}
	return p
}

var errInjected = errors.New("injected: broker unreachable")

type (
	queueOutgoing  = queue.Outgoing
	queuePublished = queue.Published
)
