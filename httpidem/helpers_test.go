package httpidem_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
	"github.com/idemkit/idem/store/pgstore"
	"github.com/idemkit/idem/store/redisstore"
	"github.com/idemkit/idem/store/sqlitestore"
)

// storeCase makes stores of one kind for the table-driven tests.
type storeCase struct {
	name string
	open func(t *testing.T) store.Store
}

var shared struct {
	pgOnce, redisOnce sync.Once
	pg, redis         store.Store
	pgErr, redisErr   error
}

// stores lists every store the middleware is tested on. PostgreSQL and
// Redis are skipped without their variables; they are opened once per test
// binary (each test uses fresh random keys, in this package's own table and
// key prefix).
func stores() []storeCase {
	return []storeCase{
		{"memstore", func(t *testing.T) store.Store { return memstore.New() }},
		{"sqlitestore", func(t *testing.T) store.Store {
			s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		}},
		{"pgstore", func(t *testing.T) store.Store {
			u := os.Getenv("IDEM_TEST_POSTGRES")
			if u == "" {
				t.Skip("set IDEM_TEST_POSTGRES=postgres://postgres@127.0.0.1:5432/test?sslmode=disable to run the middleware on pgstore")
			}
			shared.pgOnce.Do(func() {
				shared.pg, shared.pgErr = pgstore.Open(context.Background(), u, pgstore.WithTable("httpidem_test_records"))
			})
			if shared.pgErr != nil {
				t.Fatalf("pgstore: %v", shared.pgErr)
			}
			return shared.pg
		}},
		{"redisstore", func(t *testing.T) store.Store {
			u := os.Getenv("IDEM_TEST_REDIS")
			if u == "" {
				t.Skip("set IDEM_TEST_REDIS=redis://127.0.0.1:6379/0 to run the middleware on redisstore")
			}
			shared.redisOnce.Do(func() {
				shared.redis, shared.redisErr = redisstore.Open(context.Background(), u, redisstore.WithPrefix("httpidem-test:"))
			})
			if shared.redisErr != nil {
				t.Fatalf("redisstore: %v", shared.redisErr)
			}
			return shared.redis
		}},
	}
}

// forEachStore runs f as a parallel subtest per store.
func forEachStore(t *testing.T, f func(t *testing.T, s store.Store)) {
	t.Helper()
	for _, sc := range stores() {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			f(t, sc.open(t))
		})
	}
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// ledger returns a quiet ledger on s.
func ledger(s store.Store, opts ...idem.Option) *idem.Ledger {
	return idem.New(s, append([]idem.Option{idem.WithLogger(quiet())}, opts...)...)
}

// serve starts a real HTTP server running h behind the middleware.
func serve(t *testing.T, l *idem.Ledger, h http.Handler, opts ...httpidem.Option) *httptest.Server {
	t.Helper()
	m := httpidem.New(l, append([]httpidem.Option{httpidem.WithLogger(quiet())}, opts...)...)
	srv := httptest.NewUnstartedServer(m.Handler(h))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // panics on purpose
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// newKey returns a random key.
func newKey() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// quoted returns key as an sf-string.
func quoted(key string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
}

// reply is a response as the tests see it.
type reply struct {
	status int
	header http.Header
	body   string
	err    error
}

// problemType returns the problem document's type, after the default base.
func (r reply) problemType(t *testing.T) string {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("status %d: Content-Type %q, want application/problem+json (body %q)", r.status, ct, r.body)
	}
	var p struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
	}
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	if p.Status != r.status || p.Title == "" {
		t.Fatalf("problem %+v does not match status %d", p, r.status)
	}
	return strings.TrimPrefix(p.Type, httpidem.DefaultProblemBase)
}

func (r reply) replayed() bool { return r.header.Get(httpidem.HeaderReplayed) == "true" }

// do sends method to url with the given Idempotency-Key field lines (none
// when keys is empty), body and extra headers (name, value pairs).
func do(t *testing.T, method, url string, keys []string, body string, hdr ...string) reply {
	t.Helper()
	return doCtx(context.Background(), t, method, url, keys, body, hdr...)
}

func doCtx(ctx context.Context, t *testing.T, method, url string, keys []string, body string, hdr ...string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		req.Header.Add(httpidem.HeaderKey, k)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}

// post sends a POST with one quoted key (none if key is "").
func post(t *testing.T, url, key, body string, hdr ...string) reply {
	t.Helper()
	var keys []string
	if key != "" {
		keys = []string{quoted(key)}
	}
	r := do(t, http.MethodPost, url, keys, body, hdr...)
	if r.err != nil {
		t.Fatalf("POST %s: %v", url, r.err)
	}
	return r
}

// counter is a handler that counts its runs and answers 201 with a body
// naming the run, a Location, a cookie and a header that is not replayed.
type counter struct{ n atomic.Int64 }

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := c.n.Add(1)
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/things/"+itoa(n))
	w.Header().Set("Set-Cookie", "session=secret")
	w.Header().Set("X-Run", itoa(n))
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, `{"run":`+itoa(n)+`,"got":`+strconvQuote(string(body))+`}`)
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

func strconvQuote(s string) string { b, _ := json.Marshal(s); return string(b) }

// opKey is the ledger key the middleware uses for key without a scope.
func opKey(key string) string { return idem.Key(httpidem.DefaultNamespace, key).String() }

// waitFor polls cond until it holds, failing after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func newMem() store.Store { return memstore.New() }
