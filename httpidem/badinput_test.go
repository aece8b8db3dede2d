package httpidem_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/store/memstore"
)

// TestMalformedKeys: every malformed Idempotency-Key gets 400 key-invalid
// before the store is touched, with a detail that does not repeat the key;
// well-formed keys with parameters or at the length limit run.
func TestMalformedKeys(t *testing.T) {
	fs := idemtest.NewFaultStore(memstore.New())
	var h counter
	l := ledger(fs)
	lenient := serve(t, l, &h)
	strict := serve(t, l, &h, httpidem.WithBareKeys(false))
	uuidOnly := serve(t, l, &h, httpidem.WithKeyValidator(func(k string) error {
		if len(k) != 36 {
			return errors.New("not a UUID: internal rule 7")
		}
		return nil
	}))
	// A server that allows longer keys still stops at what the ledger
	// indexes (idem.MaxKeyLen, 1024 bytes), before the store.
	huge := serve(t, l, &h, httpidem.WithMaxKeyLen(4096))
	long := strings.Repeat("k", 256)
	bad := []struct {
		name, url, value string
	}{
		{"unterminated string", lenient.URL, `"abc`},
		{"list of two strings", lenient.URL, `"a", "b"`},
		{"junk after the item", lenient.URL, `"abc" def`},
		{"bad escape", lenient.URL, `"a\qb"`},
		{"escape at the end", lenient.URL, `"a\`},
		{"parameter without key", lenient.URL, `"abc";`},
		{"upper-case parameter key", lenient.URL, `"abc";K=1`},
		{"parameter without value", lenient.URL, `"abc";k=`},
		{"bad boolean parameter", lenient.URL, `"abc";k=?2`},
		{"bad byte sequence parameter", lenient.URL, `"abc";k=:not base64!:`},
		{"integer too long", lenient.URL, `"abc";k=1234567890123456`},
		{"empty string", lenient.URL, `""`},
		{"empty field", lenient.URL, ``},
		{"only spaces", lenient.URL, `   `},
		{"UTF-8 in a string", lenient.URL, `"clé"`},
		{"UTF-8 bare", lenient.URL, `clé`},
		{"not UTF-8 in a string", lenient.URL, "\"\xff\xfe\""},
		{"not UTF-8 bare", lenient.URL, "\xff\xfe"},
		{"bare with a space", lenient.URL, `abc def`},
		{"bare list", lenient.URL, `abc,def`},
		{"bare with parameters", lenient.URL, `abc;x=1`},
		{"bare with a quote", lenient.URL, `ab"c`},
		{"bare with a backslash", lenient.URL, `ab\c`},
		{"over 255 bytes, quoted", lenient.URL, `"` + long + `"`},
		{"over 255 bytes, bare", lenient.URL, long},
		{"bare on a strict route", strict.URL, `abc-123`},
		{"token on a strict route", strict.URL, `abc`},
		{"integer on a strict route", strict.URL, `123`},
		{"refused by the validator", uuidOnly.URL, `"short"`},
		{"over the ledger's key limit", huge.URL, `"` + strings.Repeat("k", 2000) + `"`},
	}
	for _, c := range bad {
		r := do(t, http.MethodPost, c.url, []string{c.value}, "x")
		if r.err != nil {
			t.Fatalf("%s: %v", c.name, r.err)
		}
		if r.status != http.StatusBadRequest || r.problemType(t) != httpidem.ProblemKeyInvalid {
			t.Errorf("%s: %d %q, want 400 key-invalid", c.name, r.status, r.body)
			continue
		}
		if len(c.value) > 2 && strings.Contains(r.body, strings.Trim(c.value, `"`)) {
			t.Errorf("%s: the problem repeats the key: %s", c.name, r.body)
		}
		if strings.Contains(r.body, "rule 7") {
			t.Errorf("%s: the validator's error reached the client: %s", c.name, r.body)
		}
	}
	if n := fs.TotalCalls(); n != 0 || h.n.Load() != 0 {
		t.Fatalf("malformed keys reached the store (%d calls) or the handler (%d runs)", n, h.n.Load())
	}
	good := []struct{ name, url, value string }{
		{"255 bytes", lenient.URL, `"` + long[:254] + `x"`},
		{"parameters of every type", lenient.URL, `"` + newKey() + `";a=1;b=-2.5;c="s\"q";d=tok/en:x;e=:aGVsbG8=:;f=?1;g;h=@1700000000;i=%"caf%c3%a9"`},
		{"spaces around", lenient.URL, `  "` + newKey() + `"  `},
		{"escapes", strict.URL, `"` + newKey() + `\"\\"`},
		{"UUID", uuidOnly.URL, `"8e03978e-40d5-43e8-bc93-6894a57f9324"`},
	}
	for _, c := range good {
		if r := do(t, http.MethodPost, c.url, []string{c.value}, "x"); r.status != http.StatusCreated {
			t.Errorf("%s: %d %q, want 201", c.name, r.status, r.body)
		}
	}
}

// TestDuplicatedHeaders: a key on several field lines is refused, even when
// the lines agree: the draft allows exactly one.
func TestDuplicatedHeaders(t *testing.T) {
	var h counter
	srv := serve(t, ledger(newMem()), &h)
	k := quoted(newKey())
	for _, lines := range [][]string{{k, k}, {k, quoted(newKey())}, {k, ""}} {
		r := do(t, http.MethodPost, srv.URL, lines, "x")
		if r.status != http.StatusBadRequest || r.problemType(t) != httpidem.ProblemKeyInvalid {
			t.Errorf("%d field lines: %d %q", len(lines), r.status, r.body)
		}
	}
	if h.n.Load() != 0 {
		t.Fatalf("handler ran %d times", h.n.Load())
	}
}

// TestOversizedBody: a body over WithMaxBody gets 413 body-too-large, with
// or without a Content-Length, before the key is claimed: the same key then
// works with a smaller body.
func TestOversizedBody(t *testing.T) {
	fs := idemtest.NewFaultStore(memstore.New())
	var h counter
	srv := serve(t, ledger(fs), &h, httpidem.WithMaxBody(1000))
	key := newKey()
	for _, chunked := range []bool{false, true} {
		var body io.Reader = strings.NewReader(strings.Repeat("b", 1001))
		if chunked {
			body = io.MultiReader(body) // hides the length: sent chunked
		}
		req, _ := http.NewRequest(http.MethodPost, srv.URL, body)
		req.Header.Set(httpidem.HeaderKey, quoted(key))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		r := reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
		if r.status != http.StatusRequestEntityTooLarge || r.problemType(t) != httpidem.ProblemBodyTooLarge {
			t.Fatalf("chunked=%v: %d %q", chunked, r.status, r.body)
		}
	}
	if fs.Calls(idemtest.OpClaim) != 0 || h.n.Load() != 0 {
		t.Fatalf("an oversized body was claimed (%d) or handled (%d)", fs.Calls(idemtest.OpClaim), h.n.Load())
	}
	if r := post(t, srv.URL, key, strings.Repeat("b", 1000)); r.status != http.StatusCreated || h.n.Load() != 1 {
		t.Fatalf("body at the limit: %d", r.status)
	}
}

// TestSlowBody: a client that sends its headers and then dribbles (or
// stops sending) its body is cut off by the server's ReadTimeout, or by
// WithBodyTimeout, before the key is claimed: the handler never runs and
// the store never sees the key.
func TestSlowBody(t *testing.T) {
	for _, viaOption := range []bool{false, true} {
		fs := idemtest.NewFaultStore(memstore.New())
		var h counter
		m := httpidem.New(ledger(fs), httpidem.WithLogger(quiet()))
		if viaOption {
			m = httpidem.New(ledger(fs), httpidem.WithLogger(quiet()), httpidem.WithBodyTimeout(200*time.Millisecond))
		}
		srv := httptest.NewUnstartedServer(m.Handler(&h))
		if !viaOption {
			srv.Config.ReadTimeout = 200 * time.Millisecond
		}
		srv.Start()
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(conn, "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"slow\"\r\nContent-Length: 100\r\n\r\nonly a part")
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		switch {
		case err == nil:
			if resp.StatusCode != http.StatusRequestTimeout {
				t.Errorf("option=%v: slow body got %d, want 408 (or a closed connection)", viaOption, resp.StatusCode)
			}
			resp.Body.Close()
		case viaOption:
			t.Errorf("WithBodyTimeout: no 408 problem: %v", err)
		}
		conn.Close()
		srv.Close()
		if fs.Calls(idemtest.OpClaim) != 0 || h.n.Load() != 0 {
			t.Fatalf("option=%v: slow body was claimed (%d) or handled (%d)", viaOption, fs.Calls(idemtest.OpClaim), h.n.Load())
		}
	}
}

// clock is a store clock the test moves forward.
type clock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return time.Now().Add(c.off) }
func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.off += d
}

// TestStoreFailures: a store that fails during a request. A failed claim
// never runs the handler and never answers 2xx (503 store-unavailable with
// Retry-After); a claim the store took but whose answer was lost is undone,
// so the retry runs the handler at once. A store that fails after the
// handler ran (complete, or the release of a 5xx) is retried until it
// answers: one failure changes nothing a client sees. A store that stays
// down for the whole finishing window leaves the client with the handler's
// own response and the key to its lease; a retry then runs the handler
// again (at least once).
func TestStoreFailures(t *testing.T) {
	boom := errors.New("store unreachable: 10.0.0.7:5432 password=hunter2")
	t.Run("claim", func(t *testing.T) {
		for _, after := range []bool{false, true} {
			fs := idemtest.NewFaultStore(memstore.New())
			var h counter
			srv := serve(t, ledger(fs), &h)
			key := newKey()
			fs.Inject(idemtest.OpClaim, idemtest.Fault{Err: boom, After: after, Times: 1})
			r := post(t, srv.URL, key, "x")
			if r.status != http.StatusServiceUnavailable || r.problemType(t) != httpidem.ProblemStoreUnavailable || r.header.Get("Retry-After") != "1" {
				t.Fatalf("after=%v: failed claim got %d Retry-After %q %q", after, r.status, r.header.Get("Retry-After"), r.body)
			}
			if strings.Contains(r.body, "hunter2") || strings.Contains(r.body, "10.0.0.7") {
				t.Fatalf("the store's error reached the client: %s", r.body)
			}
			// A claim written but whose answer was lost was undone before
			// the 503: the retry is not refused as busy.
			if r = post(t, srv.URL, key, "x"); r.status != http.StatusCreated || h.n.Load() != 1 {
				t.Fatalf("after=%v: retry after the store healed: %d, runs %d", after, r.status, h.n.Load())
			}
		}
	})
	for _, c := range []struct {
		op     idemtest.Op
		status int
	}{{idemtest.OpComplete, http.StatusCreated}, {idemtest.OpRelease, http.StatusInternalServerError}} {
		t.Run(string(c.op)+"/once", func(t *testing.T) {
			t.Parallel()
			fs := idemtest.NewFaultStore(memstore.New())
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(c.status)
				_, _ = io.WriteString(w, "run "+itoa(runs.Add(1)))
			})
			srv := serve(t, ledger(fs, idem.WithLease(10*time.Second)), h)
			key := newKey()
			fs.Inject(c.op, idemtest.Fault{Err: boom, Times: 1})
			if r := post(t, srv.URL, key, "x"); r.status != c.status || r.body != "run 1" {
				t.Fatalf("the handler's response: %d %q, want %d run 1", r.status, r.body, c.status)
			}
			if n := fs.Calls(c.op); n != 2 {
				t.Fatalf("%s called %d times, want 2 (the failure and its retry)", c.op, n)
			}
			r := post(t, srv.URL, key, "x")
			switch c.op {
			case idemtest.OpComplete: // recorded on retry: replayed
				if r.status != c.status || r.body != "run 1" || !r.replayed() || runs.Load() != 1 {
					t.Fatalf("retry after a completion retried: %d %q replayed=%v, runs %d", r.status, r.body, r.replayed(), runs.Load())
				}
			default: // released on retry: runs again at once
				if r.status != c.status || r.body != "run 2" || r.replayed() {
					t.Fatalf("retry after a release retried: %d %q", r.status, r.body)
				}
			}
		})
		t.Run(string(c.op)+"/down", func(t *testing.T) {
			t.Parallel()
			var clk clock
			fs := idemtest.NewFaultStore(memstore.New(memstore.WithClock(clk.now)))
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(c.status)
				_, _ = io.WriteString(w, "run "+itoa(runs.Add(1)))
			})
			l := ledger(fs, idem.WithLease(time.Second))
			srv := serve(t, l, h)
			key := newKey()
			fs.Inject(c.op, idemtest.Fault{Err: boom}) // down until healed
			start := time.Now()
			if r := post(t, srv.URL, key, "x"); r.status != c.status || r.body != "run 1" {
				t.Fatalf("the handler's response: %d %q, want %d run 1", r.status, r.body, c.status)
			}
			if took := time.Since(start); took < l.FinishTimeout()/2 {
				t.Fatalf("gave up on the store after %v, want it retried for most of %v", took, l.FinishTimeout())
			}
			if n := fs.Calls(c.op); n < 3 {
				t.Fatalf("%s called %d times while the store was down, want it retried", c.op, n)
			}
			fs.Heal(c.op)
			clk.advance(2 * time.Second) // the lease the key was left to lapses
			if r := post(t, srv.URL, key, "x"); r.status != c.status || r.body != "run 2" || r.replayed() {
				t.Fatalf("retry after the lease lapsed: %d %q", r.status, r.body)
			}
		})
	}
}

// TestCorruptRecord: a stored result in the middleware's format (it begins
// with the format's version byte) that cannot be decoded is 500
// record-unreadable, never a reason to run the handler again.
func TestCorruptRecord(t *testing.T) {
	s := newMem()
	l := ledger(s)
	var h counter
	srv := serve(t, l, &h)
	for _, corrupt := range []string{"\x01", "\x01\x00", "\x01\x00\xc9\x01\x7f"} {
		key := newKey()
		if _, err := l.Do(context.Background(), idem.Key(httpidem.DefaultNamespace, key), func(context.Context) ([]byte, error) {
			return []byte(corrupt), nil
		}); err != nil {
			t.Fatal(err)
		}
		r := post(t, srv.URL, key, "x")
		if r.status != http.StatusInternalServerError || r.problemType(t) != httpidem.ProblemRecordUnreadable || h.n.Load() != 0 {
			t.Fatalf("corrupt record %q: %d %q, runs %d", corrupt, r.status, r.body, h.n.Load())
		}
	}
}

// TestAtMostOnce: under an AtMostOnce ledger, an unrecorded 5xx leaves the
// key indeterminate: retries get 500 outcome-unknown and the handler does
// not run again.
func TestAtMostOnce(t *testing.T) {
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusBadGateway)
	})
	srv := serve(t, ledger(newMem(), idem.WithPolicy(idem.AtMostOnce)), h)
	key := newKey()
	if r := post(t, srv.URL, key, "x"); r.status != http.StatusBadGateway {
		t.Fatalf("first: %d", r.status)
	}
	r := post(t, srv.URL, key, "x")
	if r.status != http.StatusInternalServerError || r.problemType(t) != httpidem.ProblemOutcomeUnknown || runs.Load() != 1 {
		t.Fatalf("retry: %d %q runs %d", r.status, r.body, runs.Load())
	}
}

// TestHeartbeatFails: the store stops answering while the handler runs, so
// the ledger cannot extend the lease. When the lease runs out the handler's
// context is cancelled (another server may take the key over); a handler
// that then gives up without answering gets 500 outcome-unknown, nothing is
// recorded, and the retry runs the handler again once the store is back.
func TestHeartbeatFails(t *testing.T) {
	fs := idemtest.NewFaultStore(memstore.New())
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			select {
			case <-r.Context().Done():
				if !errors.Is(context.Cause(r.Context()), idem.ErrLeaseLost) {
					t.Errorf("handler's context ended by %v, want ErrLeaseLost", context.Cause(r.Context()))
				}
				return
			case <-time.After(10 * time.Second):
				t.Error("the handler's context was not cancelled when its lease ran out")
			}
		}
		_, _ = io.WriteString(w, "done")
	})
	srv := serve(t, ledger(fs), h, httpidem.WithLease(300*time.Millisecond))
	key := newKey()
	fs.Inject(idemtest.OpExtend, idemtest.Fault{Err: errors.New("connection refused")})
	r := post(t, srv.URL, key, "x")
	if r.status != http.StatusInternalServerError || r.problemType(t) != httpidem.ProblemOutcomeUnknown {
		t.Fatalf("lease lost: %d %q", r.status, r.body)
	}
	fs.Heal(idemtest.OpExtend)
	if r := post(t, srv.URL, key, "x"); r.status != http.StatusOK || r.body != "done" || r.replayed() || runs.Load() != 2 {
		t.Fatalf("retry: %d %q replayed=%v runs=%d", r.status, r.body, r.replayed(), runs.Load())
	}
}

// TestHeartbeatFailsProblemDropsHandlerHeaders: a handler that set
// Content-Encoding: gzip and a Location, then gave up without writing when
// its lease was lost, did not answer: the 500 outcome-unknown the client
// gets carries none of its headers, so it can be read (a problem sent as
// "gzip" cannot), and points nowhere.
func TestHeartbeatFailsProblemDropsHandlerHeaders(t *testing.T) {
	fs := idemtest.NewFaultStore(memstore.New())
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Location", "/charges/1")
		w.Header().Set("Content-Length", "123")
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
			t.Error("the handler's context was not cancelled when its lease ran out")
		}
	})
	srv := serve(t, ledger(fs), h, httpidem.WithLease(300*time.Millisecond))
	fs.Inject(idemtest.OpExtend, idemtest.Fault{Err: errors.New("connection refused")})
	r := post(t, srv.URL, newKey(), "x") // fails the test if the answer cannot be read
	if r.status != http.StatusInternalServerError || r.problemType(t) != httpidem.ProblemOutcomeUnknown {
		t.Fatalf("lease lost: %d %q, want 500 outcome-unknown", r.status, r.body)
	}
	if r.header.Get("Location") != "" || r.header.Get("Content-Encoding") != "" {
		t.Fatalf("the problem carries the handler's headers: %v", r.header)
	}
	if r.header.Get(httpidem.HeaderRetention) == "" {
		t.Fatalf("the problem lost the middleware's own %s", httpidem.HeaderRetention)
	}
}

// TestHeartbeatFailsAfterEarlyHints: a 1xx is not the answer. A handler that
// sent 103 Early Hints and then gave up when its lease was lost did nothing,
// so the client gets 500 outcome-unknown, not net/http's implicit 200.
func TestHeartbeatFailsAfterEarlyHints(t *testing.T) {
	fs := idemtest.NewFaultStore(memstore.New())
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
			t.Error("the handler's context was not cancelled when its lease ran out")
		}
	})
	srv := serve(t, ledger(fs), h, httpidem.WithLease(300*time.Millisecond))
	fs.Inject(idemtest.OpExtend, idemtest.Fault{Err: errors.New("connection refused")})
	r := post(t, srv.URL, newKey(), "x")
	if r.status != http.StatusInternalServerError || r.problemType(t) != httpidem.ProblemOutcomeUnknown {
		t.Fatalf("lease lost after 103: %d %q, want 500 outcome-unknown", r.status, r.body)
	}
}
