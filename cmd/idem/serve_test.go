package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/storeurl"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
	"github.com/idemkit/idem/store/redisstore"
	"github.com/idemkit/idem/store/sqlitestore"
)

// serveBackend is a store for the HTTP tests, and how to let time pass on
// its clock: the fake clock of sqlite and PostgreSQL, real time on Redis.
type serveBackend struct {
	name string
	open func(t *testing.T) (s store.Store, advance func(time.Duration))
}

func serveBackends() []serveBackend {
	fake := func(open func(*testing.T, *clock) (store.Store, string)) func(t *testing.T) (store.Store, func(time.Duration)) {
		return func(t *testing.T) (store.Store, func(time.Duration)) {
			clk := newClock()
			s, _ := open(t, clk)
			t.Cleanup(func() { s.Close() })
			return s, clk.Advance
		}
	}
	return []serveBackend{
		{"sqlite", fake(openSQLite)},
		{"postgres", fake(openPostgres)},
		{"redis", openServeRedis},
	}
}

// openServeRedis opens a store under a prefix of the test's own in Redis
// database 4 (IDEM_TEST_REDIS names the server; its database is replaced),
// and deletes the test's records when it ends.
func openServeRedis(t *testing.T) (store.Store, func(time.Duration)) {
	t.Helper()
	raw := os.Getenv("IDEM_TEST_REDIS")
	if raw == "" {
		t.Skip("set IDEM_TEST_REDIS=redis://127.0.0.1:6379/4 to run the serve tests on Redis (database 4 is used)")
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("IDEM_TEST_REDIS is not a URL: %v", err)
	}
	u.Path = "/4"
	var b [6]byte
	rand.Read(b[:])
	q := u.Query()
	q.Set(redisstore.ParamPrefix, "idemserve-"+hex.EncodeToString(b[:])+":")
	u.RawQuery = q.Encode()
	ctx := context.Background()
	s, err := redisstore.Open(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer s.Close()
		recs, _ := s.List(context.Background(), store.ListQuery{Limit: 1000})
		for _, r := range recs {
			_ = s.Delete(context.Background(), r.Key)
		}
	})
	return s, time.Sleep
}

// api is a client of a test server.
type api struct {
	t     *testing.T
	base  string
	token string
}

type answer struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (a answer) String() string { return fmt.Sprintf("%d %s", a.status, a.raw) }

// str returns the body's member name as a string ("" if absent).
func (a answer) str(name string) string {
	v, _ := a.body[name].(string)
	return v
}

// num returns the body's member name as an int64.
func (a answer) num(name string) int64 {
	v, _ := a.body[name].(float64)
	return int64(v)
}

// expect checks the status and, for a problem, its type's last part (or,
// for 200, the outcome).
func (a answer) expect(t *testing.T, status int, kind string) answer {
	t.Helper()
	if a.status != status {
		t.Fatalf("got %s, want %d %s", a, status, kind)
	}
	if status == http.StatusOK {
		if kind != "" && a.str("outcome") != kind {
			t.Fatalf("got outcome %q, want %q: %s", a.str("outcome"), kind, a)
		}
		if ct := a.header.Get("Content-Type"); ct != "application/json" {
			t.Fatalf("Content-Type %q: %s", ct, a)
		}
		return a
	}
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json: %s", ct, a)
	}
	if a.str("type") != problemBase+kind || a.str("title") == "" || a.num("status") != int64(status) {
		t.Fatalf("want a problem of type %s%s with a title and status: %s", problemBase, kind, a)
	}
	return a
}

func (c *api) do(method, path string, body string, hdr ...string) answer {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		switch {
		case hdr[i] == "Host":
			req.Host = hdr[i+1]
		case hdr[i+1] == "":
			req.Header.Del(hdr[i])
		default:
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	a := answer{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	if len(raw) > 0 && method != http.MethodHead {
		if err := json.Unmarshal(raw, &a.body); err != nil {
			c.t.Fatalf("%s %s: the answer is not a JSON object: %v\n%s", method, path, err, raw)
		}
	}
	return a
}

func (c *api) post(path string, body any, hdr ...string) answer {
	c.t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		c.t.Fatal(err)
	}
	return c.do(http.MethodPost, path, string(b), hdr...)
}

type obj = map[string]any

// newServeTest serves s over HTTP for t; logs go to the returned buffer.
func newServeTest(t *testing.T, s store.Store, token string, hashKeys bool) (*api, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	var tok []byte
	if token != "" {
		tok = []byte(token)
	}
	srv := newServer(s, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), tok, 4096, hashKeys)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &api{t: t, base: hs.URL, token: token}, logs
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// TestServeEndpoints drives every endpoint and every claim outcome on each
// store.
func TestServeEndpoints(t *testing.T) {
	for _, b := range serveBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			s, advance := b.open(t)
			c, _ := newServeTest(t, s, "", false)
			ctx := context.Background()

			// acquired, then busy, extend, complete, done.
			a := c.post("/v1/claim", obj{"key": "receipt:1:7", "owner": "py-worker-1", "lease": "10s"}, "X-Request-Id", "msg-0001").expect(t, 200, "acquired")
			// The fence is the store's (its clock in microseconds, see
			// store.FirstFence); the attempt_id is 22 base64url characters.
			f1, aid := a.num("fence"), a.str("attempt_id")
			if f1 <= 0 || a.num("attempt") != 1 || len(aid) != 22 || a.str("lease_until") == "" || a.header.Get("X-Request-Id") != "msg-0001" {
				t.Fatalf("claim: %s %v", a, a.header)
			}
			if rec, err := s.Get(ctx, "receipt:1:7"); err != nil || rec.Fence != f1 || rec.AttemptID != aid {
				t.Fatalf("claim answered fence %d, attempt_id %s; the record: %+v %v", f1, aid, rec, err)
			}
			busy := c.post("/v1/claim", obj{"key": "receipt:1:7"}).expect(t, 409, "busy")
			if busy.str("outcome") != "busy" || busy.header.Get("Retry-After") == "" || busy.body["retry_after"].(float64) <= 0 || busy.str("owner") != "py-worker-1" {
				t.Fatalf("busy: %s %v", busy, busy.header)
			}
			if id := busy.header.Get("X-Request-Id"); len(id) < 16 {
				t.Fatalf("no X-Request-Id generated: %q", id)
			}
			ext := c.post("/v1/extend", obj{"key": "receipt:1:7", "fence": f1, "attempt_id": aid, "lease": "1m"}).expect(t, 200, "extended")
			if lu, _ := time.Parse(time.RFC3339Nano, ext.str("lease_until")); !lu.After(mustTime(t, a.str("lease_until"))) {
				t.Fatalf("extend did not move the lease: %s, claim %s", ext, a)
			}
			// Another fence, or another attempt id, is not the attempt.
			c.post("/v1/extend", obj{"key": "receipt:1:7", "fence": f1 + 1, "attempt_id": aid}).expect(t, 409, "lease-lost")
			c.post("/v1/complete", obj{"key": "receipt:1:7", "fence": f1 + 1, "attempt_id": aid, "result": b64("x")}).expect(t, 409, "lease-lost")
			c.post("/v1/complete", obj{"key": "receipt:1:7", "fence": f1, "attempt_id": store.NewAttemptID(), "result": b64("x")}).expect(t, 409, "lease-lost")
			c.post("/v1/complete", obj{"key": "receipt:1:7", "fence": f1, "attempt_id": aid, "result": b64("ses-1")}).expect(t, 200, "completed")
			// A retry of a complete whose answer was lost is answered alike
			// when it names the attempt; one with another result, or
			// another attempt_id, is not; one without the attempt_id is
			// refused before the store.
			if again := c.post("/v1/complete", obj{"key": "receipt:1:7", "fence": f1, "attempt_id": aid, "result": b64("ses-1")}).expect(t, 200, "completed"); again.body["repeated"] != true {
				t.Fatalf("repeated complete: %s", again)
			}
			c.post("/v1/complete", obj{"key": "receipt:1:7", "fence": f1, "attempt_id": aid, "result": b64("other")}).expect(t, 409, "lease-lost")
			if ll := c.post("/v1/complete", obj{"key": "receipt:1:7", "fence": f1, "attempt_id": store.NewAttemptID(), "result": b64("ses-1")}).expect(t, 409, "lease-lost"); ll.str("record_status") != "completed" ||
				ll.num("record_fence") != f1 || !strings.Contains(ll.str("detail"), "no longer holds the key") {
				t.Fatalf("lease-lost without the record's status: %s", ll)
			}
			c.post("/v1/complete", obj{"key": "receipt:1:7", "fence": f1, "result": b64("ses-1")}).expect(t, 400, "invalid-attempt")
			done := c.post("/v1/claim", obj{"key": "receipt:1:7"}).expect(t, 200, "done")
			if done.str("result") != b64("ses-1") || done.num("fence") != f1 || done.num("attempt") != 1 {
				t.Fatalf("done: %s", done)
			}
			rec, err := s.Get(ctx, "receipt:1:7")
			if err != nil || len(rec.Journal) == 0 || rec.Journal[0].Correlation != "msg-0001" || rec.Owner != "py-worker-1" {
				t.Fatalf("record: %+v %v; want the request id as the correlation id", rec, err)
			}

			// The record, and a key without one.
			r := c.do("GET", "/v1/records/receipt:1:7", "").expect(t, 200, "")
			if r.str("status") != "completed" || r.num("fence") != f1 || r.num("attempt") != 1 || r.str("attempt_id") != aid || r.str("owner") != "py-worker-1" ||
				r.str("lease_until") == "" || r.str("expires_at") == "" || r.str("result") != b64("ses-1") {
				t.Fatalf("record: %s", r)
			}
			if j, _ := r.body["journal"].([]any); len(j) != 1 {
				t.Fatalf("record journal: %s", r)
			}
			c.do("GET", "/v1/records/"+url.PathEscape("nope:a/b c"), "").expect(t, 404, "not-found")

			// Fingerprints: the same request (even from a Go worker, which
			// hashes it as idem.Fingerprint does) is done; another is a
			// mismatch, in every state.
			l := idem.New(s, idem.WithLogger(slog.New(slog.DiscardHandler)))
			if _, err := l.Do(ctx, idem.RawKey("charge:9"), func(context.Context) ([]byte, error) { return []byte("ch_1"), nil },
				idem.Fingerprint([]byte(`{"amount":100}`))); err != nil {
				t.Fatal(err)
			}
			c.post("/v1/claim", obj{"key": "charge:9", "fingerprint": `{"amount":100}`}).expect(t, 200, "done")
			c.post("/v1/claim", obj{"key": "charge:9"}).expect(t, 200, "done")
			mm := c.post("/v1/claim", obj{"key": "charge:9", "fingerprint": `{"amount":999}`}).expect(t, 422, "mismatch")
			if mm.str("outcome") != "mismatch" || mm.str("record_status") != "completed" {
				t.Fatalf("mismatch: %s", mm)
			}
			c.post("/v1/claim", obj{"key": "charge:10", "fingerprint": "a"}).expect(t, 200, "acquired")
			c.post("/v1/claim", obj{"key": "charge:10", "fingerprint": "b"}).expect(t, 422, "mismatch")
			c.post("/v1/claim", obj{"key": "charge:10", "fingerprint": "a"}).expect(t, 409, "busy")

			// failed: duplicates get the stored reason.
			cl := c.post("/v1/claim", obj{"key": "receipt:2:7"}).expect(t, 200, "acquired")
			f, aid := cl.num("fence"), cl.str("attempt_id")
			c.post("/v1/fail", obj{"key": "receipt:2:7", "fence": f, "attempt_id": aid, "reason": "card declined", "retention": "1h"}).expect(t, 200, "failed")
			if rep := c.post("/v1/fail", obj{"key": "receipt:2:7", "fence": f, "attempt_id": aid, "reason": "card declined"}).expect(t, 200, "failed"); rep.body["repeated"] != true {
				t.Fatalf("retried fail: %s", rep)
			}
			fl := c.post("/v1/claim", obj{"key": "receipt:2:7"}).expect(t, 409, "failed")
			if fl.str("outcome") != "failed" || fl.str("reason") != "card declined" || fl.header.Get("Retry-After") != "" {
				t.Fatalf("failed: %s", fl)
			}

			// released: the next claim continues the numbering.
			cl = c.post("/v1/claim", obj{"key": "receipt:3:7"}).expect(t, 200, "acquired")
			f, aid = cl.num("fence"), cl.str("attempt_id")
			c.post("/v1/release", obj{"key": "receipt:3:7", "fence": f, "attempt_id": aid, "reason": "smtp: connection refused"}).expect(t, 200, "released")
			c.post("/v1/release", obj{"key": "receipt:3:7", "fence": f, "attempt_id": aid, "reason": "smtp: connection refused"}).expect(t, 200, "released")
			again := c.post("/v1/claim", obj{"key": "receipt:3:7"}).expect(t, 200, "acquired")
			if again.num("fence") != f+1 || again.num("attempt") != 2 {
				t.Fatalf("after release: %s", again)
			}

			// abandon under at_most_once: indeterminate at once.
			cl = c.post("/v1/claim", obj{"key": "receipt:6:7", "policy": "at_most_once"}).expect(t, 200, "acquired")
			f, aid = cl.num("fence"), cl.str("attempt_id")
			c.post("/v1/abandon", obj{"key": "receipt:6:7", "fence": f, "attempt_id": aid, "reason": "timeout after send"}).expect(t, 200, "abandoned")
			// A repeated abandon is refused: its lease has ended.
			c.post("/v1/abandon", obj{"key": "receipt:6:7", "fence": f, "attempt_id": aid, "reason": "again"}).expect(t, 409, "lease-lost")
			ind := c.post("/v1/claim", obj{"key": "receipt:6:7", "policy": "at_most_once"}).expect(t, 409, "indeterminate")
			if ind.str("reason") != "timeout after send" || ind.num("fence") != f {
				t.Fatalf("indeterminate after abandon: %s", ind)
			}

			// Lapsed leases: a takeover under at_least_once (the old fence
			// is refused), indeterminate under at_most_once, whatever the
			// next caller's policy.
			c4 := c.post("/v1/claim", obj{"key": "receipt:4:7", "lease": "1s"}).expect(t, 200, "acquired")
			f5 := c.post("/v1/claim", obj{"key": "receipt:5:7", "lease": "1s", "policy": "at_most_once"}).expect(t, 200, "acquired").num("fence")
			advance(1500 * time.Millisecond)
			tk := c.post("/v1/claim", obj{"key": "receipt:4:7", "policy": "at_most_once"}).expect(t, 200, "takeover")
			if tk.num("fence") != c4.num("fence")+1 || tk.num("attempt") != 2 || tk.str("attempt_id") == c4.str("attempt_id") {
				t.Fatalf("takeover: %s, first claim %s", tk, c4)
			}
			c.post("/v1/complete", obj{"key": "receipt:4:7", "fence": c4.num("fence"), "attempt_id": c4.str("attempt_id")}).expect(t, 409, "lease-lost")
			c.post("/v1/complete", obj{"key": "receipt:4:7", "fence": tk.num("fence"), "attempt_id": tk.str("attempt_id")}).expect(t, 200, "completed")
			// done with an empty result still has "result" (base64 of nothing).
			if d := c.post("/v1/claim", obj{"key": "receipt:4:7"}).expect(t, 200, "done"); d.body["result"] != "" {
				t.Fatalf("done with an empty result: %s", d)
			}
			ind = c.post("/v1/claim", obj{"key": "receipt:5:7"}).expect(t, 409, "indeterminate")
			if ind.num("fence") != f5 || ind.str("since") == "" || ind.header.Get("Retry-After") != "" {
				t.Fatalf("indeterminate: %s", ind)
			}

			c.do("GET", "/healthz", "").expect(t, 200, "")
		})
	}
}

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

func openServeSQLite(t *testing.T) store.Store {
	t.Helper()
	s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestServeBadInput: every malformed request is a 400 (413) problem of a
// named type, and the store is not touched.
func TestServeBadInput(t *testing.T) {
	s := openServeSQLite(t)
	c, _ := newServeTest(t, s, "", false)
	long := strings.Repeat("k", idem.MaxKeyLen+1)
	for _, tc := range []struct {
		path, body string
		status     int
		kind       string
	}{
		{"/v1/claim", ``, 400, "invalid-body"},
		{"/v1/claim", `{"key":`, 400, "invalid-body"},
		{"/v1/claim", `[1]`, 400, "invalid-body"},
		{"/v1/claim", `{"key":"k"} {"key":"k"}`, 400, "invalid-body"},
		{"/v1/claim", `{"key":"k","leese":"1s"}`, 400, "invalid-body"},
		{"/v1/claim", `{"key":"k","fence":1}`, 400, "invalid-body"},
		{"/v1/claim", `{"key":""}`, 400, "invalid-key"},
		{"/v1/claim", `{}`, 400, "invalid-key"},
		{"/v1/claim", `{"key":"` + long + `"}`, 400, "invalid-key"},
		{"/v1/claim", `{"key":"a\u0000b"}`, 400, "invalid-key"},
		{"/v1/claim", `{"key":"k","lease":"soon"}`, 400, "invalid-duration"},
		{"/v1/claim", `{"key":"k","lease":"-5s"}`, 400, "invalid-duration"},
		{"/v1/claim", `{"key":"k","lease":"0s"}`, 400, "invalid-duration"},
		{"/v1/claim", `{"key":"k","retention":"100000d"}`, 400, "invalid-duration"},
		{"/v1/claim", `{"key":"k","policy":"exactly_once"}`, 400, "invalid-policy"},
		// A record must outlive its attempts' late writes.
		{"/v1/claim", `{"key":"k","retention":"1s"}`, 400, "invalid-duration"},
		{"/v1/claim", `{"key":"k","retention":"59m"}`, 400, "invalid-duration"},
		{"/v1/claim", `{"key":"k","lease":"2h","retention":"2h"}`, 400, "invalid-duration"},
		// The lease ends at least 1h before the record may be swept.
		{"/v1/claim", `{"key":"k","lease":"2h","retention":"2h59m"}`, 400, "invalid-duration"},
		{"/v1/claim", `{"key":"k","lease":"30m","retention":"1h"}`, 400, "invalid-duration"},
		{"/v1/claim", `{"key":"k","lease":"7d"}`, 400, "invalid-duration"},
		// A lease is at least 1s.
		{"/v1/claim", `{"key":"k","lease":"999ms"}`, 400, "invalid-duration"},
		{"/v1/claim", `{"key":"k","lease":"1ns"}`, 400, "invalid-duration"},
		{"/v1/extend", `{"key":"k","fence":1,"attempt_id":"AAAAAAAAAAAAAAAAAAAAAA","lease":"500ms"}`, 400, "invalid-duration"},
		{"/v1/complete", `{"key":"k","fence":1,"attempt_id":"AAAAAAAAAAAAAAAAAAAAAA","retention":"1s"}`, 400, "invalid-duration"},
		{"/v1/fail", `{"key":"k","fence":1,"attempt_id":"AAAAAAAAAAAAAAAAAAAAAA","reason":"x","retention":"30m"}`, 400, "invalid-duration"},
		{"/v1/claim", `{"key":"` + strings.Repeat("x", 5000) + `"}`, 413, "body-too-large"},
		{"/v1/complete", `{"key":"k","fence":-1}`, 400, "invalid-fence"},
		{"/v1/complete", `{"key":"k"}`, 400, "invalid-fence"},
		{"/v1/complete", `{"key":"k","fence":"1"}`, 400, "invalid-body"},
		{"/v1/complete", `{"key":"k","fence":1,"result":"not base64!"}`, 400, "invalid-body"},
		{"/v1/complete", `{"key":"k","fence":1,"reason":"x"}`, 400, "invalid-body"},
		{"/v1/complete", `{"key":"k","fence":1,"attempt_id":"AAAAAAAAAAAAAAAAAAAAAA","retention":"7"}`, 400, "invalid-duration"},
		{"/v1/release", `{"key":"k","fence":0}`, 400, "invalid-fence"},
		{"/v1/release", `{"key":"k","fence":1,"result":"eA=="}`, 400, "invalid-body"},
		{"/v1/fail", `{"key":"k","fence":1,"attempt_id":"AAAAAAAAAAAAAAAAAAAAAA"}`, 400, "invalid-reason"},
		{"/v1/fail", `{"key":"k","fence":1,"attempt_id":"AAAAAAAAAAAAAAAAAAAAAA","reason":"  "}`, 400, "invalid-reason"},
		{"/v1/abandon", `{"key":"","fence":1}`, 400, "invalid-key"},
		// A call on an attempt names its attempt_id (before anything else
		// about it is checked).
		{"/v1/complete", `{"key":"k","fence":1,"retention":"1s"}`, 400, "invalid-attempt"},
		{"/v1/release", `{"key":"k","fence":1}`, 400, "invalid-attempt"},
		{"/v1/fail", `{"key":"k","fence":1}`, 400, "invalid-attempt"},
		{"/v1/abandon", `{"key":"k","fence":1,"attempt_id":""}`, 400, "invalid-attempt"},
		{"/v1/extend", `{"key":"k","fence":1,"lease":"1x"}`, 400, "invalid-attempt"},
		{"/v1/extend", `{"key":"k","fence":1,"attempt_id":"AAAAAAAAAAAAAAAAAAAAAA","lease":"1x"}`, 400, "invalid-duration"},
		{"/v1/extend", `{"key":"k","fence":-3,"lease":"1s"}`, 400, "invalid-fence"},
		{"/v1/nope", `{}`, 404, "not-found"},
		// Not UTF-8: encoding/json would turn both keys into "op:\ufffdt\ufffd".
		{"/v1/claim", "{\"key\":\"op:\xe9t\xe9\"}", 400, "invalid-body"},
		{"/v1/claim", "{\"key\":\"k\",\"fingerprint\":\"\xff\"}", 400, "invalid-body"},
		// A lone surrogate escape: encoding/json would turn "a\udc80" and
		// "a\udcff" into one key "a\ufffd".
		{"/v1/claim", `{"key":"a\udc80"}`, 400, "invalid-body"},
		{"/v1/claim", `{"key":"a\udcff"}`, 400, "invalid-body"},
		{"/v1/claim", `{"key":"a\ud800"}`, 400, "invalid-body"},
		{"/v1/claim", `{"key":"a\uD800b"}`, 400, "invalid-body"},
		{"/v1/claim", `{"key":"a\ud800\u0041"}`, 400, "invalid-body"},
		{"/v1/claim", `{"key":"a\ude00\ud83d"}`, 400, "invalid-body"},
		{"/v1/claim", `{"key":"k","fingerprint":"x\udc80"}`, 400, "invalid-body"},
		{"/v1/claim", `{"key":"k","fingerprint":"\\\ud800"}`, 400, "invalid-body"},
		{"/v1/complete", `{"key":"k","fence":1,"attempt_id":"\udfff"}`, 400, "invalid-body"},
		// Names are exact and once: encoding/json would take "KEY" for
		// "key", and the last of two.
		{"/v1/claim", `{"KEY":"k"}`, 400, "invalid-body"},
		{"/v1/claim", `{"key":"a","key":"b"}`, 400, "invalid-body"},
		{"/v1/claim", `{"key":"k","Lease":"1s"}`, 400, "invalid-body"},
		{"/v1/complete", `{"key":"k","fence":1,"Fence":2}`, 400, "invalid-body"},
		{"/v1/complete", `{"Key":"k","fence":1}`, 400, "invalid-body"},
	} {
		t.Run(tc.path+" "+tc.kind, func(t *testing.T) {
			c.t = t
			c.do("POST", tc.path, tc.body).expect(t, tc.status, tc.kind)
		})
	}
	c.t = t
	m := c.do("GET", "/v1/claim", "").expect(t, 405, "method-not-allowed")
	if m.header.Get("Allow") != "POST" {
		t.Errorf("405 without Allow: %v", m.header)
	}
	c.do("POST", "/v1/records/k", "").expect(t, 405, "method-not-allowed")
	c.do("GET", "/v1/records/"+url.PathEscape(long), "").expect(t, 400, "invalid-key")
	if recs, err := s.List(context.Background(), store.ListQuery{}); err != nil || len(recs) != 0 {
		t.Fatalf("bad requests wrote records: %v %v", recs, err)
	}
	// A surrogate pair, U+FFFD and an escaped backslash before "ud800" are
	// fine; the pair is the key's character.
	for _, body := range []string{`{"key":"smile:\ud83d\ude00"}`, `{"key":"repl:\ufffd"}`, `{"key":"bs:\\ud800","fingerprint":"\uD83D\uDE00 \"\\u"}`} {
		c.do("POST", "/v1/claim", body).expect(t, 200, "acquired")
	}
	if _, err := s.Get(context.Background(), "smile:\U0001F600"); err != nil {
		t.Fatalf("the pair was not decoded as U+1F600: %v", err)
	}
	if _, err := s.Get(context.Background(), `bs:\ud800`); err != nil {
		t.Fatalf("an escaped backslash: %v", err)
	}
	// A default retention too short for the lease is named by its value.
	if p := c.post("/v1/claim", obj{"key": "k", "lease": "7d"}).expect(t, 400, "invalid-duration"); !strings.Contains(p.str("detail"), "the default 7d") {
		t.Errorf("detail does not name the default: %s", p)
	}
	c.post("/v1/claim", obj{"key": "edge:1", "lease": "1s", "retention": "1h0m1s"}).expect(t, 200, "acquired")
	c.post("/v1/claim", obj{"key": "edge:2", "lease": "1h", "retention": "2h"}).expect(t, 200, "acquired")
	// A key with a slash, percent and spaces is read back by its escaped path.
	odd := "http:POST /orders?id=1 %41"
	c.post("/v1/claim", obj{"key": odd}).expect(t, 200, "acquired")
	if r := c.do("GET", "/v1/records/"+url.PathEscape(odd), "").expect(t, 200, ""); r.str("key") != odd {
		t.Fatalf("record of %q: %s", odd, r)
	}
}

// TestServeAuth: with a token every request needs it, /healthz too.
func TestServeAuth(t *testing.T) {
	s := openServeSQLite(t)
	c, _ := newServeTest(t, s, "s3cret-token", false)
	good := c.post("/v1/claim", obj{"key": "k"})
	good.expect(t, 200, "acquired")
	for _, auth := range []string{"", "Bearer wrong", "Bearer s3cret-token-longer", "Basic s3cret-token", "s3cret-token", "Bearer "} {
		c.token = ""
		hdr := []string{}
		if auth != "" {
			hdr = []string{"Authorization", auth}
		}
		for _, p := range []string{"/v1/claim", "/healthz"} {
			method := "POST"
			if p == "/healthz" {
				method = "GET"
			}
			a := c.do(method, p, `{"key":"k2"}`, hdr...).expect(t, 401, "unauthorized")
			if !strings.HasPrefix(a.header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("401 without WWW-Authenticate: %v", a.header)
			}
		}
	}
	if _, err := s.Get(context.Background(), "k2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an unauthorized claim reached the store: %v", err)
	}
	c.token = "s3cret-token"
	c.do("GET", "/healthz", "").expect(t, 200, "")
	// The scheme is case-insensitive.
	c.token = ""
	for _, scheme := range []string{"bearer", "BEARER", "BeArEr"} {
		c.do("GET", "/healthz", "", "Authorization", scheme+" s3cret-token").expect(t, 200, "")
	}
}

// failingStore fails the calls named in fail with a store error.
type failingStore struct {
	store.Store
	mu   sync.Mutex
	fail map[string]error
}

func (f *failingStore) err(op string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fail[op]
}

func (f *failingStore) set(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[op] = err
}

func (f *failingStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if err := f.err("claim"); err != nil {
		return store.ClaimResult{}, err
	}
	return f.Store.Claim(ctx, req)
}

func (f *failingStore) Finish(ctx context.Context, req store.FinishRequest) error {
	if req.Outcome == store.OutcomeCompleted {
		if err := f.err("complete"); err != nil {
			return err
		}
	}
	return f.Store.Finish(ctx, req)
}

func (f *failingStore) Extend(ctx context.Context, req store.ExtendRequest) (time.Time, error) {
	if err := f.err("extend"); err != nil {
		return time.Time{}, err
	}
	return f.Store.Extend(ctx, req)
}

func (f *failingStore) Get(ctx context.Context, key string) (idem.Record, error) {
	if err := f.err("get"); err != nil {
		return idem.Record{}, err
	}
	return f.Store.Get(ctx, key)
}

func (f *failingStore) Now(ctx context.Context) (time.Time, error) {
	if err := f.err("now"); err != nil {
		return time.Time{}, err
	}
	return f.Store.Now(ctx)
}

// TestServeStoreErrors: a store that fails is 503 with Retry-After, never
// an outcome; a corrupt record is 500.
func TestServeStoreErrors(t *testing.T) {
	fs := &failingStore{Store: memstore.New(), fail: map[string]error{}}
	c, _ := newServeTest(t, fs, "", false)
	down := errors.New("connection refused")
	cl := c.post("/v1/claim", obj{"key": "k"}).expect(t, 200, "acquired")
	f, aid := cl.num("fence"), cl.str("attempt_id")
	for _, op := range []string{"claim", "complete", "extend", "get", "now"} {
		fs.set(op, down)
	}
	for _, call := range []func() answer{
		func() answer { return c.post("/v1/claim", obj{"key": "k"}) },
		func() answer { return c.post("/v1/claim", obj{"key": "other"}) },
		func() answer { return c.post("/v1/complete", obj{"key": "k", "fence": f, "attempt_id": aid}) },
		func() answer { return c.post("/v1/extend", obj{"key": "k", "fence": f, "attempt_id": aid}) },
		func() answer { return c.do("GET", "/v1/records/k", "") },
		func() answer { return c.do("GET", "/healthz", "") },
	} {
		a := call().expect(t, 503, "store-unavailable")
		if a.header.Get("Retry-After") == "" || a.str("outcome") != "" {
			t.Fatalf("store error: %s %v", a, a.header)
		}
	}
	fs.set("claim", &idem.CorruptError{Key: "k", Detail: "bad json"})
	c.post("/v1/claim", obj{"key": "k"}).expect(t, 500, "record-corrupt")
	fs.set("claim", nil)
	fs.set("complete", nil)
	c.post("/v1/claim", obj{"key": "k"}).expect(t, 409, "busy") // the store's answer again
	c.post("/v1/complete", obj{"key": "k", "fence": f, "attempt_id": aid}).expect(t, 200, "completed")
}

// TestServeRetryReadFails: a complete retried after its answer was lost,
// whose store refuses it (the first try was recorded), reads the record to
// tell; when that read fails, the answer is 503, never 409 "nothing was
// recorded".
func TestServeRetryReadFails(t *testing.T) {
	fs := &failingStore{Store: memstore.New(), fail: map[string]error{}}
	c, _ := newServeTest(t, fs, "", false)
	a := c.post("/v1/claim", obj{"key": "k"}).expect(t, 200, "acquired")
	body := obj{"key": "k", "fence": a.num("fence"), "attempt_id": a.str("attempt_id"), "result": b64("ses-1")}
	c.post("/v1/complete", body).expect(t, 200, "completed")
	fs.set("get", errors.New("connection refused"))
	c.post("/v1/complete", body).expect(t, 503, "store-unavailable")
	fs.set("get", nil)
	if rep := c.post("/v1/complete", body).expect(t, 200, "completed"); rep.body["repeated"] != true {
		t.Fatalf("retried complete with attempt_id: %s", rep)
	}
}

// TestServeLogLevels: at the default level an attempt logs one line, its
// end; its claim, extension and a read of its record are DEBUG.
func TestServeLogLevels(t *testing.T) {
	logs := &syncBuffer{}
	srv := newServer(memstore.New(), slog.New(slog.NewTextHandler(logs, nil)), nil, 4096, false)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	c := &api{t: t, base: hs.URL}
	cl := c.post("/v1/claim", obj{"key": "k"}).expect(t, 200, "acquired")
	c.post("/v1/claim", obj{"key": "k"}).expect(t, 409, "busy")
	c.post("/v1/extend", obj{"key": "k", "fence": cl.num("fence"), "attempt_id": cl.str("attempt_id")}).expect(t, 200, "extended")
	c.post("/v1/complete", obj{"key": "k", "fence": cl.num("fence"), "attempt_id": cl.str("attempt_id"), "result": b64("x")}).expect(t, 200, "completed")
	c.post("/v1/claim", obj{"key": "k"}).expect(t, 200, "done")
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "level=INFO") || !strings.Contains(lines[0], "outcome=completed") {
		t.Fatalf("want one INFO line, the completion:\n%s", logs.String())
	}
}

// TestServeLogs: one line per call with the key (or its hash), outcome,
// fence, attempt, correlation id and remote address.
func TestServeLogs(t *testing.T) {
	s := openServeSQLite(t)
	c, logs := newServeTest(t, s, "", false)
	cl := c.post("/v1/claim", obj{"key": "receipt:8891:7"}, "X-Request-Id", "evt_123").expect(t, 200, "acquired")
	fence := fmt.Sprintf("fence=%d ", cl.num("fence"))
	line := logs.String()
	for _, want := range []string{`msg="idem serve acquired"`, "key=receipt:8891:7", "outcome=acquired", fence, "attempt=1",
		"correlation_id=evt_123", "remote_addr=127.0.0.1:", "status=200"} {
		if !strings.Contains(line, want) {
			t.Errorf("log lacks %q:\n%s", want, line)
		}
	}
	if n := strings.Count(line, "\n"); n != 1 {
		t.Errorf("%d log lines for one call:\n%s", n, line)
	}

	// extend reads the record first, and logs its attempt number; reading
	// a record logs "record", with the record's status.
	c.post("/v1/extend", obj{"key": "receipt:8891:7", "fence": cl.num("fence"), "attempt_id": cl.str("attempt_id")}).expect(t, 200, "extended")
	c.do("GET", "/v1/records/receipt:8891:7", "").expect(t, 200, "")
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if ext := lines[1]; !strings.Contains(ext, "outcome=extended") || !strings.Contains(ext, fence) || !strings.Contains(ext, "attempt=1") ||
		!strings.Contains(ext, "attempt_id="+cl.str("attempt_id")) {
		t.Errorf("extend's line: %s", ext)
	}
	if get := lines[2]; !strings.Contains(get, `msg="idem serve record"`) || !strings.Contains(get, "record_status=in_progress") {
		t.Errorf("record's line: %s", get)
	}

	hc, hlogs := newServeTest(t, s, "", true)
	hc.post("/v1/claim", obj{"key": "receipt:8891:7"}).expect(t, 409, "busy")
	hc.do("GET", "/v1/records/receipt:8891:7", "").expect(t, 200, "")
	// The key, not a digit run of it: "8891" alone turned up inside a
	// logged retry_after (29.998891s).
	if out := hlogs.String(); strings.Contains(out, "receipt:8891") || strings.Count(out, "key_hash=") != 2 {
		t.Errorf("--hash-keys logged the key:\n%s", out)
	}
}

// TestServeConcurrentClaims: 50 clients claim one key at once over HTTP;
// exactly one acquires it, on each store.
func TestServeConcurrentClaims(t *testing.T) {
	for _, b := range serveBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			s, _ := b.open(t)
			c, _ := newServeTest(t, s, "", false)
			acquired, busy := concurrentClaims(t, c.base, "", "race:1", 50)
			if acquired != 1 || busy != 49 {
				t.Fatalf("%d acquired, %d busy; want 1 and 49", acquired, busy)
			}
		})
	}
}

// concurrentClaims sends n claims of key at once and counts the answers.
func concurrentClaims(t *testing.T, base, token, key string, n int) (acquired, busy int) {
	t.Helper()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		start = make(chan struct{})
		other []string
	)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	defer client.CloseIdleConnections()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"key":%q,"owner":"w%d","lease":"1m"}`, key, i)
			req, _ := http.NewRequest("POST", base+"/v1/claim", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			<-start
			resp, err := client.Do(req)
			if err != nil {
				mu.Lock()
				other = append(other, err.Error())
				mu.Unlock()
				return
			}
			defer resp.Body.Close()
			var m map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&m)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case resp.StatusCode == 200 && m["outcome"] == "acquired":
				acquired++
			case resp.StatusCode == 409 && m["outcome"] == "busy":
				busy++
			default:
				other = append(other, fmt.Sprintf("%d %v", resp.StatusCode, m))
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(other) > 0 {
		t.Fatalf("unexpected answers: %v", other)
	}
	return acquired, busy
}

// TestServeUsage: refusals before listening.
func TestServeUsage(t *testing.T) {
	ctx := context.Background()
	db := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	for _, addr := range []string{"0.0.0.0:7070", ":7070", "192.0.2.1:7070", "example.com:7070"} {
		idemRun(ctx, "--store", db, "serve", "--listen", addr).expectErr(t, 2, "not a loopback address", "--token-file")
	}
	idemRun(ctx, "--store", db, "serve", "--listen", "nonsense").expectErr(t, 2, "--listen")
	empty := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	idemRun(ctx, "--store", db, "serve", "--listen", "0.0.0.0:0", "--token-file", empty).expectErr(t, 2, "is empty")
	idemRun(ctx, "--store", db, "serve", "--token-file", filepath.Join(t.TempDir(), "missing")).expectErr(t, 2, "--token-file")
	idemRun(ctx, "--store", db, "serve", "--max-body", "0").expectErr(t, 2, "--max-body")
	idemRun(ctx, "--store", db, "serve", "extra").expectErr(t, 2, "takes no arguments")
	idemRun(ctx, "serve", "--help").expect(t, 0, "POST /v1/claim", "Exit codes:", "--token-file")
}

// TestServeShutdown: a cancelled context (SIGINT, SIGTERM in main) stops
// the server with exit 0.
func TestServeShutdown(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, storeurl.New(), []string{"--store", db, "serve", "--listen", "127.0.0.1:0"}, &out, &errb)
	}()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(errb.String(), "idem serve: listening"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("serve did not listen:\n%s", errb.String())
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 || !strings.Contains(errb.String(), "idem serve: stopped") {
			t.Fatalf("exit %d, want 0 and a stop logged:\n%s", code, errb.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop")
	}
}

// committingStore's Claim waits for proceed, then commits the claim and
// reports its context's error, as PostgreSQL may when the context ends
// while the commit is on its way.
type committingStore struct {
	store.Store
	entered, proceed chan struct{}
}

func (s *committingStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	close(s.entered)
	<-s.proceed
	cr, err := s.Store.Claim(context.WithoutCancel(ctx), req)
	if err == nil && ctx.Err() != nil {
		return store.ClaimResult{}, ctx.Err()
	}
	return cr, err
}

// TestServeClientGone: a client that leaves while its claim is on its way
// leaves no attempt behind: the claim is undone, logged as client-gone at
// WARN, and the next claim acquires the key afresh.
func TestServeClientGone(t *testing.T) {
	mem := memstore.New()
	cs := &committingStore{Store: mem, entered: make(chan struct{}), proceed: make(chan struct{})}
	logs := &syncBuffer{}
	srv := newServer(cs, slog.New(slog.NewTextHandler(logs, nil)), nil, 4096, false)
	reqCtx := make(chan context.Context, 1)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqCtx <- r.Context()
		srv.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", hs.URL+"/v1/claim", strings.NewReader(`{"key":"gone:1"}`))
	req.Header.Set("Content-Type", "application/json")
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-cs.entered
	cancel()
	<-errc
	select {
	case <-(<-reqCtx).Done(): // the server saw the client leave
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not see the client leave")
	}
	close(cs.proceed)
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "outcome="); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no log line")
		}
	}
	if out := logs.String(); !strings.Contains(out, "outcome=client-gone") || !strings.Contains(out, "level=WARN") {
		t.Errorf("want a WARN client-gone line:\n%s", out)
	}
	rec, err := mem.Get(context.Background(), "gone:1")
	if err != nil || rec.Status == idem.StatusInProgress {
		t.Fatalf("the claim of a client that left was not undone: %+v %v", rec, err)
	}
	cr, err := mem.Claim(context.Background(), store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "gone:1", Owner: "next", Lease: time.Minute, Retention: time.Hour})
	if err != nil || !cr.Acquired || cr.Takeover {
		t.Fatalf("next claim: %+v %v; want acquired, no takeover", cr, err)
	}
}

// TestServeRepeatedNextLife: a record deleted or swept and claimed again
// starts a new life at a higher fence (fences never repeat for a key), so
// a stale client's retried complete of the first life, even with the same
// result, is not taken for the second life's: it is 409 lease-lost, and
// the second life's record is untouched. Only the fence and attempt_id
// the claim returned make a retry "repeated".
func TestServeRepeatedNextLife(t *testing.T) {
	for _, b := range serveBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			s, advance := b.open(t)
			c, _ := newServeTest(t, s, "", false)
			ctx := context.Background()
			a := c.post("/v1/claim", obj{"key": "life:1"}).expect(t, 200, "acquired")
			fa, ida := a.num("fence"), a.str("attempt_id")
			c.post("/v1/complete", obj{"key": "life:1", "fence": fa, "attempt_id": ida, "result": b64("r")}).expect(t, 200, "completed")
			if err := s.Delete(ctx, "life:1"); err != nil { // as a sweep after its retention
				t.Fatal(err)
			}
			advance(time.Millisecond)
			b2 := c.post("/v1/claim", obj{"key": "life:1"}).expect(t, 200, "acquired")
			fb, idb := b2.num("fence"), b2.str("attempt_id")
			if fb <= fa || b2.num("attempt") != 1 || idb == ida {
				t.Fatalf("second life: %s, first %s; want a higher fence and another attempt_id", b2, a)
			}
			c.post("/v1/complete", obj{"key": "life:1", "fence": fb, "attempt_id": idb, "result": b64("r")}).expect(t, 200, "completed")
			second, err := s.Get(ctx, "life:1")
			if err != nil {
				t.Fatal(err)
			}
			// The first life's client retries its complete: not repeated,
			// nor with the first life's id at the second life's fence, nor
			// the second life's id at the first life's fence.
			for _, late := range []obj{
				{"fence": fa, "attempt_id": ida},
				{"fence": fb, "attempt_id": ida},
				{"fence": fa, "attempt_id": idb},
			} {
				late["key"], late["result"] = "life:1", b64("r")
				ll := c.post("/v1/complete", late).expect(t, 409, "lease-lost")
				if ll.str("record_status") != "completed" || ll.num("record_fence") != fb || ll.body["repeated"] != nil {
					t.Fatalf("late complete %v: %s", late, ll)
				}
			}
			if rec, err := s.Get(ctx, "life:1"); err != nil || rec.Fence != fb || rec.AttemptID != idb || rec.Attempt != 1 || len(rec.Journal) != len(second.Journal) {
				t.Fatalf("the first life's late completes changed the second life: %+v %v, was %+v", rec, err, second)
			}
			if rep := c.post("/v1/complete", obj{"key": "life:1", "fence": fb, "attempt_id": idb, "result": b64("r")}).expect(t, 200, "completed"); rep.body["repeated"] != true {
				t.Fatalf("retry of the second life: %s", rep)
			}
			// A takeover keeps the life: its fence is the next, its
			// attempt_id another; the lapsed attempt's release is refused.
			l2 := c.post("/v1/claim", obj{"key": "life:2", "lease": "1s"}).expect(t, 200, "acquired")
			advance(1500 * time.Millisecond)
			tk := c.post("/v1/claim", obj{"key": "life:2"}).expect(t, 200, "takeover")
			if tk.num("fence") != l2.num("fence")+1 || tk.str("attempt_id") == l2.str("attempt_id") {
				t.Fatalf("takeover: %s, first claim %s", tk, l2)
			}
			c.post("/v1/release", obj{"key": "life:2", "fence": l2.num("fence"), "attempt_id": l2.str("attempt_id")}).expect(t, 409, "lease-lost")
			c.post("/v1/release", obj{"key": "life:2", "fence": tk.num("fence"), "attempt_id": tk.str("attempt_id")}).expect(t, 200, "released")
			if rep := c.post("/v1/release", obj{"key": "life:2", "fence": tk.num("fence"), "attempt_id": tk.str("attempt_id")}).expect(t, 200, "released"); rep.body["repeated"] != true {
				t.Fatalf("retried release after a takeover: %s", rep)
			}
		})
	}
}

// TestServeBrowserGuards: a web page cannot drive the server: POST bodies
// must be declared JSON, cross-origin requests are refused with a token
// or without, and without a token the Host must be a loopback name (no
// DNS rebinding).
func TestServeBrowserGuards(t *testing.T) {
	s := openServeSQLite(t)
	c, _ := newServeTest(t, s, "", false)
	claim := `{"key":"csrf:1"}`
	c.do("POST", "/v1/claim", claim, "Content-Type", "text/plain").expect(t, 415, "unsupported-media-type")
	c.do("POST", "/v1/claim", claim, "Content-Type", "").expect(t, 415, "unsupported-media-type")
	c.do("POST", "/v1/claim", claim, "Content-Type", "application/x-www-form-urlencoded").expect(t, 415, "unsupported-media-type")
	for _, h := range [][]string{
		{"Origin", "http://evil.example"},
		{"Origin", "null"},
		{"Sec-Fetch-Site", "cross-site"},
		{"Sec-Fetch-Site", "same-site"},
		{"Host", "evil.example:7070"},
		{"Host", "evil.example"},
		{"Host", "127.0.0.1.evil.example"},
	} {
		kind := "cross-origin"
		if h[0] == "Host" {
			kind = "host-not-allowed"
		}
		c.do("POST", "/v1/claim", claim, h...).expect(t, 403, kind)
		c.do("GET", "/v1/records/csrf:1", "", h...).expect(t, 403, kind)
	}
	if _, err := s.Get(context.Background(), "csrf:1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused request reached the store: %v", err)
	}
	for _, h := range [][]string{
		{"Content-Type", "application/json; charset=utf-8"},
		{"Sec-Fetch-Site", "none"},
		{"Sec-Fetch-Site", "same-origin"},
		{"Host", "localhost:7070"},
		{"Host", "LOCALHOST"},
		{"Host", "127.0.0.2:80"},
		{"Host", "[::1]:7070"},
		{"Host", "[::1]"},
	} {
		c.do("GET", "/healthz", "", h...).expect(t, 200, "")
	}
	c.do("POST", "/v1/claim", claim, "Content-Type", "application/json; charset=utf-8").expect(t, 200, "acquired")

	// With a token any Host will do (the token is the guard), but not
	// another origin.
	tc, _ := newServeTest(t, s, "tok", false)
	tc.do("GET", "/healthz", "", "Host", "idem.internal:7070").expect(t, 200, "")
	tc.do("POST", "/v1/claim", `{"key":"csrf:2"}`, "Origin", "https://evil.example").expect(t, 403, "cross-origin")
	tc.do("POST", "/v1/claim", `{"key":"csrf:2"}`, "Content-Type", "text/plain").expect(t, 415, "unsupported-media-type")
}

// TestServeHashKeysErrors: with --hash-keys a store error that names the
// key does not carry it into the log.
func TestServeHashKeysErrors(t *testing.T) {
	fs := &failingStore{Store: memstore.New(), fail: map[string]error{}}
	c, logs := newServeTest(t, fs, "", true)
	fs.set("claim", &idem.CorruptError{Key: "SECRETKEY1", Detail: "bad json"})
	c.post("/v1/claim", obj{"key": "SECRETKEY1"}).expect(t, 500, "record-corrupt")
	fs.set("claim", fmt.Errorf("timeout claiming SECRETKEY2"))
	c.post("/v1/claim", obj{"key": "SECRETKEY2"}).expect(t, 503, "store-unavailable")
	out := logs.String()
	if strings.Contains(out, "SECRETKEY") || !strings.Contains(out, "corrupt record for key_hash:") {
		t.Fatalf("--hash-keys logged a key in an error:\n%s", out)
	}
}

// TestServeHealthReads: /healthz fails when the store cannot be read,
// even though its clock answers.
func TestServeHealthReads(t *testing.T) {
	fs := &failingStore{Store: memstore.New(), fail: map[string]error{}}
	c, _ := newServeTest(t, fs, "", false)
	c.do("GET", "/healthz", "").expect(t, 200, "")
	fs.set("get", errors.New("database disk image is malformed"))
	if a := c.do("GET", "/healthz", "").expect(t, 503, "store-unavailable"); a.header.Get("Retry-After") == "" {
		t.Fatalf("503 without Retry-After: %v", a.header)
	}
	fs.set("get", &idem.CorruptError{Key: "idem-serve:healthz", Detail: "x"})
	c.do("GET", "/healthz", "").expect(t, 503, "store-unavailable")
}

// TestServeLateWriterNextLife: a late writer of a record's earlier life
// (deleted or swept, then claimed anew, at a higher fence: fences never
// repeat for a key) that sends its fence and attempt_id is refused 409
// lease-lost by complete, release, fail, abandon and extend: it does not
// end or touch the new life's attempt.
func TestServeLateWriterNextLife(t *testing.T) {
	for _, b := range serveBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			s, advance := b.open(t)
			c, _ := newServeTest(t, s, "", false)
			ctx := context.Background()
			first := c.post("/v1/claim", obj{"key": "late:1", "policy": "at_most_once"}).expect(t, 200, "acquired")
			oldFence, old := first.num("fence"), first.str("attempt_id")
			if err := s.Delete(ctx, "late:1"); err != nil { // as a sweep
				t.Fatal(err)
			}
			calls := []struct {
				path string
				body obj
			}{
				{"/v1/complete", obj{"result": b64("late")}},
				{"/v1/release", obj{"reason": "late"}},
				{"/v1/fail", obj{"reason": "late"}},
				{"/v1/abandon", obj{"reason": "late"}},
				{"/v1/extend", obj{"lease": "1m"}},
			}
			send := func(path string, body obj, fence int64, id string) answer {
				m := obj{"key": "late:1", "fence": fence, "attempt_id": id}
				for k, v := range body {
					m[k] = v
				}
				return c.post(path, m)
			}
			// No record at all: refused, no record_status.
			for _, call := range calls {
				if ll := send(call.path, call.body, oldFence, old).expect(t, 409, "lease-lost"); ll.body["record_status"] != nil {
					t.Fatalf("%s: %s", call.path, ll)
				}
			}
			advance(time.Millisecond)
			cur := c.post("/v1/claim", obj{"key": "late:1", "policy": "at_most_once"}).expect(t, 200, "acquired")
			curFence := cur.num("fence")
			if curFence <= oldFence || cur.str("attempt_id") == old {
				t.Fatalf("second life: %s, first %s; want a higher fence and another attempt_id", cur, first)
			}
			before, err := s.Get(ctx, "late:1")
			if err != nil {
				t.Fatal(err)
			}
			for _, call := range calls {
				ll := send(call.path, call.body, oldFence, old).expect(t, 409, "lease-lost")
				if ll.str("record_status") != "in_progress" || ll.num("record_fence") != curFence {
					t.Fatalf("%s: %s", call.path, ll)
				}
				rec, err := s.Get(ctx, "late:1")
				if err != nil || rec.Status != idem.StatusInProgress || rec.Fence != curFence || rec.AttemptID != cur.str("attempt_id") ||
					!rec.LeaseUntil.Equal(before.LeaseUntil) || rec.Reason != "" {
					t.Fatalf("a late %s of the first life wrote to the second: %+v %v", call.path, rec, err)
				}
			}
			// The second life's own calls go through.
			send("/v1/extend", obj{"lease": "1m"}, curFence, cur.str("attempt_id")).expect(t, 200, "extended")
			send("/v1/complete", obj{"result": b64("ok")}, curFence, cur.str("attempt_id")).expect(t, 200, "completed")
			if rep := send("/v1/complete", obj{"result": b64("ok")}, curFence, cur.str("attempt_id")).expect(t, 200, "completed"); rep.body["repeated"] != true {
				t.Fatalf("retried complete: %s", rep)
			}
		})
	}
}

// TestServeExtendWithinRetention: extend refuses a lease that would end
// less than 1h before the record's retention: the stores push the expiry
// out to the lease's end, so after a crash an at_most_once key would be
// claimed afresh (not indeterminate) once its lease lapsed.
func TestServeExtendWithinRetention(t *testing.T) {
	for _, b := range serveBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			s, advance := b.open(t)
			c, _ := newServeTest(t, s, "", false)
			ctx := context.Background()
			a := c.post("/v1/claim", obj{"key": "ext:1", "policy": "at_most_once", "lease": "1m", "retention": "2h"}).expect(t, 200, "acquired")
			before, err := s.Get(ctx, "ext:1")
			if err != nil {
				t.Fatal(err)
			}
			for _, lease := range []string{"61m", "3h", "3650d"} {
				p := c.post("/v1/extend", obj{"key": "ext:1", "fence": a.num("fence"), "attempt_id": a.str("attempt_id"), "lease": lease}).expect(t, 400, "invalid-duration")
				if !strings.Contains(p.str("detail"), "retention") {
					t.Errorf("detail: %s", p)
				}
				if rec, err := s.Get(ctx, "ext:1"); err != nil || !rec.LeaseUntil.Equal(before.LeaseUntil) || !rec.ExpiresAt.Equal(before.ExpiresAt) {
					t.Fatalf("a refused extend of %s wrote: %+v %v", lease, rec, err)
				}
			}
			c.post("/v1/extend", obj{"key": "ext:1", "fence": a.num("fence"), "attempt_id": a.str("attempt_id"), "lease": "59m"}).expect(t, 200, "extended")
			rec, err := s.Get(ctx, "ext:1")
			if err != nil || rec.ExpiresAt.Sub(rec.LeaseUntil) < time.Hour {
				t.Fatalf("after extend: lease until %v, expires %v (%v)", rec.LeaseUntil, rec.ExpiresAt, err)
			}
			// Another attempt's fence or attempt_id is left to the store:
			// lease-lost.
			c.post("/v1/extend", obj{"key": "ext:1", "fence": a.num("fence") + 1, "attempt_id": a.str("attempt_id"), "lease": "3h"}).expect(t, 409, "lease-lost")
			c.post("/v1/extend", obj{"key": "ext:1", "fence": a.num("fence"), "attempt_id": store.NewAttemptID(), "lease": "3h"}).expect(t, 409, "lease-lost")

			// A retention at its floor (the lease plus 1h) leaves no room to
			// extend: the answer says so, and never suggests a shorter
			// lease, which would only move the lease's end earlier.
			b := c.post("/v1/claim", obj{"key": "ext:2", "lease": "30s", "retention": "1h30s"}).expect(t, 200, "acquired")
			advance(time.Second) // a heartbeat comes after the claim
			p := c.post("/v1/extend", obj{"key": "ext:2", "fence": b.num("fence"), "attempt_id": b.str("attempt_id"), "lease": "30s"}).expect(t, 400, "invalid-duration")
			if d := p.str("detail"); !strings.Contains(d, "no room to extend") || strings.Contains(d, "at most") {
				t.Errorf("extend at the retention floor: %s", p)
			}
		})
	}
}

// blockingStore commits a claim, then holds its answer until proceed is
// closed; once closed (as run closes the store after serve returns), its
// writes fail.
type blockingStore struct {
	store.Store
	entered, proceed chan struct{}
	mu               sync.Mutex
	closed           bool
}

func (s *blockingStore) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	cr, err := s.Store.Claim(ctx, req)
	close(s.entered)
	<-s.proceed
	return cr, err
}

func (s *blockingStore) isClosed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("store closed")
	}
	return nil
}

func (s *blockingStore) Finish(ctx context.Context, req store.FinishRequest) error {
	if req.Outcome == store.OutcomeReleased {
		if err := s.isClosed(); err != nil {
			return err
		}
	}
	return s.Store.Finish(ctx, req)
}

func (s *blockingStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// TestServeStopWaitsForCalls: a second signal cuts the connections, but
// serve returns (and the store is closed) only once the handlers have
// returned: a claim under way is undone, not left in progress (which an
// at_most_once key would answer indeterminate, with no worker).
func TestServeStopWaitsForCalls(t *testing.T) {
	mem := memstore.New()
	bs := &blockingStore{Store: mem, entered: make(chan struct{}), proceed: make(chan struct{})}
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	srv := newServer(bs, log, nil, 4096, false)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	again := make(chan os.Signal, 1)
	served := make(chan error, 1)
	go func() {
		served <- serveUntil(ctx, hs, ln, srv, log, func() (<-chan os.Signal, func()) { return again, func() {} })
	}()
	go func() {
		resp, err := http.Post("http://"+ln.Addr().String()+"/v1/claim", "application/json", strings.NewReader(`{"key":"stop:1","policy":"at_most_once"}`))
		if err == nil {
			resp.Body.Close()
		}
	}()
	<-bs.entered
	cancel() // the first signal
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "shutting down"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no shutdown")
		}
	}
	again <- syscall.SIGTERM // the second: connections are cut
	early := false
	select {
	case err = <-served:
		early = true
		bs.Close()
	case <-time.After(500 * time.Millisecond):
	}
	close(bs.proceed)
	if !early {
		select {
		case err = <-served:
			bs.Close()
		case <-time.After(30 * time.Second):
			t.Fatal("serve did not return")
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "outcome="); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the claim logged no line:\n%s", logs)
		}
	}
	if early {
		t.Errorf("serve returned while a claim was under way")
	}
	rec, err := mem.Get(context.Background(), "stop:1")
	if err != nil || rec.Status == idem.StatusInProgress {
		t.Fatalf("the claim cut by the second signal was not undone before the store closed: %+v %v\n%s", rec, err, logs)
	}
	if out := logs.String(); !strings.Contains(out, "outcome=client-gone") || strings.Contains(out, "undo_error") {
		t.Errorf("want the claim undone, logged client-gone:\n%s", out)
	}
}
