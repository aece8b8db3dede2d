package main

import (
	"bytes"
	"context"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/explain"
	"github.com/idemkit/idem/cmd/idem/internal/storeurl"
	"github.com/idemkit/idem/internal/jsontext"
	"github.com/idemkit/idem/internal/problem"
	"github.com/idemkit/idem/store"
)

var serveCmd = &command{
	name:     "serve",
	synopsis: "[--listen ADDR] [--token-file PATH] [--max-body BYTES] [--hash-keys] [--metrics=false] [--console=false]",
	summary:  "serve the ledger over HTTP, for workers in any language",
	help: `
Serve answers an HTTP JSON API over the store, so that a worker in Python,
Node or a shell script follows the protocol the Go Ledger follows: claim a
key, do the effect, then complete (or release, fail, abandon) the attempt
under the fence the claim returned, extending the lease while it works.
Claims are decided exactly as the Go Ledger decides them, by the store's
clock. The store is opened as a worker opens it: a missing SQLite file or
PostgreSQL table is created.

  POST /v1/claim     {"key", "owner"?, "policy"? (at_least_once | at_most_once),
                      "lease"? (Go duration, default 30s), "retention"? (default 7d),
                      "fingerprint"? (the request; stored as its sha256, as
                      idem.Fingerprint does)}
       200 acquired | takeover {fence, attempt, attempt_id, lease_until}  run it
       200 done {result (base64, "" if empty), fence, attempt}  already done
       409 busy {retry_after (seconds), lease_until} + Retry-After
       409 indeterminate {fence, attempt, owner, since, reason}  resolve it
       409 failed {reason, fence, attempt}                      failed for good
       422 mismatch {record_status}         the key was used for another request
  POST /v1/complete  {"key", "fence", "attempt_id", "result"? (base64),
                      "retention"? (default 7d, not the claim's)}
  POST /v1/release   {"key", "fence", "attempt_id", "reason"?}
  POST /v1/fail      {"key", "fence", "attempt_id", "reason", "retention"?}
  POST /v1/abandon   {"key", "fence", "attempt_id", "reason"?}  end the lease
  POST /v1/extend    {"key", "fence", "attempt_id", "lease"? (default 30s)}
                     200 {lease_until}
       200 {outcome: completed | released | failed | abandoned | extended}
       409 lease-lost: the attempt no longer holds the key; nothing recorded
           by this call {record_status, record_fence: what the key holds}
  GET  /v1/records/KEY   the record as 'idem inspect --json' prints it; 404
  GET  /v1/records?status=&stuck=&indeterminate=&prefix=&updated_after=
                   &updated_before=&cursor=&limit=
                         {records: [...], next_cursor}: records in key order as
                         'idem ls --json' prints them, filtered as ls filters
                         (status: the STATE column's; stuck=true (or lapsed=true):
                         lapsed and indeterminate; times RFC 3339 or a duration
                         ago); limit 1-1000 (default 100); next_cursor (absent on
                         the last page) is opaque: pass it back as cursor
  GET  /v1/records/KEY/story  'idem explain --json': the key's story and verdict
                         (a key ending in /story: escape its slash, %2F)
  GET  /healthz          200 when the store answers a read, else 503
  GET  /readyz           the same check, under the name readiness probes use
  GET  /metrics          Prometheus exposition of the claims served (idem_operations_total
                         by outcome, takeovers, busy, indeterminate, ...: see
                         docs/observability.md) and of the process; --metrics=false
                         turns it off (404)
  GET  /console/         the operations console, web pages: overview, records,
                         a key's story, queues; resolve, release, delete and
                         redrive behind a confirmation (docs/console.md);
                         --console=false turns it off (404)

Calls on an attempt name it by the fence and the attempt_id its claim
returned (both required): the store writes only while that attempt holds
the key, in the same conditional write, so a late writer of an attempt
that was taken over, resolved, ended, or of a record deleted since, is
409 lease-lost. Fences never repeat for a key, across deletes and
sweeps. A retried complete, release or fail whose first try was recorded
is answered 200 again, "repeated": true (with the same result or
reason); else it is 409 lease-lost. An attempt is abandoned once: a
repeated abandon is 409 lease-lost.
A lease is at least 1s. A retention is at least 1h and, for a claim, at
least the lease plus 1h. A claim whose client leaves before the answer is
undone, and so is one that the store took but whose answer was lost
(the 503 then asks for a retry, which finds the key free). One answered
but never read (the connection broke after it) holds the key as a
crashed worker would: a retry of the claim is busy until the lease
lapses, then a takeover (at_least_once) or indeterminate (at_most_once).
Keep claim leases short and extend them.
For the same reason extend reads the record and refuses (400
invalid-duration) a lease that would end less than 1h before the
record's retention: the lease would run the record's expiry out with it,
and after a crash an at_most_once key would be claimed afresh instead of
answered indeterminate. For long work, claim with a retention longer
than the work plus 1h.
Every error is application/problem+json (type, title, status, detail);
claim outcomes and lease-lost also carry "outcome". A store failure is
503 with Retry-After: nothing is known, retry the call. Bad input is 400
(invalid-body, invalid-key, invalid-fence, invalid-attempt,
invalid-duration, invalid-policy, invalid-reason, invalid-query), a body over
--max-body 413. A body is
one JSON object, valid UTF-8 with no unpaired surrogate escape (a lone
\uD800-\uDFFF, which JSON decoders turn into U+FFFD), each field named
exactly once.
X-Request-Id is echoed (or made) and recorded as the claim's correlation
id. One log line per call goes to stderr.

POST bodies must be Content-Type: application/json (else 415). A request
with an Origin header or a Sec-Fetch-Site other than none or same-origin
is refused 403 (cross-origin); the console's pages accept their own
origin only, and its forms carry a CSRF token. Without --token-file the server listens on
a loopback address only and answers only a loopback Host (localhost,
127.0.0.0/8, [::1]), else 403 (host-not-allowed). With it every request,
/healthz, /readyz and /metrics included, needs "Authorization: Bearer TOKEN" (the file's
content, surrounding white space trimmed; the scheme in any case), else
401. SIGINT or SIGTERM stops it gracefully (calls under way finish, 10s
at most; a second signal cuts their connections at once); it then waits
for handlers still in the store (15s at most: a claim cut short is
undone, a write that ends an attempt runs to its end), closes the store
and exits 0.`,
	exits: `  0  stopped by SIGINT or SIGTERM
  1  the store could not be opened, or the server failed
  2  usage error (a non-loopback --listen without --token-file)`,
	run: runServe,
}

const (
	defaultListen   = "127.0.0.1:7070"
	defaultMaxBody  = 1 << 20
	shutdownTimeout = 10 * time.Second
	// maxDuration bounds a lease or retention from a request: a longer one is
	// a mistake, and times past 2262 do not fit a store's nanoseconds.
	maxDuration = 10 * 365 * 24 * time.Hour
	// minRetention is the shortest retention a request may ask for, and
	// how long before its record's retention an attempt's lease must end:
	// a record that expires as its lease lapses after a crash would let
	// an at_most_once key be claimed afresh instead of answered
	// indeterminate.
	minRetention = time.Hour
	// minLease is the shortest lease a request may ask for: a shorter one
	// lapses before a worker can act on it.
	minLease = time.Second
	// storeRetryAfter is the Retry-After of a 503.
	storeRetryAfter = time.Second
	// finishWriteTimeout bounds a write that ends an attempt, which runs to
	// its end even when the client leaves.
	finishWriteTimeout = 10 * time.Second
	// drainTimeout bounds the wait, once the server has stopped, for the
	// handlers still under way: a claim and its undo, or a write that ends
	// an attempt, each within finishWriteTimeout.
	drainTimeout = finishWriteTimeout + 5*time.Second
	// healthKey is the key /healthz reads: none is ever claimed under it.
	healthKey = "idem-serve:healthz"
	// problemBase begins the "type" of every problem document: each type
	// is the section of docs/problems.md that documents it.
	problemBase = problem.TypeBase + "serve-"
)

func runServe(ctx context.Context, a *app, args []string) error {
	fs := a.cmd.flagSet(a)
	listen := fs.String("listen", defaultListen, "the `ADDR` (host:port) to listen on")
	tokenFile := fs.String("token-file", "", "require \"Authorization: Bearer TOKEN\", TOKEN read from `PATH`")
	maxBody := fs.Int64("max-body", defaultMaxBody, "the largest request body, in `BYTES`")
	hashKeys := fs.Bool("hash-keys", false, "log a key's sha256 prefix (key_hash) instead of the key; the list and stories name keys by it too")
	metrics := fs.Bool("metrics", true, "serve /metrics (Prometheus) and count the claims served")
	withConsole := fs.Bool("console", true, "serve the operations console under /console/ (behind the token with --token-file)")
	var level slog.Level
	fs.TextVar(&level, "log-level", slog.LevelInfo, "log calls at or above `LEVEL` (debug, info, warn, error); a granted claim, a duplicate, a busy key, an extension and a read are debug")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	if *maxBody <= 0 {
		return usagef("--max-body must be positive")
	}
	var token []byte
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return usagef("--token-file: %v", err)
		}
		if token = bytes.TrimSpace(b); len(token) == 0 {
			return usagef("--token-file %s is empty", *tokenFile)
		}
	} else if err := loopbackOnly(*listen); err != nil {
		return err
	}
	s, err := a.stores.Open(ctx, a.storeURL, storeurl.Options{})
	if err != nil {
		if errors.Is(err, storeurl.ErrUnknownScheme) || errors.Is(err, storeurl.ErrNoScheme) {
			return usagef("%v", err)
		}
		return err
	}
	a.store, a.ownsStore = s, true

	log := slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: level}))
	srv := newServer(s, log, token, *maxBody, *hashKeys)
	if *metrics {
		m, err := newServeMetrics()
		if err != nil {
			return err
		}
		defer m.shutdown()
		srv.obs, srv.metrics, srv.counters = m.observer, m.handler, m.counters
	}
	if *withConsole {
		cs, err := newConsole(s, srv.ledger, *hashKeys, a.storeURL, log)
		if err != nil {
			return err
		}
		if *metrics {
			cs.counters = srv.counters
		}
		srv.console = cs
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	hs := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("idem serve: listening", slog.String("addr", ln.Addr().String()),
		slog.String("store", storeurl.Redact(a.storeURL)), slog.Bool("auth", token != nil))
	return serveUntil(ctx, hs, ln, srv, log, func() (<-chan os.Signal, func()) {
		again := make(chan os.Signal, 1)
		signal.Notify(again, os.Interrupt, syscall.SIGTERM)
		return again, func() { signal.Stop(again) }
	})
}

// serveUntil serves hs on ln until it fails or ctx ends, then stops it
// gracefully; a signal on the channel notify returns (called once ctx has
// ended) stops it at once. Either way it returns only once srv's handlers
// have returned (or drainTimeout has passed): the store is closed after it
// returns, and a handler still inside a claim must be able to undo it.
func serveUntil(ctx context.Context, hs *http.Server, ln net.Listener, srv *server, log *slog.Logger, notify func() (<-chan os.Signal, func())) error {
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.Info("idem serve: shutting down")
	// A second SIGINT or SIGTERM stops at once: calls under way are cut.
	again, stop := notify()
	defer stop()
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-again:
			log.Warn("idem serve: second signal: stopping at once, calls under way are cut")
			_ = hs.Close()
		case <-stopped:
		}
	}()
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		log.Warn("idem serve: calls still under way at the deadline were cut", slog.Any("error", err))
		_ = hs.Close()
	}
	err := <-served
	// Shutdown waits for calls under way, but Close does not: a handler
	// may still be in the store (a claim it must undo, a write that ends
	// an attempt, each bounded by finishWriteTimeout).
	if !srv.inflight.wait(drainTimeout) {
		log.Warn("idem serve: calls still under way were left to the store's closing", slog.Duration("waited", drainTimeout))
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	log.Info("idem serve: stopped")
	return nil
}

// calls counts the handlers under way.
type calls struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; nil when nobody waits
}

func (c *calls) begin() {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
}

func (c *calls) end() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n--; c.n == 0 && c.idle != nil {
		close(c.idle)
		c.idle = nil
	}
}

// wait waits for no call to be under way, at most d; it reports whether
// none is.
func (c *calls) wait(d time.Duration) bool {
	c.mu.Lock()
	if c.n == 0 {
		c.mu.Unlock()
		return true
	}
	if c.idle == nil {
		c.idle = make(chan struct{})
	}
	idle := c.idle
	c.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-idle:
		return true
	case <-t.C:
		return false
	}
}

// loopbackOnly refuses an address that is not on a loopback interface:
// without a token, anyone who reaches the port could claim and complete
// keys.
func loopbackOnly(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("--listen %q: %v", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return usagef("--listen %q is not a loopback address: give --token-file to listen on it (or listen on 127.0.0.1)", addr)
}

// server is the HTTP API of `idem serve`.
type server struct {
	store    store.Store
	log      *slog.Logger
	ledger   *idem.Ledger // for the defaults and the key's log attribute only
	token    [sha256.Size]byte
	auth     bool
	maxBody  int64
	hashKeys bool
	inflight calls
	// obs is told of each call and of the operations they make (nil:
	// --metrics=false); metrics serves /metrics.
	obs     idem.Observer
	metrics http.Handler
	// counters reads the metrics' idem_* counters (nil: --metrics=false).
	counters func() map[string]float64
	// console serves /console/ (nil: --console=false).
	console *console
	// cursorAEAD seals the list's cursors under --hash-keys (nil without).
	cursorAEAD cipher.AEAD
}

func newServer(s store.Store, log *slog.Logger, token []byte, maxBody int64, hashKeys bool) *server {
	opts := []idem.Option{idem.WithLogger(log)}
	if hashKeys {
		opts = append(opts, idem.WithHashedKeysInLogs())
	}
	srv := &server{store: s, log: log, ledger: idem.New(s, opts...), maxBody: maxBody, hashKeys: hashKeys}
	if hashKeys {
		srv.cursorAEAD = newCursorAEAD()
	}
	if token != nil {
		srv.auth, srv.token = true, sha256.Sum256(token)
	}
	return srv
}

// call is one request: what its log line says.
type call struct {
	id      string // X-Request-Id, the correlation id
	key     string
	outcome string
	fence   int64
	attempt int
	status  int
	extra   []slog.Attr
	// For the observer: the claim's policy, the attempt, whether a finish
	// was a retry already recorded, and the store call that failed.
	policy    idem.Policy
	attemptID string
	repeated  bool
	storeOp   string
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.inflight.begin()
	defer s.inflight.end()
	start := time.Now()
	c := &call{id: requestID(r)}
	w.Header().Set("X-Request-Id", c.id)
	w.Header().Set("Cache-Control", "no-store")
	defer func() { s.logCall(r, c, time.Since(start)) }()
	if s.console != nil && consolePath(r.URL.EscapedPath()) {
		// Web pages: their own browser guard and token check.
		s.serveConsole(w, r, c)
		return
	}
	if !s.browserSafe(w, r, c) {
		return
	}
	if s.auth && !s.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="idem"`)
		s.problem(w, c, http.StatusUnauthorized, "unauthorized", "Send Authorization: Bearer TOKEN with the server's token.", nil)
		return
	}
	path := r.URL.EscapedPath()
	if path == "/metrics" && s.metrics != nil {
		// Not observed: a scrape does not count itself.
		if s.method(w, c, r, http.MethodGet) {
			c.outcome, c.status = "metrics", http.StatusOK
			s.metrics.ServeHTTP(w, r)
		}
		return
	}
	if s.obs != nil {
		ctx := s.obs.Observe(r.Context(), idem.Event{Kind: idem.RequestStart, Method: r.Method, Route: routeOf(path), Started: start})
		r = r.WithContext(ctx)
		defer s.observeCall(ctx, r, c, path, start)
	}
	if path == "/v1/records" {
		if s.method(w, c, r, http.MethodGet) {
			s.list(w, r, c)
		}
		return
	}
	if rest, ok := strings.CutPrefix(path, "/v1/records/"); ok {
		if !s.method(w, c, r, http.MethodGet) {
			return
		}
		// A key that ends in "/story" is read with its slash escaped
		// (%2F): this path is the key's story.
		rest, story := strings.CutSuffix(rest, "/story")
		key, err := url.PathUnescape(rest)
		if err != nil {
			s.problem(w, c, http.StatusBadRequest, "invalid-key", "The key in the path is not properly escaped.", nil)
			return
		}
		if story {
			s.story(w, r, c, key)
		} else {
			s.record(w, r, c, key)
		}
		return
	}
	post := map[string]func(http.ResponseWriter, *http.Request, *call){
		"/v1/claim":    s.claim,
		"/v1/complete": s.complete,
		"/v1/release":  s.release,
		"/v1/fail":     s.fail,
		"/v1/abandon":  s.abandon,
		"/v1/extend":   s.extend,
	}
	if h, ok := post[path]; ok {
		if s.method(w, c, r, http.MethodPost) && s.jsonBody(w, r, c) {
			h(w, r, c)
		}
		return
	}
	if path == "/healthz" || path == "/readyz" {
		if s.method(w, c, r, http.MethodGet) {
			s.health(w, r, c)
		}
		return
	}
	s.problem(w, c, http.StatusNotFound, "not-found", "No such endpoint.", nil)
}

func (s *server) method(w http.ResponseWriter, c *call, r *http.Request, want string) bool {
	if r.Method == want || (want == http.MethodGet && r.Method == http.MethodHead) {
		return true
	}
	w.Header().Set("Allow", want)
	s.problem(w, c, http.StatusMethodNotAllowed, "method-not-allowed", "Use "+want+".", nil)
	return false
}

// browserSafe refuses what a web page could send: a request from another
// origin (an Origin header, which browsers send on cross-origin and on
// POST requests, or a Sec-Fetch-Site other than none or same-origin),
// token or not; and without a token, a Host that is not a loopback name,
// as after a DNS rebinding.
func (s *server) browserSafe(w http.ResponseWriter, r *http.Request, c *call) bool {
	sfs := r.Header.Get("Sec-Fetch-Site")
	if len(r.Header.Values("Origin")) > 0 || (sfs != "" && sfs != "none" && sfs != "same-origin") {
		s.problem(w, c, http.StatusForbidden, "cross-origin", "Requests from web pages (with an Origin header or a cross-site Sec-Fetch-Site) are refused.", nil)
		return false
	}
	if !s.auth && !loopbackHost(r.Host) {
		s.problem(w, c, http.StatusForbidden, "host-not-allowed", "Without a token the server answers only requests addressed to a loopback host (localhost, 127.0.0.1, [::1]).", nil)
		return false
	}
	return true
}

// loopbackHost reports whether host (a Host header, with or without a
// port) names a loopback address: localhost, 127.0.0.0/8 or ::1.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	} else {
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// jsonBody refuses a POST whose body is not declared application/json: a
// web page can send text/plain to any address without asking.
func (s *server) jsonBody(w http.ResponseWriter, r *http.Request, c *call) bool {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err == nil && mt == "application/json" {
		return true
	}
	s.problem(w, c, http.StatusUnsupportedMediaType, "unsupported-media-type", "Send the body as Content-Type: application/json.", nil)
	return false
}

func (s *server) authorized(r *http.Request) bool {
	// The scheme is case-insensitive (RFC 9110 section 11.1).
	scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(got)))
	return subtle.ConstantTimeCompare(sum[:], s.token[:]) == 1
}

// requestID returns the request's X-Request-Id when it is a sane one, else
// a new random id.
func requestID(r *http.Request) string {
	id := r.Header.Get("X-Request-Id")
	if id != "" && len(id) <= 128 && strings.IndexFunc(id, func(c rune) bool { return c < 0x21 || c > 0x7e }) < 0 {
		return id
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// expectedCall reports whether outcome is that of a call that went as a
// worker expects (a claim granted, a duplicate answered, a busy key, a
// lease extended, a read, a probe): logged at DEBUG.
func expectedCall(outcome string) bool {
	switch outcome {
	case "acquired", "done", "busy", "extended", "record", "list", "story", "ok", "metrics", "console":
		return true
	}
	return false
}

func (s *server) logCall(r *http.Request, c *call, took time.Duration) {
	level := slog.LevelInfo
	switch {
	case c.outcome == "client-gone":
		level = slog.LevelWarn
	case c.status >= 500:
		level = slog.LevelError
	case c.outcome == "takeover" || c.outcome == "indeterminate" || c.outcome == "mismatch" || c.outcome == "lease-lost":
		level = slog.LevelWarn
	case expectedCall(c.outcome):
		// As the ledger logs: one INFO line per attempt's end, the
		// expected steps and answers on the way at DEBUG.
		level = slog.LevelDebug
	}
	attrs := make([]slog.Attr, 0, 10+len(c.extra))
	if c.key != "" {
		attrs = append(attrs, s.ledger.LogKey(c.key))
	}
	attrs = append(attrs, slog.String("outcome", c.outcome))
	// Fence and attempt when known (0 is none: a call on an attempt names
	// its fence but not its number).
	if c.fence != 0 {
		attrs = append(attrs, slog.Int64("fence", c.fence))
	}
	if c.attempt != 0 {
		attrs = append(attrs, slog.Int("attempt", c.attempt))
	}
	attrs = append(attrs,
		slog.String("correlation_id", c.id),
		slog.String("remote_addr", r.RemoteAddr),
		slog.String("method", r.Method),
		slog.String("path", s.logPath(r)),
		slog.Int("status", c.status),
		slog.Duration("took", took))
	attrs = append(attrs, c.extra...)
	s.log.LogAttrs(r.Context(), level, "idem serve "+c.outcome, attrs...)
}

// logPath is the path to log: a record's path holds its key, which
// --hash-keys keeps out of the log.
func (s *server) logPath(r *http.Request) string {
	if s.hashKeys && strings.HasPrefix(r.URL.Path, "/v1/records/") {
		return "/v1/records/…"
	}
	return r.URL.Path
}

// reply answers 200 with v as JSON.
func (s *server) reply(w http.ResponseWriter, c *call, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		s.problem(w, c, http.StatusInternalServerError, "internal", "The answer could not be encoded.", nil)
		return
	}
	c.status = http.StatusOK
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(b, '\n'))
}

var problemTitles = map[string]string{
	"unauthorized":           "Missing or wrong bearer token",
	"cross-origin":           "Cross-origin request refused",
	"host-not-allowed":       "Host not allowed",
	"unsupported-media-type": "Body must be application/json",
	"not-found":              "Not found",
	"method-not-allowed":     "Method not allowed",
	"invalid-body":           "Request body is not the expected JSON",
	"invalid-key":            "Key is invalid",
	"invalid-query":          "Query parameter is invalid",
	"invalid-fence":          "Fence is invalid",
	"invalid-attempt":        "Attempt id is missing",
	"invalid-duration":       "Duration is invalid",
	"invalid-policy":         "Policy is invalid",
	"invalid-reason":         "Reason is missing",
	"body-too-large":         "Request body too large",
	"store-unavailable":      "Store unavailable",
	"record-corrupt":         "Stored record is corrupt",
	"internal":               "Internal error",
	"busy":                   "Another attempt holds the key",
	"indeterminate":          "An earlier attempt's outcome is unknown",
	"failed":                 "The operation failed permanently",
	"mismatch":               "Key already used for a different request",
	"lease-lost":             "Lease lost",
}

// problem answers with an RFC 9457 problem document of kind; members are
// extension members (outcome, fence, ...). The outcome is kind unless
// members name one.
func (s *server) problem(w http.ResponseWriter, c *call, status int, kind, detail string, members map[string]any) {
	if c.outcome == "" {
		c.outcome = kind
	}
	c.status = status
	problem.Write(w, status, problemBase+kind, problemTitles[kind], detail, members, 0)
}

// storeFailed answers a store error: 503 with Retry-After (500 for a
// corrupt record, which a retry does not mend). Never an outcome.
func (s *server) storeFailed(w http.ResponseWriter, c *call, op string, err error) {
	c.extra = append(c.extra, slog.String("op", op), s.errAttr(c, "error", err))
	c.storeOp = op
	if errors.Is(err, idem.ErrCorrupt) {
		c.outcome = "store-error"
		s.problem(w, c, http.StatusInternalServerError, "record-corrupt",
			"The key's record cannot be decoded; nothing was done. An operator must repair it (idem delete).", nil)
		return
	}
	c.outcome = "store-error"
	w.Header().Set("Retry-After", problem.RetryAfter(storeRetryAfter))
	s.problem(w, c, http.StatusServiceUnavailable, "store-unavailable",
		"The store did not answer the "+op+"; whether it happened is unknown. Retry the same call.", nil)
}

// errAttr is err for the log line of c: with --hash-keys, the call's key
// (raw or quoted) is replaced by its hash, as in the key_hash attribute.
func (s *server) errAttr(c *call, name string, err error) slog.Attr {
	if !s.hashKeys || c.key == "" {
		return slog.Any(name, err)
	}
	hash := "key_hash:" + s.ledger.LogKey(c.key).Value.String()
	msg := strings.ReplaceAll(err.Error(), strconv.Quote(c.key), hash)
	return slog.String(name, strings.ReplaceAll(msg, c.key, hash))
}

// decode reads the request's JSON body into v: one object, valid UTF-8,
// each field named exactly (not in another case) and once, no unknown
// fields, at most maxBody bytes.
func (s *server) decode(w http.ResponseWriter, r *http.Request, c *call, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		s.problem(w, c, http.StatusRequestEntityTooLarge, "body-too-large", fmt.Sprintf("The body is over %d bytes.", s.maxBody), nil)
		return false
	}
	if err == nil && !utf8.Valid(body) {
		// encoding/json would replace each bad byte by U+FFFD: two
		// different keys would become one.
		err = errors.New("the body is not valid UTF-8")
	}
	if err == nil && jsontext.LoneSurrogate(body) {
		err = errors.New("the body has an unpaired UTF-16 surrogate escape: encoding/json would decode it as U+FFFD, making different strings one")
	}
	if err == nil {
		err = exactFields(body, v)
	}
	if err == nil {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		err = dec.Decode(v)
		if err == nil {
			if _, terr := dec.Token(); !errors.Is(terr, io.EOF) {
				err = errors.New("data after the JSON object")
				if terr != nil {
					err = terr
				}
			}
		}
	}
	if err == nil {
		return true
	}
	if errors.Is(err, io.EOF) {
		err = errors.New("empty body")
	}
	s.problem(w, c, http.StatusBadRequest, "invalid-body", err.Error(), nil)
	return false
}

// exactFields checks the names of the top-level object in body against
// the json names of v's struct fields: encoding/json matches names
// regardless of case and keeps the last of duplicates, which would let
// "KEY" or a second "key" pass unseen. A body that is not an object is
// left for the decoder to refuse.
func exactFields(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	known := jsonFields(reflect.TypeOf(v).Elem(), map[string]bool{})
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		name, _ := tok.(string)
		if !known[name] {
			return fmt.Errorf("json: unknown field %q (field names are case-sensitive)", name)
		}
		if seen[name] {
			return fmt.Errorf("json: duplicate field %q", name)
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return nil
}

// jsonFields adds the json names of struct type t's fields (and of its
// embedded structs' fields) to names.
func jsonFields(t reflect.Type, names map[string]bool) map[string]bool {
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			jsonFields(f.Type, names)
			continue
		}
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" && name != "-" {
			names[name] = true
		}
	}
	return names
}

// checkKey validates key as [idem.RawKey] does.
func (s *server) checkKey(w http.ResponseWriter, c *call, key string) bool {
	if err := idem.RawKey(key).Err(); err != nil {
		s.problem(w, c, http.StatusBadRequest, "invalid-key", err.Error(), nil)
		return false
	}
	c.key = key
	return true
}

// duration parses an optional duration field; "" gives def.
func (s *server) duration(w http.ResponseWriter, c *call, field, v string, def time.Duration) (time.Duration, bool) {
	if v == "" {
		return def, true
	}
	d, err := parseDuration(v)
	if err == nil && (d <= 0 || d > maxDuration) {
		err = fmt.Errorf("%q must be positive and at most %dd", v, maxDuration/(24*time.Hour))
	}
	if err != nil {
		s.problem(w, c, http.StatusBadRequest, "invalid-duration", field+": "+err.Error(), nil)
		return 0, false
	}
	return d, true
}

// lease parses an optional lease ("" is the default): at least minLease.
func (s *server) lease(w http.ResponseWriter, c *call, v string) (time.Duration, bool) {
	d, ok := s.duration(w, c, "lease", v, s.ledger.Lease())
	if ok && d < minLease {
		s.problem(w, c, http.StatusBadRequest, "invalid-duration", fmt.Sprintf("lease: %q must be at least %v", v, minLease), nil)
		return 0, false
	}
	return d, ok
}

// retention parses an optional retention ("" is the default): at least
// minRetention more than lease (0 for complete and fail, whose attempt
// has ended). A claim's record expires retention after the claim, so its
// lease ends at least minRetention before, as extend keeps it: a record
// that expired as its attempt's lease lapsed would make a crashed
// at_most_once key a fresh one.
func (s *server) retention(w http.ResponseWriter, c *call, v string, lease time.Duration) (time.Duration, bool) {
	d, ok := s.duration(w, c, "retention", v, s.ledger.Retention())
	if ok && d < lease+minRetention {
		given := strconv.Quote(v)
		if v == "" {
			given = "the default " + explain.Dur(d)
		}
		want := fmt.Sprintf("at least %v", minRetention)
		if lease > 0 {
			want = fmt.Sprintf("at least the lease (%v) plus %v", lease, minRetention)
		}
		s.problem(w, c, http.StatusBadRequest, "invalid-duration", fmt.Sprintf(
			"retention: %s must be %s: a crashed attempt's record must outlive its lease, or an at_most_once key would be claimed afresh instead of answered indeterminate",
			given, want), nil)
		return 0, false
	}
	return d, ok
}

func stamp3339(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

type claimBody struct {
	Key         string  `json:"key"`
	Owner       string  `json:"owner"`
	Policy      string  `json:"policy"`
	Lease       string  `json:"lease"`
	Retention   string  `json:"retention"`
	Fingerprint *string `json:"fingerprint"`
}

type claimAnswer struct {
	Outcome    string  `json:"outcome"`
	Key        string  `json:"key"`
	Fence      int64   `json:"fence"`
	Attempt    int     `json:"attempt"`
	AttemptID  string  `json:"attempt_id,omitempty"`
	LeaseUntil string  `json:"lease_until,omitempty"`
	Result     *[]byte `json:"result,omitempty"` // done: always, "" when empty
	Policy     string  `json:"policy,omitempty"`
}

func (s *server) claim(w http.ResponseWriter, r *http.Request, c *call) {
	var b claimBody
	if !s.decode(w, r, c, &b) || !s.checkKey(w, c, b.Key) {
		return
	}
	policy := idem.AtLeastOnce
	if b.Policy != "" {
		p, err := idem.ParsePolicy(b.Policy)
		if err != nil {
			s.problem(w, c, http.StatusBadRequest, "invalid-policy", `policy must be "at_least_once" or "at_most_once"`, nil)
			return
		}
		policy = p
	}
	lease, ok := s.lease(w, c, b.Lease)
	if !ok {
		return
	}
	retention, ok := s.retention(w, c, b.Retention, lease)
	if !ok {
		return
	}
	owner := b.Owner
	if owner == "" {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			host = r.RemoteAddr
		}
		owner = "http:" + host
	}
	req := store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: b.Key, Owner: owner, Correlation: c.id, Policy: policy, Lease: lease, Retention: retention}
	if b.Fingerprint != nil {
		req.Fingerprint = store.FingerprintOf([]byte(*b.Fingerprint))
	}
	c.extra = append(c.extra, slog.String("owner", owner), slog.String("policy", policy.String()))
	c.policy = policy
	// The claim runs to its end even if the client leaves: a store may
	// commit it and then report the cancellation, and a claim that is
	// known acquired can be undone below, one in doubt cannot.
	sctx, cancel := finishCtx(r)
	defer cancel()
	cr, err := s.store.Claim(sctx, req)
	if err != nil {
		// The claim may have landed though its answer was lost: undo it,
		// as the Ledger does, so that the retry this 503 asks for finds
		// the key free, not held by an attempt nobody knows.
		if found, uerr := store.UndoLostClaim(sctx, s.store, req, "the claim's answer was lost: "+err.Error()); found || uerr != nil {
			c.extra = append(c.extra, slog.Bool("claim_undone", found && uerr == nil))
			if uerr != nil {
				c.extra = append(c.extra, s.errAttr(c, "undo_error", uerr))
			}
		}
		s.storeFailed(w, c, "claim", err)
		return
	}
	rec := cr.Record
	c.fence, c.attempt = rec.Fence, rec.Attempt
	if cr.Acquired {
		if r.Context().Err() != nil {
			// The client left while its claim was on its way: nobody holds
			// the fence. As the Ledger does, give the key back (a takeover
			// is left lapsed, as after a crash).
			uctx, ucancel := finishCtx(r)
			defer ucancel()
			if err := store.UndoClaim(uctx, s.store, cr, "the HTTP client left before its claim was answered"); err != nil {
				c.extra = append(c.extra, s.errAttr(c, "undo_error", err))
			}
			c.outcome = "client-gone"
			s.problem(w, c, http.StatusServiceUnavailable, "store-unavailable", "The request ended before its claim was answered; the claim was undone.", nil)
			return
		}
		c.outcome, c.attemptID = "acquired", rec.AttemptID
		if cr.Takeover {
			c.outcome = "takeover"
			c.extra = append(c.extra, slog.String("msg_detail", "took over a lapsed attempt: it may have done part or all of its effect"))
		}
		s.reply(w, c, claimAnswer{Outcome: c.outcome, Key: b.Key, Fence: rec.Fence, Attempt: rec.Attempt, AttemptID: rec.AttemptID,
			LeaseUntil: stamp3339(rec.LeaseUntil), Policy: policy.String()})
		return
	}
	answer, err := cr.Answer(req.Fingerprint)
	switch answer {
	case store.AnswerDuplicate:
		c.outcome = "done"
		result := nonNil(rec.Result)
		s.reply(w, c, claimAnswer{Outcome: "done", Key: b.Key, Fence: rec.Fence, Attempt: rec.Attempt, Result: &result})
	case store.AnswerMismatch:
		s.problem(w, c, http.StatusUnprocessableEntity, "mismatch", "The key was already used with a different fingerprint; use another key for another request.",
			map[string]any{"outcome": "mismatch", "key": b.Key, "record_status": rec.Status})
	case store.AnswerFailed:
		s.problem(w, c, http.StatusConflict, "failed", "The operation failed permanently on an earlier attempt; this is its final answer.",
			map[string]any{"outcome": "failed", "key": b.Key, "reason": rec.Reason, "fence": rec.Fence, "attempt": rec.Attempt})
	case store.AnswerIndeterminate:
		// The attempt that may have done the effect: the newest that ran
		// (an undone claim after it did nothing).
		e := lastRan(&rec)
		s.problem(w, c, http.StatusConflict, "indeterminate", "An at_most_once attempt never finished; its effect may have happened. It is not run again until resolved (idem resolve).",
			map[string]any{"outcome": "indeterminate", "key": b.Key, "fence": e.Fence, "attempt": e.Attempt, "owner": e.Owner,
				"since": stamp3339(e.LeaseUntil), "reason": e.Reason})
	case store.AnswerBusy:
		retry := max(rec.LeaseUntil.Sub(cr.Now), time.Millisecond)
		w.Header().Set("Retry-After", problem.RetryAfter(retry))
		c.extra = append(c.extra, slog.Duration("retry_after", retry))
		s.problem(w, c, http.StatusConflict, "busy", "Another attempt holds the key; retry after retry_after seconds.",
			map[string]any{"outcome": "busy", "key": b.Key, "retry_after": float64(retry.Milliseconds()) / 1000, "lease_until": stamp3339(rec.LeaseUntil),
				"fence": rec.Fence, "attempt": rec.Attempt, "owner": rec.Owner})
	default:
		if err == nil {
			err = fmt.Errorf("store: a claim of %q answered %v without acquiring it (a store bug)", b.Key, answer)
		}
		s.storeFailed(w, c, "claim", err)
	}
}

// lastRan is the journal entry of rec's newest attempt that ran fn, or may
// have (not one recorded as not run, not a decision), or the record's own
// attempt when the journal has none.
func lastRan(rec *idem.Record) store.JournalEntry {
	for i := len(rec.Journal) - 1; i >= 0; i-- {
		if e := rec.Journal[i]; !e.Decision && !e.NotRun() {
			return e
		}
	}
	return store.JournalEntry{Fence: rec.Fence, Attempt: rec.Attempt, Owner: rec.Owner, LeaseUntil: rec.LeaseUntil, Reason: rec.Reason}
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// attemptRef names the attempt a call acts on: the key, and the fence and
// attempt_id its claim returned.
type attemptRef struct {
	Key       string `json:"key"`
	Fence     int64  `json:"fence"`
	AttemptID string `json:"attempt_id"`
}

type completeBody struct {
	attemptRef
	Result    []byte `json:"result"`
	Retention string `json:"retention"`
}

type reasonBody struct { // release, abandon
	attemptRef
	Reason string `json:"reason"`
}

type failBody struct {
	attemptRef
	Reason    string `json:"reason"`
	Retention string `json:"retention"`
}

type extendBody struct {
	attemptRef
	Lease string `json:"lease"`
}

// attemptCall reads the body of a call on an attempt into v and checks
// its key and fence.
func (s *server) attemptCall(w http.ResponseWriter, r *http.Request, c *call, v any, ref *attemptRef) bool {
	if !s.decode(w, r, c, v) || !s.checkKey(w, c, ref.Key) {
		return false
	}
	if ref.Fence <= 0 {
		s.problem(w, c, http.StatusBadRequest, "invalid-fence", "fence must be the positive number the claim returned", nil)
		return false
	}
	c.fence = ref.Fence
	if ref.AttemptID == "" {
		s.problem(w, c, http.StatusBadRequest, "invalid-attempt", "attempt_id must be the attempt_id the claim returned", nil)
		return false
	}
	c.extra = append(c.extra, slog.String("attempt_id", ref.AttemptID))
	c.attemptID = ref.AttemptID
	return true
}

// finishCtx is the context of a write that ends an attempt: it runs to its
// end even if the client leaves (the effect may have happened).
func finishCtx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(r.Context()), finishWriteTimeout)
}

// finished answers a call that ended an attempt (outcome) or extended it:
// err nil is done; a refusal (lease lost, no record) is 409 lease-lost,
// unless recorded says that this very call was recorded by an earlier try
// (a retry after a lost answer): the journal entry of the call's attempt
// ended with outcome, as this call asked. Anything else is a store
// failure.
func (s *server) finished(w http.ResponseWriter, r *http.Request, c *call, op string, outcome store.Outcome, b attemptRef, err error, recorded func(*idem.Record, store.JournalEntry) bool) {
	if err == nil {
		c.outcome = string(outcome)
		s.reply(w, c, map[string]any{"outcome": outcome, "key": b.Key, "fence": b.Fence})
		return
	}
	if errors.Is(err, idem.ErrLeaseLost) || errors.Is(err, store.ErrNotFound) {
		members := map[string]any{"outcome": "lease-lost", "key": b.Key, "fence": b.Fence, "attempt_id": b.AttemptID}
		ctx, cancel := finishCtx(r)
		rec, gerr := s.store.Get(ctx, b.Key)
		cancel()
		if gerr != nil && !errors.Is(gerr, store.ErrNotFound) {
			// Whether an earlier try of this call was recorded is unknown:
			// never answer "nothing was recorded" on a store error.
			s.storeFailed(w, c, "get", gerr)
			return
		}
		if gerr == nil {
			if e, ok := rec.EntryOf(b.AttemptID); ok && recorded != nil && e.Fence == b.Fence && e.Outcome == outcome && recorded(&rec, e) {
				c.outcome, c.attempt, c.repeated = string(outcome), e.Attempt, true
				c.extra = append(c.extra, slog.Bool("repeated", true))
				s.reply(w, c, map[string]any{"outcome": outcome, "key": b.Key, "fence": b.Fence, "attempt_id": b.AttemptID, "repeated": true})
				return
			}
			// What the key holds now, for the client to look at.
			members["record_status"], members["record_fence"] = rec.Status, rec.Fence
		}
		s.problem(w, c, http.StatusConflict, "lease-lost", leaseLostDetail, members)
		return
	}
	s.storeFailed(w, c, op, err)
}

const leaseLostDetail = "The attempt no longer holds the key: the record is gone (expired or deleted), the attempt ended (finished, abandoned) or another attempt holds it (taken over, resolved); nothing was recorded by this call."

func (s *server) complete(w http.ResponseWriter, r *http.Request, c *call) {
	var b completeBody
	if !s.attemptCall(w, r, c, &b, &b.attemptRef) {
		return
	}
	retention, ok := s.retention(w, c, b.Retention, 0)
	if !ok {
		return
	}
	s.endAttempt(w, r, c, store.FinishRequest{Key: b.Key, Fence: b.Fence, AttemptID: b.AttemptID, Outcome: store.OutcomeCompleted, Result: b.Result, Retention: retention},
		func(rec *idem.Record, _ store.JournalEntry) bool {
			// Completed is final: the record is this attempt's result.
			return rec.Status == idem.StatusCompleted && bytes.Equal(rec.Result, b.Result)
		})
}

// endAttempt sends req, the store's one conditional write that ends the
// attempt the call names (complete, release, fail, abandon), and answers it
// (see finished). It runs to its end even if the client leaves: the effect
// may have happened.
func (s *server) endAttempt(w http.ResponseWriter, r *http.Request, c *call, req store.FinishRequest, recorded func(*idem.Record, store.JournalEntry) bool) {
	ctx, cancel := finishCtx(r)
	defer cancel()
	ref := attemptRef{Key: req.Key, Fence: req.Fence, AttemptID: req.AttemptID}
	s.finished(w, r, c, finishOp(req.Outcome), req.Outcome, ref, s.store.Finish(ctx, req), recorded)
}

// finishOp names the call that ends an attempt with outcome.
func finishOp(outcome store.Outcome) string {
	switch outcome {
	case store.OutcomeCompleted:
		return "complete"
	case store.OutcomeFailed:
		return "fail"
	case store.OutcomeReleased:
		return "release"
	}
	return "abandon"
}

func (s *server) release(w http.ResponseWriter, r *http.Request, c *call) {
	var b reasonBody
	if !s.attemptCall(w, r, c, &b, &b.attemptRef) {
		return
	}
	s.endAttempt(w, r, c, store.FinishRequest{Key: b.Key, Fence: b.Fence, AttemptID: b.AttemptID, Outcome: store.OutcomeReleased, Reason: b.Reason},
		func(_ *idem.Record, e store.JournalEntry) bool { return e.Reason == b.Reason })
}

func (s *server) fail(w http.ResponseWriter, r *http.Request, c *call) {
	var b failBody
	if !s.attemptCall(w, r, c, &b, &b.attemptRef) {
		return
	}
	if strings.TrimSpace(b.Reason) == "" {
		s.problem(w, c, http.StatusBadRequest, "invalid-reason", "fail needs the permanent error as reason: duplicates get it", nil)
		return
	}
	retention, ok := s.retention(w, c, b.Retention, 0)
	if !ok {
		return
	}
	s.endAttempt(w, r, c, store.FinishRequest{Key: b.Key, Fence: b.Fence, AttemptID: b.AttemptID, Outcome: store.OutcomeFailed, Reason: b.Reason, Retention: retention},
		func(rec *idem.Record, _ store.JournalEntry) bool {
			return rec.Status == idem.StatusFailed && rec.Reason == b.Reason
		})
}

// abandon ends the attempt's lease without an outcome. The store abandons
// an attempt once: of two abandons of one attempt (a retry after a lost
// answer, two callers), one gets 200 and the other 409 lease-lost, whose
// record_status says what the key holds (in_progress: abandoned, the
// key's policy decides).
func (s *server) abandon(w http.ResponseWriter, r *http.Request, c *call) {
	var b reasonBody
	if !s.attemptCall(w, r, c, &b, &b.attemptRef) {
		return
	}
	s.endAttempt(w, r, c, store.FinishRequest{Key: b.Key, Fence: b.Fence, AttemptID: b.AttemptID, Outcome: store.OutcomeAbandoned, Reason: b.Reason}, nil)
}

func (s *server) extend(w http.ResponseWriter, r *http.Request, c *call) {
	var b extendBody
	if !s.attemptCall(w, r, c, &b, &b.attemptRef) {
		return
	}
	lease, ok := s.lease(w, c, b.Lease)
	if !ok {
		return
	}
	// The record is read first, because the stores push a record's expiry
	// out to the new lease's end. A lease that ran to the record's
	// retention would let the record expire as it lapses after a crash: an
	// at_most_once key would then be claimed afresh, not answered
	// indeterminate.
	rec, err := s.store.Get(r.Context(), b.Key)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		s.storeFailed(w, c, "get", err)
		return
	}
	if err == nil && rec.Status == idem.StatusInProgress && rec.Fence == b.Fence && rec.AttemptID == b.AttemptID {
		c.attempt = rec.Attempt
		now, err := s.store.Now(r.Context())
		if err != nil {
			s.storeFailed(w, c, "now", err)
			return
		}
		if limit := rec.ExpiresAt.Add(-minRetention); now.Add(lease).After(limit) {
			why := fmt.Sprintf("lease: %v would end less than %v before the record's retention ends (%s): an attempt's lease must end well before its record may be swept, or after a crash the key is claimed afresh, as a new operation (an at_most_once key is not answered indeterminate). ",
				lease, minRetention, stamp3339(rec.ExpiresAt))
			if room := limit.Sub(now).Truncate(time.Second); limit.After(rec.LeaseUntil) && room >= minLease {
				why += fmt.Sprintf("Extend by at most %v, or claim with a retention longer than the work plus %v.", room, minRetention)
			} else {
				// A shorter extension would only move the lease's end
				// earlier: say there is no room instead.
				why += fmt.Sprintf("The retention leaves no room to extend this attempt, whose lease ends at %s: finish by then, or claim with a retention longer than the work plus %v.",
					stamp3339(rec.LeaseUntil), minRetention)
			}
			s.problem(w, c, http.StatusBadRequest, "invalid-duration", why, nil)
			return
		}
	}
	until, err := s.store.Extend(r.Context(), store.ExtendRequest{Key: b.Key, Fence: b.Fence, AttemptID: b.AttemptID, Lease: lease})
	if err == nil {
		c.outcome = "extended"
		s.reply(w, c, map[string]any{"outcome": "extended", "key": b.Key, "fence": b.Fence, "lease_until": stamp3339(until)})
		return
	}
	s.finished(w, r, c, "extend", "extended", b.attemptRef, err, nil)
}

// recordNow reads key's record and the store's clock for GET
// /v1/records/{key} and its story. It answers the request itself (a bad
// key, 404 with notFound's members, a store failure) and reports false
// when it did.
func (s *server) recordNow(w http.ResponseWriter, r *http.Request, c *call, key string, notFound map[string]any) (idem.Record, time.Time, bool) {
	if !s.checkKey(w, c, key) {
		return idem.Record{}, time.Time{}, false
	}
	rec, err := s.store.Get(r.Context(), key)
	if errors.Is(err, store.ErrNotFound) {
		s.problem(w, c, http.StatusNotFound, "not-found", "No record for the key (never claimed, or expired or swept after its retention).", notFound)
		return idem.Record{}, time.Time{}, false
	}
	if err != nil {
		s.storeFailed(w, c, "get", err)
		return idem.Record{}, time.Time{}, false
	}
	now, err := s.store.Now(r.Context())
	if err != nil {
		s.storeFailed(w, c, "now", err)
		return idem.Record{}, time.Time{}, false
	}
	return rec, now, true
}

func (s *server) record(w http.ResponseWriter, r *http.Request, c *call, key string) {
	rec, now, ok := s.recordNow(w, r, c, key, map[string]any{"key": key})
	if !ok {
		return
	}
	c.outcome, c.fence, c.attempt = "record", rec.Fence, rec.Attempt
	c.extra = append(c.extra, slog.String("record_status", string(rec.Status)))
	s.reply(w, c, toJSON(&rec, now, true))
}

func (s *server) health(w http.ResponseWriter, r *http.Request, c *call) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	// A read, not just the clock: a store's Now may not touch its data
	// (SQLite's does not).
	if _, err := s.store.Get(ctx, healthKey); err != nil && !errors.Is(err, store.ErrNotFound) {
		c.extra = append(c.extra, slog.String("op", "get"), slog.Any("error", err))
		c.outcome = "store-error"
		w.Header().Set("Retry-After", problem.RetryAfter(storeRetryAfter))
		s.problem(w, c, http.StatusServiceUnavailable, "store-unavailable", "The store did not answer a read.", nil)
		return
	}
	now, err := s.store.Now(ctx)
	if err != nil {
		s.storeFailed(w, c, "now", err)
		return
	}
	c.outcome = "ok"
	s.reply(w, c, map[string]any{"status": "ok", "store_time": stamp3339(now)})
}
