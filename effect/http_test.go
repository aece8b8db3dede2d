package effect_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/effect"
)

// provider is an httptest server that records each request's key header
// and body, and answers with status (and Retry-After, if set).
type provider struct {
	*httptest.Server
	mu     sync.Mutex
	keys   []string
	bodies []string
}

func newProvider(t *testing.T, status int, retryAfter string) *provider {
	p := &provider{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		p.mu.Lock()
		p.keys = append(p.keys, r.Header.Get("Idempotency-Key"))
		p.bodies = append(p.bodies, string(b))
		p.mu.Unlock()
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(status)
		io.WriteString(w, `{"id":"ch_1"}`)
	}))
	t.Cleanup(p.Close)
	return p
}

// seen returns the keys and bodies the provider got.
func (p *provider) seen() ([]string, []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.keys...), append([]string(nil), p.bodies...)
}

func post(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(`{"amount":1250}`))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

var plain = class{}

// A 2xx is success; the key goes as an sf-string by default, bare with
// BareKey; the same req can be sent again, body and all.
func TestHTTPSuccessAndKeyHeader(t *testing.T) {
	p := newProvider(t, http.StatusOK, "")
	req := post(t, p.URL)
	for _, h := range []*effect.HTTP{{}, {BareKey: true}} {
		resp, err := h.Do(context.Background(), "receipt:8891:7", req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != `{"id":"ch_1"}` {
			t.Fatalf("body %q", b)
		}
	}
	keys, bodies := p.seen()
	if strings.Join(keys, " ") != `"receipt:8891:7" receipt:8891:7` {
		t.Fatalf("keys sent %q", keys)
	}
	if bodies[0] != `{"amount":1250}` || bodies[1] != bodies[0] {
		t.Fatalf("bodies %q: the second send lost the body", bodies)
	}
	if req.Header.Get("Idempotency-Key") != "" {
		t.Fatal("Do changed the caller's request")
	}
	// Another header name, and a key with a quote and a backslash.
	got := make(chan string, 1)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Header.Get("X-Request-Id") }))
	defer s.Close()
	resp, err := (&effect.HTTP{Header: "X-Request-Id"}).Do(context.Background(), `a"b\c`, post(t, s.URL))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if v := <-got; v != `"a\"b\\c"` {
		t.Fatalf("X-Request-Id %q", v)
	}
}

// 408, 409, 425, 429 and 5xx: retry later (a plain error, with the
// server's Retry-After); other 4xx: permanent.
func TestHTTPStatusClasses(t *testing.T) {
	date := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	for _, tc := range []struct {
		status     int
		retryAfter string
		want       class
		wait       time.Duration // 0: none; -1: about 90 s
	}{
		{408, "", plain, 0},
		{409, "1", plain, time.Second},
		{425, "", plain, 0},
		{429, "7", plain, 7 * time.Second},
		{500, "", plain, 0},
		{503, date, plain, -1},
		{400, "", class{permanent: true}, 0},
		{422, "", class{permanent: true}, 0},
		{404, "", class{permanent: true}, 0},
	} {
		p := newProvider(t, tc.status, tc.retryAfter)
		resp, err := (&effect.HTTP{}).Do(context.Background(), "k", post(t, p.URL))
		if resp != nil {
			t.Fatalf("%d: a response with the error", tc.status)
		}
		if err == nil || classify(err) != tc.want {
			t.Fatalf("%d: error %v is %+v, want %+v", tc.status, err, classify(err), tc.want)
		}
		var se *effect.StatusError
		if !errors.As(err, &se) || se.StatusCode != tc.status || string(se.Body) != `{"id":"ch_1"}` {
			t.Fatalf("%d: %v is not a StatusError with the body", tc.status, err)
		}
		if se.Temporary() != (tc.want == plain) {
			t.Fatalf("%d: Temporary() = %v", tc.status, se.Temporary())
		}
		switch {
		case tc.wait > 0 && se.RetryAfter != tc.wait:
			t.Fatalf("%d: RetryAfter %v, want %v", tc.status, se.RetryAfter, tc.wait)
		case tc.wait < 0 && (se.RetryAfter < 80*time.Second || se.RetryAfter > 91*time.Second):
			t.Fatalf("%d: RetryAfter %v from an HTTP-date 90 s ahead", tc.status, se.RetryAfter)
		}
	}
}

// Nothing listens: the request was never written, so nothing happened.
func TestHTTPRefusedIsNotDone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String() + "/charges"
	ln.Close()
	_, err = (&effect.HTTP{}).Do(context.Background(), "k", post(t, url))
	wantClass(t, err, notDone)
}

// The server reads the whole request and closes the connection without
// answering: it may have acted, so the outcome is unknown (not NotDone).
func TestHTTPAnswerLostIsUnknown(t *testing.T) {
	var mu sync.Mutex
	got := 0
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		mu.Lock()
		got++
		mu.Unlock()
		c, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			c.Close()
		}
	}))
	defer s.Close()
	_, err := (&effect.HTTP{}).Do(context.Background(), "k", post(t, s.URL))
	wantClass(t, err, ambiguous)
	mu.Lock()
	defer mu.Unlock()
	if got == 0 {
		t.Fatal("the server never got the request")
	}
}

// ctx ends while the server holds the answer back: unknown, promptly, and
// matching context.Canceled. A ctx that ended before the call: NotDone.
func TestHTTPContextCancelled(t *testing.T) {
	release := make(chan struct{})
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer s.Close()
	defer close(release)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := (&effect.HTTP{}).Do(ctx, "k", post(t, s.URL))
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Do returned %v after the cancel", d)
	}
	wantClass(t, err, ambiguous)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %q does not match context.Canceled", err)
	}
	_, err = (&effect.HTTP{}).Do(ctx, "k", post(t, s.URL))
	wantClass(t, err, notDone)
}

// A body that cannot be sent again, or a key the header cannot carry:
// nothing is sent; NotDone and Permanent.
func TestHTTPInvalid(t *testing.T) {
	p := newProvider(t, http.StatusOK, "")
	req, _ := http.NewRequest("POST", p.URL, io.NopCloser(strings.NewReader("x")))
	_, err := (&effect.HTTP{}).Do(context.Background(), "k", req)
	if !errors.Is(err, effect.ErrInvalid) || classify(err) != rejected {
		t.Fatalf("a body without GetBody: %v", err)
	}
	for _, tc := range []struct {
		h   *effect.HTTP
		key string
	}{{&effect.HTTP{}, "clé"}, {&effect.HTTP{}, ""}, {&effect.HTTP{}, "a\nb"}, {&effect.HTTP{BareKey: true}, "a b"}} {
		_, err := tc.h.Do(context.Background(), tc.key, post(t, p.URL))
		if !errors.Is(err, effect.ErrInvalid) || classify(err) != rejected {
			t.Fatalf("key %q: %v", tc.key, err)
		}
	}
	if keys, _ := p.seen(); len(keys) != 0 {
		t.Fatalf("invalid calls reached the server: %q", keys)
	}
}

// A 301, 302 or 303 to a POST would be followed as a GET without the body
// (net/http does so), and the GET's 2xx taken for the POST's: the redirect
// is not followed and comes back as a Permanent *StatusError; the POST
// never reached its new location, nor did a GET.
func TestHTTPRedirectChangingMethodIsNotFollowed(t *testing.T) {
	for _, code := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther} {
		var mu sync.Mutex
		var moved []string
		mux := http.NewServeMux()
		mux.HandleFunc("/v1/charges", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/v2/charges", code)
		})
		mux.HandleFunc("/v2/charges", func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			moved = append(moved, r.Method)
			mu.Unlock()
			io.WriteString(w, `{"data":[]}`) // a list endpoint answers a GET
		})
		s := httptest.NewServer(mux)
		resp, err := (&effect.HTTP{}).Do(context.Background(), "charge:1", post(t, s.URL+"/v1/charges"))
		s.Close()
		if resp != nil {
			resp.Body.Close()
		}
		if err == nil || classify(err) != (class{permanent: true}) {
			t.Fatalf("%d: error %v is %+v, want Permanent", code, err, classify(err))
		}
		var se *effect.StatusError
		if !errors.As(err, &se) || se.StatusCode != code {
			t.Fatalf("%d: %v is not a StatusError %d", code, err, code)
		}
		if len(moved) != 0 {
			t.Fatalf("%d: the redirect was followed with %q", code, moved)
		}
	}
}

// 307 and 308 keep the method and the body: followed as the Client's
// CheckRedirect (net/http's default when nil) allows; a caller's policy
// is still asked.
func TestHTTPRedirectKeepingMethodIsFollowed(t *testing.T) {
	for _, code := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		p := newProvider(t, http.StatusOK, "")
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, p.URL+"/v2/charges", code)
		}))
		resp, err := (&effect.HTTP{}).Do(context.Background(), "charge:1", post(t, s.URL))
		if err != nil {
			t.Fatalf("%d: %v", code, err)
		}
		resp.Body.Close()
		keys, bodies := p.seen()
		if len(keys) != 1 || keys[0] != `"charge:1"` || bodies[0] != `{"amount":1250}` {
			t.Fatalf("%d: the new location got keys %q, bodies %q", code, keys, bodies)
		}

		asked := 0
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { asked++; return http.ErrUseLastResponse }}
		_, err = (&effect.HTTP{Client: client}).Do(context.Background(), "charge:1", post(t, s.URL))
		var se *effect.StatusError
		if asked != 1 || !errors.As(err, &se) || se.StatusCode != code || classify(err) != (class{permanent: true}) {
			t.Fatalf("%d: the caller's policy, asked %d times, refused: %v (%+v)", code, asked, err, classify(err))
		}
		// A policy that refuses with an error: the 3xx was the answer.
		stop := errors.New("no redirects")
		client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return stop }}
		_, err = (&effect.HTTP{Client: client}).Do(context.Background(), "charge:1", post(t, s.URL))
		if !errors.As(err, &se) || se.StatusCode != code || !errors.Is(err, stop) || classify(err) != (class{permanent: true}) {
			t.Fatalf("%d: the caller's policy failed the redirect: %v (%+v)", code, err, classify(err))
		}
		s.Close()
	}
}

// A 307 answered by the first hop, then a new location that refuses the
// connection: the first hop did nothing (it answered with a redirect),
// the second got nothing, so the call is NotDone.
func TestHTTPRedirectToUnreachableIsNotDone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + ln.Addr().String() + "/v2/charges"
	ln.Close()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		http.Redirect(w, r, gone, http.StatusTemporaryRedirect)
	}))
	defer s.Close()
	_, err = (&effect.HTTP{}).Do(context.Background(), "charge:1", post(t, s.URL))
	wantClass(t, err, notDone)
}

// bigPost is a POST whose body takes a while to write: more than the
// socket buffers hold, so a server that does not read it stalls it.
func bigPost(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest("POST", url, bytes.NewReader(bytes.Repeat([]byte("x"), 8<<20)))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// A server has the request once it has its headers, and may act on them
// (the amount is in the URL) before it reads the body. It reads the
// headers, acts, and resets the connection while the body is still
// being written: the outcome is unknown, not NotDone.
func TestHTTPActedOnHeadersIsUnknown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acted := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		req, err := http.ReadRequest(bufio.NewReader(c)) // the headers only
		if err == nil {
			acted <- req.URL.RawQuery
		}
		c.(*net.TCPConn).SetLinger(0) // the provider crashes: RST, no answer
		c.Close()
	}()
	_, err = (&effect.HTTP{}).Do(context.Background(), "charge:3", bigPost(t, "http://"+ln.Addr().String()+"/v1/charges?amount=1250"))
	select {
	case <-acted:
	case <-time.After(5 * time.Second):
		t.Fatal("the server never had the request's headers")
	}
	wantClass(t, err, ambiguous)
}

// The server acts on the headers and holds the body back; ctx's deadline
// passes while the body is being written: unknown, not NotDone.
func TestHTTPDeadlineWhileBodyStreamsIsUnknown(t *testing.T) {
	acted := make(chan struct{}, 1)
	release := make(chan struct{})
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		acted <- struct{}{} // an upload endpoint that creates the object first
		<-release
	}))
	defer s.Close()
	defer close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := (&effect.HTTP{}).Do(ctx, "upload:1", bigPost(t, s.URL+"/v1/files"))
	select {
	case <-acted:
	default:
		t.Fatal("the server never had the request")
	}
	wantClass(t, err, ambiguous)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %q does not match context.DeadlineExceeded", err)
	}
}

// net/http sends a request again on a new connection when the kept-alive
// one it used turns out closed (it does for a request with an
// Idempotency-Key). Here the server read the whole request on the old
// connection before closing it, and the new connection is refused: the
// server may have acted, so the outcome is unknown, not NotDone.
func TestHTTPResentOnNewConnectionIsUnknown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	read := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		for i := 0; i < 2; i++ {
			req, err := http.ReadRequest(r)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			if i == 0 {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
			}
		}
		ln.Close() // the new connection is refused
		close(read)
	}()
	h := &effect.HTTP{Client: &http.Client{Transport: &http.Transport{}}}
	url := "http://" + ln.Addr().String() + "/v1/charges"
	resp, err := h.Do(context.Background(), "charge:4", post(t, url))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_, err = h.Do(context.Background(), "charge:5", post(t, url))
	<-read
	t.Logf("%v", err)
	wantClass(t, err, ambiguous)
}
