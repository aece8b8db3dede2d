package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"github.com/idemkit/idem/internal/testenv"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// envURL names the service the tests use; without it they are skipped.
const envURL = testenv.Postgres

// testURL returns the test service's URL, or skips t.
func testURL(t testing.TB) string {
	t.Helper()
	return testenv.Require(t, envURL, "the PostgreSQL suite")
}

var shared struct {
	once sync.Once
	pool *pgxpool.Pool
	err  error
}

// testPool returns a pool shared by the tests (closed by TestMain).
func testPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	u := testURL(t)
	shared.once.Do(func() {
		cfg, err := pgxpool.ParseConfig(u)
		if err != nil {
			shared.err = err
			return
		}
		cfg.MaxConns = 24
		shared.pool, shared.err = pgxpool.NewWithConfig(context.Background(), cfg)
	})
	if shared.err != nil {
		t.Fatalf("connecting to %s: %v", envURL, shared.err)
	}
	return shared.pool
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.pool != nil {
		shared.pool.Close()
	}
	os.Exit(code)
}

// newSchema returns the name of a schema of t's own (not created: the
// store's migration creates it), dropped when t ends.
func newSchema(t testing.TB) string {
	t.Helper()
	pool := testPool(t)
	var b [6]byte
	rand.Read(b[:])
	name := "idemtest_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", name, err)
		}
	})
	return name
}

// withParams returns the URL u with query parameters added.
func withParams(t testing.TB, u string, kv ...string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatalf("%s is not a URL: %v", envURL, err)
	}
	q := p.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	p.RawQuery = q.Encode()
	return p.String()
}

// testClocks gives each test one clock offset table, shared by the stores
// the test makes, so that Advance moves them all.
type testClocks struct {
	mu sync.Mutex
	m  map[testing.TB]string
}

// get returns t's clock table, creating it in schema if t has none.
func (c *testClocks) get(t testing.TB, schema string) string {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[testing.TB]string{}
	}
	if name, ok := c.m[t]; ok {
		return name
	}
	name := pgx.Identifier{schema, "idem_test_clock"}.Sanitize()
	ctx := context.Background()
	pool := testPool(t)
	if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("creating schema: %v", err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+name+" (off interval NOT NULL); INSERT INTO "+name+" VALUES ('0')"); err != nil {
		t.Fatalf("creating the clock table: %v", err)
	}
	c.m[t] = name
	t.Cleanup(func() {
		c.mu.Lock()
		delete(c.m, t)
		c.mu.Unlock()
	})
	return name
}

// advance moves t's clock forward by d.
func (c *testClocks) advance(t testing.TB, d time.Duration) {
	t.Helper()
	c.mu.Lock()
	name, ok := c.m[t]
	c.mu.Unlock()
	if !ok {
		t.Fatal("advance: the test made no store")
	}
	if _, err := testPool(t).Exec(context.Background(), "UPDATE "+name+" SET off = off + $1::bigint * interval '1 microsecond'", micros(d)); err != nil {
		t.Fatalf("advancing the clock: %v", err)
	}
}

// newTestStore returns a store in a fresh schema on the shared pool, with
// a clock that t can advance, closed when t ends.
func newTestStore(t testing.TB, clocks *testClocks, opts ...Option) *Store {
	t.Helper()
	schema := newSchema(t)
	clock := clocks.get(t, schema)
	s, err := New(context.Background(), testPool(t), append([]Option{WithSchema(schema), withClockTable(clock)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
