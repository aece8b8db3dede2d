package httpidem_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

// TestLargeResponse: a response over WithMaxResponse reaches the client in
// full; the key is recorded anyway, so the retry does not run the handler:
// it gets the status and headers, an empty body, and
// Idempotency-Body-Omitted: true.
func TestLargeResponse(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store.Store) {
		var runs atomic.Int64
		big := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("ETag", `"v1"`)
			w.WriteHeader(http.StatusCreated)
			for i := 0; i < len(big); i += 1000 {
				_, _ = w.Write(big[i:min(i+1000, len(big))])
			}
		})
		srv := serve(t, ledger(s), h, httpidem.WithMaxResponse(10_000))
		key := newKey()
		first := post(t, srv.URL, key, "x")
		if first.status != http.StatusCreated || first.body != string(big) {
			t.Fatalf("first: %d, %d bytes, want 201 and %d bytes", first.status, len(first.body), len(big))
		}
		r := post(t, srv.URL, key, "x")
		if r.status != http.StatusCreated || r.body != "" || !r.replayed() || r.header.Get(httpidem.HeaderBodyOmitted) != "true" {
			t.Fatalf("retry: %d, %d bytes, replayed=%v omitted=%q", r.status, len(r.body), r.replayed(), r.header.Get(httpidem.HeaderBodyOmitted))
		}
		if r.header.Get("ETag") != `"v1"` || r.header.Get("Content-Type") != "application/octet-stream" {
			t.Errorf("retry lost the headers: %v", r.header)
		}
		if runs.Load() != 1 {
			t.Fatalf("handler ran %d times, want 1", runs.Load())
		}
		// A response exactly at the limit is kept whole.
		srv2 := serve(t, ledger(s), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(big[:10_000]) }), httpidem.WithMaxResponse(10_000))
		k2 := newKey()
		post(t, srv2.URL, k2, "x")
		if r := post(t, srv2.URL, k2, "x"); r.body != string(big[:10_000]) || r.header.Get(httpidem.HeaderBodyOmitted) != "" {
			t.Fatalf("response at the limit: replayed %d bytes, omitted=%q", len(r.body), r.header.Get(httpidem.HeaderBodyOmitted))
		}
	})
}

// TestStreaming: a streaming handler's flushes reach the client while it
// runs, through an http.Flusher type assertion and through
// http.ResponseController; the whole stream is replayed when it fits. An
// event stream is recorded without its body.
func TestStreaming(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store.Store) {
		for _, sse := range []bool{false, true} {
			next := make(chan struct{})
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				ct := "text/plain"
				if sse {
					ct = "text/event-stream"
				}
				w.Header().Set("Content-Type", ct)
				_, _ = io.WriteString(w, "data: one\n\n")
				w.(http.Flusher).Flush()
				<-next // the client read "one" before this returns
				_, _ = io.WriteString(w, "data: two\n\n")
				if err := http.NewResponseController(w).Flush(); err != nil {
					t.Errorf("ResponseController.Flush: %v", err)
				}
				<-next
				_, _ = io.WriteString(w, "data: three\n\n")
			})
			srv := serve(t, ledger(s), h)
			key := newKey()
			req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
			req.Header.Set(httpidem.HeaderKey, quoted(key))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(resp.Body)
			for _, want := range []string{"data: one\n", "\n", "data: two\n", "\n"} {
				line, err := br.ReadString('\n')
				if err != nil || line != want {
					t.Fatalf("streamed line %q, %v; want %q", line, err, want)
				}
				if want == "\n" {
					next <- struct{}{}
				}
			}
			rest, _ := io.ReadAll(br)
			resp.Body.Close()
			if string(rest) != "data: three\n\n" {
				t.Fatalf("stream tail %q", rest)
			}
			r := post(t, srv.URL, key, "x")
			want, omitted := "data: one\n\ndata: two\n\ndata: three\n\n", ""
			if sse {
				want, omitted = "", "true"
			}
			if !r.replayed() || r.body != want || r.header.Get(httpidem.HeaderBodyOmitted) != omitted || runs.Load() != 1 {
				t.Fatalf("sse=%v replay: %q omitted=%q replayed=%v runs=%d", sse, r.body, r.header.Get(httpidem.HeaderBodyOmitted), r.replayed(), runs.Load())
			}
		}
	})
}

// TestHijack: a handler that takes over the connection works through the
// middleware; its key is recorded as not replayable, so a retry gets 422
// response-not-kept and does not run the handler.
func TestHijack(t *testing.T) {
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("Hijack: %v", err)
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nraw ok")
		_ = brw.Flush()
	})
	s := newMem()
	srv := serve(t, ledger(s), h)
	key := newKey()
	if r := post(t, srv.URL, key, "x"); r.status != http.StatusOK || r.body != "raw ok" {
		t.Fatalf("hijacked: %d %q", r.status, r.body)
	}
	// The client has its answer before the handler returns and the key is
	// recorded.
	waitFor(t, "the hijacked request's record", func() bool {
		rec, err := s.Get(context.Background(), opKey(key))
		return err == nil && rec.Status == idem.StatusCompleted
	})
	r := post(t, srv.URL, key, "x")
	if r.status != http.StatusUnprocessableEntity || r.problemType(t) != httpidem.ProblemResponseNotKept || runs.Load() != 1 {
		t.Fatalf("retry of a hijacked request: %d %q runs=%d", r.status, r.body, runs.Load())
	}
}

// TestNoWrite: a handler that writes nothing sends net/http's empty 200, and
// that is what is replayed.
func TestNoWrite(t *testing.T) {
	var runs atomic.Int64
	srv := serve(t, ledger(newMem()), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1) }))
	key := newKey()
	for i := 0; i < 2; i++ {
		r := post(t, srv.URL, key, "x")
		if r.status != http.StatusOK || r.body != "" || r.replayed() != (i == 1) {
			t.Fatalf("request %d: %d %q replayed=%v", i, r.status, r.body, r.replayed())
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("runs %d", runs.Load())
	}
}

// TestEarlyHints: a 103 before the final status reaches the client and is
// not mistaken for the result: the replay is the final 201.
func TestEarlyHints(t *testing.T) {
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "made")
	})
	srv := serve(t, ledger(newMem()), h)
	key := newKey()
	var hints atomic.Int64
	send := func() reply {
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
				if code == http.StatusEarlyHints {
					hints.Add(1)
				}
				return nil
			},
		})
		r := doCtx(ctx, t, http.MethodPost, srv.URL, []string{quoted(key)}, "x")
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r
	}
	first, second := send(), send()
	if first.status != http.StatusCreated || hints.Load() != 1 {
		t.Fatalf("first: %d, %d early hints", first.status, hints.Load())
	}
	if second.status != http.StatusCreated || second.body != "made" || !second.replayed() || runs.Load() != 1 {
		t.Fatalf("replay: %d %q replayed=%v runs=%d", second.status, second.body, second.replayed(), runs.Load())
	}
}

// TestReplayContentEncoding: the stored body is replayed byte for byte, so
// the header that says how those bytes are encoded must come with it: a
// gzipped body replayed without Content-Encoding: gzip is garbage to the
// client.
func TestReplayContentEncoding(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = io.WriteString(zw, `{"ok":true}`)
	_ = zw.Close()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Vary", "Accept-Encoding")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(gz.Bytes())
	})
	srv := serve(t, ledger(newMem()), h)
	key := newKey()
	for i, want := range []bool{false, true} {
		// The default client asks for gzip and decodes it; a body it cannot
		// decode (or one it does not know to decode) shows in r.body.
		r := post(t, srv.URL, key, "x")
		if r.status != http.StatusCreated || r.body != `{"ok":true}` || r.replayed() != want {
			t.Fatalf("request %d: %d %q replayed=%v", i+1, r.status, r.body, r.replayed())
		}
	}
}

// brokenConn is a ResponseWriter whose client went away after room bytes.
type brokenConn struct {
	h    http.Header
	room int
}

func (b *brokenConn) Header() http.Header { return b.h }
func (b *brokenConn) WriteHeader(int)     {}
func (b *brokenConn) Write(p []byte) (int, error) {
	n := min(len(p), b.room)
	b.room -= n
	if n < len(p) {
		return n, errors.New("write: broken pipe")
	}
	return n, nil
}

// TestReplayAfterClientWentAway: the client's connection breaks in the
// middle of the response (the very case a client retries for), and the
// handler goes on writing. The replay must not pass the part the socket
// took for the whole body: it gives the body, or says it was omitted.
func TestReplayAfterClientWentAway(t *testing.T) {
	m := httpidem.New(ledger(memstore.New()), httpidem.WithLogger(quiet()))
	runs := 0
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.WriteHeader(http.StatusCreated)
		for _, chunk := range []string{"aaaa", "bbbb", "cccc"} {
			_, _ = io.WriteString(w, chunk) // handlers rarely check this error
		}
	}))
	req := func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader("{}"))
		r.Header.Set(httpidem.HeaderKey, `"k1"`)
		return r
	}
	h.ServeHTTP(&brokenConn{h: http.Header{}, room: 6}, req())
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req())
	omitted := rec.Header().Get(httpidem.HeaderBodyOmitted) == "true"
	if runs != 1 || rec.Code != http.StatusCreated || (rec.Body.String() != "aaaabbbbcccc" && !omitted) {
		t.Fatalf("after %d runs, replay: status %d, body %q, %s %v; want 201 and the whole body or none",
			runs, rec.Code, rec.Body, httpidem.HeaderBodyOmitted, omitted)
	}
}

// TestReplayHeaderSpelling: a header the handler sets by map assignment
// under its usual spelling ("ETag", not Go's "Etag") is replayed too.
func TestReplayHeaderSpelling(t *testing.T) {
	m := httpidem.New(ledger(memstore.New()), httpidem.WithLogger(quiet()))
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["ETag"] = []string{`"v1"`}
		w.WriteHeader(http.StatusCreated)
	}))
	req := func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/things", nil)
		r.Header.Set(httpidem.HeaderKey, `"k3"`)
		return r
	}
	first, again := httptest.NewRecorder(), httptest.NewRecorder()
	h.ServeHTTP(first, req())
	h.ServeHTTP(again, req())
	if again.Header().Get(httpidem.HeaderReplayed) != "true" || again.Header().Get("ETag") != `"v1"` {
		t.Fatalf("replay's headers %v; want ETag \"v1\"", again.Header())
	}
}

// TestReplayKeepsHeadersTheStatusNeeds: a replayed status keeps the headers
// that give it its meaning: Allow on a 405, WWW-Authenticate on a 401,
// Retry-After on a kept 503, Content-Disposition and Content-Range where
// the handler sent them.
func TestReplayKeepsHeadersTheStatusNeeds(t *testing.T) {
	for _, c := range []struct {
		status       int
		header, val  string
		storeServers bool
	}{
		{http.StatusMethodNotAllowed, "Allow", "GET, HEAD", false},
		{http.StatusUnauthorized, "WWW-Authenticate", `Bearer realm="api", error="invalid_token"`, false},
		{http.StatusServiceUnavailable, "Retry-After", "120", true},
		{http.StatusOK, "Content-Disposition", `attachment; filename="invoice.pdf"`, false},
		{http.StatusPartialContent, "Content-Range", "bytes 0-3/10", false},
	} {
		var runs atomic.Int64
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.Header().Set(c.header, c.val)
			w.WriteHeader(c.status)
			_, _ = io.WriteString(w, "body")
		})
		srv := serve(t, ledger(newMem()), h, httpidem.WithStoreServerErrors(c.storeServers))
		key := newKey()
		post(t, srv.URL, key, "x")
		r := post(t, srv.URL, key, "x")
		if r.status != c.status || !r.replayed() || runs.Load() != 1 {
			t.Fatalf("%d: replay %d replayed=%v runs=%d", c.status, r.status, r.replayed(), runs.Load())
		}
		if got := r.header.Get(c.header); got != c.val {
			t.Errorf("replayed %d: %s %q, want %q", c.status, c.header, got, c.val)
		}
	}
}
