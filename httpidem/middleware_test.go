package httpidem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/store"
)

// TestReplay: a retry with the same key gets the first response (status,
// allow-listed headers, body byte for byte) with Idempotent-Replayed: true,
// without running the handler; cookies and other headers are not replayed.
func TestReplay(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store.Store) {
		var h counter
		srv := serve(t, ledger(s), &h)
		key := newKey()
		first := post(t, srv.URL+"/things", key, `{"a":1}`, "Content-Type", "application/json")
		if first.status != http.StatusCreated || first.replayed() || first.header.Get("Set-Cookie") == "" {
			t.Fatalf("first: %d replayed=%v headers %v", first.status, first.replayed(), first.header)
		}
		if got := first.header.Get(httpidem.HeaderRetention); got != "86400" {
			t.Errorf("first: %s = %q, want 86400 (24 h advertised)", httpidem.HeaderRetention, got)
		}
		for i := 0; i < 2; i++ {
			again := post(t, srv.URL+"/things", key, `{"a":1}`, "Content-Type", "application/json")
			if again.status != http.StatusCreated || again.body != first.body || !again.replayed() {
				t.Fatalf("retry %d: %d %q replayed=%v, want 201 %q replayed", i, again.status, again.body, again.replayed(), first.body)
			}
			if again.header.Get("Location") != first.header.Get("Location") || again.header.Get("Content-Type") != "application/json" {
				t.Errorf("retry %d: Location %q Content-Type %q, want %q application/json", i, again.header.Get("Location"), again.header.Get("Content-Type"), first.header.Get("Location"))
			}
			if again.header.Get("Set-Cookie") != "" || again.header.Get("X-Run") != "" {
				t.Errorf("retry %d replayed headers that are not allow-listed: %v", i, again.header)
			}
			if again.header.Get(httpidem.HeaderRetention) != "86400" {
				t.Errorf("retry %d: no retention advertised", i)
			}
		}
		if n := h.n.Load(); n != 1 {
			t.Fatalf("handler ran %d times, want 1", n)
		}
		// Another key is another request.
		if r := post(t, srv.URL+"/things", newKey(), `{"a":1}`); r.replayed() || h.n.Load() != 2 {
			t.Fatalf("new key: replayed=%v runs=%d", r.replayed(), h.n.Load())
		}
	})
}

// TestNoKey: without a key an optional route passes every request through;
// a required route answers 400 key-missing and does not run the handler.
// Methods that are not protected ignore the key.
func TestNoKey(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store.Store) {
		var opt, req counter
		l := ledger(s)
		optional := serve(t, l, &opt)
		required := serve(t, l, &req, httpidem.WithRequired(true))
		for i := 0; i < 2; i++ {
			if r := post(t, optional.URL, "", "x"); r.status != http.StatusCreated || r.replayed() {
				t.Fatalf("optional, no key: %d replayed=%v", r.status, r.replayed())
			}
		}
		if opt.n.Load() != 2 {
			t.Fatalf("optional route ran %d times for 2 keyless requests", opt.n.Load())
		}
		r := post(t, required.URL, "", "x")
		if r.status != http.StatusBadRequest || r.problemType(t) != httpidem.ProblemKeyMissing || req.n.Load() != 0 {
			t.Fatalf("required, no key: %d %q, handler runs %d", r.status, r.body, req.n.Load())
		}
		// GET (not protected) with a key: runs every time, even on the
		// required route.
		key := quoted(newKey())
		for i := 0; i < 2; i++ {
			if r := do(t, http.MethodGet, required.URL, []string{key}, ""); r.status != http.StatusCreated || r.replayed() {
				t.Fatalf("GET with key: %d replayed=%v", r.status, r.replayed())
			}
		}
		if req.n.Load() != 2 {
			t.Fatalf("GET ran %d times, want 2", req.n.Load())
		}
	})
}

// TestMismatch: reusing a key with another method, path, query, content
// type or body is refused with 422 key-reused, never replayed; the same
// query in another order, or a bare key equal to the quoted one, is the
// same request.
func TestMismatch(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store.Store) {
		var h counter
		srv := serve(t, ledger(s), &h)
		key := newKey()
		first := post(t, srv.URL+"/orders?b=2&a=1", key, `{"n":1}`, "Content-Type", "application/json")
		if first.status != http.StatusCreated {
			t.Fatalf("first: %d", first.status)
		}
		same := []struct {
			name   string
			method string
			path   string
			key    string
			ct     string
		}{
			{"query reordered", http.MethodPost, "/orders?a=1&b=2", quoted(key), "application/json"},
			{"bare key", http.MethodPost, "/orders?b=2&a=1", key, "application/json"},
			{"content type case and spacing", http.MethodPost, "/orders?a=1&b=2", quoted(key), "Application/JSON"},
		}
		for _, c := range same {
			r := do(t, c.method, srv.URL+c.path, []string{c.key}, `{"n":1}`, "Content-Type", c.ct)
			if r.status != http.StatusCreated || !r.replayed() || r.body != first.body {
				t.Errorf("%s: %d replayed=%v, want the replay", c.name, r.status, r.replayed())
			}
		}
		differ := []struct {
			name, method, path, body, ct string
		}{
			{"body", http.MethodPost, "/orders?b=2&a=1", `{"n":2}`, "application/json"},
			{"path", http.MethodPost, "/other?b=2&a=1", `{"n":1}`, "application/json"},
			{"query", http.MethodPost, "/orders?b=3&a=1", `{"n":1}`, "application/json"},
			{"no query", http.MethodPost, "/orders", `{"n":1}`, "application/json"},
			{"content type", http.MethodPost, "/orders?b=2&a=1", `{"n":1}`, "text/plain"},
			{"method", http.MethodPatch, "/orders?b=2&a=1", `{"n":1}`, "application/json"},
		}
		for _, c := range differ {
			r := do(t, c.method, srv.URL+c.path, []string{quoted(key)}, c.body, "Content-Type", c.ct)
			if r.status != http.StatusUnprocessableEntity || r.problemType(t) != httpidem.ProblemKeyReused {
				t.Errorf("different %s: %d %q, want 422 key-reused", c.name, r.status, r.body)
			}
			if strings.Contains(r.body, key) {
				t.Errorf("different %s: the problem echoes the key", c.name)
			}
		}
		if h.n.Load() != 1 {
			t.Fatalf("handler ran %d times, want 1", h.n.Load())
		}
	})
}

// TestCanonicalJSON: with WithCanonicalJSON the same object with its keys
// in another order and other whitespace is the same request; without it, a
// mismatch.
func TestCanonicalJSON(t *testing.T) {
	var h counter
	l := ledger(newMem())
	canon := serve(t, l, &h, httpidem.WithCanonicalJSON(true), httpidem.WithNamespace("canon"))
	raw := serve(t, l, &h, httpidem.WithNamespace("raw"))
	for _, c := range []struct {
		srv  string
		want int
	}{{canon.URL, http.StatusCreated}, {raw.URL, http.StatusUnprocessableEntity}} {
		key := newKey()
		post(t, c.srv, key, `{"a":1,"b":[1,2.50]}`, "Content-Type", "application/json")
		r := post(t, c.srv, key, "{ \"b\": [1, 2.50],\n \"a\": 1 }", "Content-Type", "application/json")
		if r.status != c.want {
			t.Errorf("%s: reordered JSON got %d, want %d", c.srv, r.status, c.want)
		}
	}
}

// TestCanonicalJSONInvalidStrings: canonical JSON only forgets formatting.
// Two bodies whose strings differ in bytes that are not UTF-8 (or in lone
// surrogate escapes) are different requests, though encoding/json decodes
// both to U+FFFD: the second gets 422, not the first one's replay.
func TestCanonicalJSONInvalidStrings(t *testing.T) {
	var h counter
	srv := serve(t, ledger(newMem()), &h, httpidem.WithCanonicalJSON(true))
	for _, pair := range [][2]string{
		{"{\"note\":\"\xff\"}", "{\"note\":\"\xfe\"}"},
		{`{"note":"\ud800"}`, `{"note":"\udbff"}`},
		{"{\"\xff\":1}", "{\"\xfe\":1}"},
	} {
		key := newKey()
		if r := post(t, srv.URL, key, pair[0], "Content-Type", "application/json"); r.status != http.StatusCreated {
			t.Fatalf("%q: %d %q", pair[0], r.status, r.body)
		}
		if r := post(t, srv.URL, key, pair[1], "Content-Type", "application/json"); r.status != http.StatusUnprocessableEntity {
			t.Errorf("%q after %q under one key: %d (replayed=%v), want 422", pair[1], pair[0], r.status, r.replayed())
		}
	}
}

// TestCanonicalJSONDuplicateNames: a body with duplicate member names is
// not the same request as the body with only the last of them, though
// encoding/json keeps only the last: under one key, the second gets 422,
// not the first one's replay.
func TestCanonicalJSONDuplicateNames(t *testing.T) {
	var h counter
	srv := serve(t, ledger(newMem()), &h, httpidem.WithCanonicalJSON(true))
	for _, pair := range [][2]string{
		{`{"amount":100,"amount":5}`, `{"amount":5}`},
		{`{"a":{"x":1,"x":2}}`, `{"a":{"x":2}}`},
		{`[{"n":1},{"n":1,"\u006e":2}]`, `[{"n":1},{"n":2}]`},
	} {
		key := newKey()
		if r := post(t, srv.URL, key, pair[0], "Content-Type", "application/json"); r.status != http.StatusCreated {
			t.Fatalf("%s: %d %q", pair[0], r.status, r.body)
		}
		if r := post(t, srv.URL, key, pair[1], "Content-Type", "application/json"); r.status != http.StatusUnprocessableEntity {
			t.Errorf("%s after %s under one key: %d (replayed=%v), want 422", pair[1], pair[0], r.status, r.replayed())
		}
	}
	// The same name in different objects is no duplicate: still canonical.
	key := newKey()
	post(t, srv.URL, key, `{"a":{"n":1},"b":{"n":1},"n":[{"n":1}]}`, "Content-Type", "application/json")
	if r := post(t, srv.URL, key, `{"n":[{"n":1}],"b":{"n":1},"a":{"n":1}}`, "Content-Type", "application/json"); r.status != http.StatusCreated || !r.replayed() {
		t.Errorf("reordered body with repeated names in different objects: %d replayed=%v, want the replay", r.status, r.replayed())
	}
}

// TestInProgress: while the first request runs, a retry gets 409
// request-in-progress with Retry-After: 1; after it finishes, the replay.
// With WithBusyWait the retry waits and gets the replay instead.
func TestInProgress(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store.Store) {
		for _, wait := range []bool{false, true} {
			t.Run(fmt.Sprintf("busy-wait=%v", wait), func(t *testing.T) {
				started, release := make(chan struct{}), make(chan struct{})
				var runs atomic.Int64
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					close(started)
					<-release
					w.WriteHeader(http.StatusAccepted)
					_, _ = io.WriteString(w, "done")
				})
				var opts []httpidem.Option
				if wait {
					opts = append(opts, httpidem.WithBusyWait(30*time.Second))
				}
				srv := serve(t, ledger(s), h, opts...)
				key := newKey()
				firstDone := make(chan reply, 1)
				go func() { firstDone <- do(t, http.MethodPost, srv.URL, []string{quoted(key)}, "x") }()
				<-started
				if !wait {
					r := post(t, srv.URL, key, "x")
					if r.status != http.StatusConflict || r.problemType(t) != httpidem.ProblemInProgress || r.header.Get("Retry-After") != "1" {
						t.Fatalf("during the first request: %d Retry-After %q %q", r.status, r.header.Get("Retry-After"), r.body)
					}
					close(release)
				} else {
					secondDone := make(chan reply, 1)
					go func() { secondDone <- do(t, http.MethodPost, srv.URL, []string{quoted(key)}, "x") }()
					time.Sleep(50 * time.Millisecond) // let it find the key busy
					close(release)
					r := <-secondDone
					if r.status != http.StatusAccepted || !r.replayed() || r.body != "done" {
						t.Fatalf("busy-waiting retry: %d replayed=%v %q", r.status, r.replayed(), r.body)
					}
				}
				if r := <-firstDone; r.err != nil || r.status != http.StatusAccepted || r.replayed() {
					t.Fatalf("first: %v %d", r.err, r.status)
				}
				if r := post(t, srv.URL, key, "x"); r.status != http.StatusAccepted || !r.replayed() {
					t.Fatalf("after: %d replayed=%v", r.status, r.replayed())
				}
				if runs.Load() != 1 {
					t.Fatalf("handler ran %d times", runs.Load())
				}
			})
		}
	})
}

// TestMismatchWhileInProgress: a key reused with a different body while
// the first request runs gets 422 key-reused, as after it finished, not 409
// (which tells the client to retry the same request, only to be refused
// later); the same request still gets 409.
func TestMismatchWhileInProgress(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store.Store) {
		started, release := make(chan struct{}), make(chan struct{})
		var runs atomic.Int64
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			close(started)
			<-release
			w.WriteHeader(http.StatusCreated)
		})
		srv := serve(t, ledger(s), h)
		key := newKey()
		firstDone := make(chan reply, 1)
		go func() { firstDone <- do(t, http.MethodPost, srv.URL, []string{quoted(key)}, "A") }()
		<-started
		r := post(t, srv.URL, key, "B")
		if r.status != http.StatusUnprocessableEntity || r.problemType(t) != httpidem.ProblemKeyReused {
			t.Errorf("other body while the first runs: %d %q, want 422 key-reused", r.status, r.body)
		}
		if r := post(t, srv.URL, key, "A"); r.status != http.StatusConflict {
			t.Errorf("same body while the first runs: %d %q, want 409", r.status, r.body)
		}
		close(release)
		if r := <-firstDone; r.err != nil || r.status != http.StatusCreated {
			t.Fatalf("first: %v %d", r.err, r.status)
		}
		if runs.Load() != 1 {
			t.Fatalf("handler ran %d times, want 1", runs.Load())
		}
	})
}

// TestConcurrent: 50 identical requests at once run the handler once; every
// other one gets 409 or the replay.
func TestConcurrent(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store.Store) {
		var runs atomic.Int64
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			time.Sleep(20 * time.Millisecond) // widen the window
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "made")
		})
		srv := serve(t, ledger(s), h)
		key := newKey()
		const n = 50
		replies := make([]reply, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				replies[i] = do(t, http.MethodPost, srv.URL, []string{quoted(key)}, "same body")
			}()
		}
		close(start)
		wg.Wait()
		fresh, replayed, busy := 0, 0, 0
		for _, r := range replies {
			switch {
			case r.err != nil:
				t.Fatalf("request failed: %v", r.err)
			case r.status == http.StatusCreated && r.body == "made" && !r.replayed():
				fresh++
			case r.status == http.StatusCreated && r.body == "made" && r.replayed():
				replayed++
			case r.status == http.StatusConflict:
				busy++
			default:
				t.Fatalf("unexpected reply %d %q", r.status, r.body)
			}
		}
		if runs.Load() != 1 || fresh != 1 {
			t.Fatalf("handler ran %d times, %d fresh answers; want 1 and 1 (%d replays, %d busy)", runs.Load(), fresh, replayed, busy)
		}
		t.Logf("1 fresh, %d replays, %d busy", replayed, busy)
	})
}

// TestStatusesKept: 2xx and ordinary 4xx are recorded and replayed; 5xx
// and the transient 4xx (408, 409, 423, 425, 429) are not: the client gets
// the handler's response and a retry runs the handler again. With
// WithStoreServerErrors(true) a 5xx is replayed like any other.
func TestStatusesKept(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store.Store) {
		l := ledger(s)
		cases := []struct {
			status      int
			storeErrors bool
			kept        bool
		}{
			{200, false, true}, {201, false, true}, {204, false, true}, {302, false, true},
			{400, false, true}, {404, false, true}, {422, false, true},
			{408, false, false}, {409, false, false}, {423, false, false}, {425, false, false}, {429, false, false},
			{500, false, false}, {502, false, false}, {503, false, false},
			{500, true, true}, {503, true, true},
		}
		for _, c := range cases {
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := runs.Add(1)
				if c.status == http.StatusFound {
					w.Header().Set("Location", "/elsewhere")
				}
				w.WriteHeader(c.status)
				_, _ = fmt.Fprintf(w, "run %d", n)
			})
			srv := serve(t, l, h, httpidem.WithStoreServerErrors(c.storeErrors))
			key := newKey()
			client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			get := func() reply {
				req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("b"))
				req.Header.Set(httpidem.HeaderKey, quoted(key))
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
			}
			first, second := get(), get()
			wantBody := "run 1"
			if c.status == http.StatusNoContent {
				wantBody = ""
			}
			if first.status != c.status || first.body != wantBody {
				t.Errorf("%d (store 5xx %v): first got %d %q", c.status, c.storeErrors, first.status, first.body)
			}
			if c.kept {
				if second.status != c.status || second.body != wantBody || !second.replayed() || runs.Load() != 1 {
					t.Errorf("%d (store 5xx %v) kept: retry %d %q replayed=%v runs=%d", c.status, c.storeErrors, second.status, second.body, second.replayed(), runs.Load())
				}
				if c.status == http.StatusFound && second.header.Get("Location") != "/elsewhere" {
					t.Errorf("302 replay lost its Location")
				}
			} else if second.status != c.status || second.body != "run 2" || second.replayed() || runs.Load() != 2 {
				t.Errorf("%d (store 5xx %v) not kept: retry %d %q replayed=%v runs=%d", c.status, c.storeErrors, second.status, second.body, second.replayed(), runs.Load())
			}
		}
	})
}

// TestScope: keys are looked up per scope: the same key from two tenants
// runs the handler for each and replays each its own response. A scope
// function error or an empty scope is refused with 500, handler not run.
func TestScope(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store.Store) {
		var h counter
		scope := func(r *http.Request) (string, error) {
			switch tenant := r.Header.Get("X-Tenant"); tenant {
			case "broken":
				return "", errors.New("directory down: secret-dsn")
			default:
				return tenant, nil
			}
		}
		srv := serve(t, ledger(s), &h, httpidem.WithScope(scope))
		key := newKey()
		a := post(t, srv.URL, key, "pay 10", "X-Tenant", "A")
		b := post(t, srv.URL, key, "pay 10", "X-Tenant", "B")
		if a.replayed() || b.replayed() || a.body == b.body || h.n.Load() != 2 {
			t.Fatalf("tenant B got tenant A's answer: A %q B %q runs %d", a.body, b.body, h.n.Load())
		}
		// Even a different request from B with A's key is B's own.
		if r := post(t, srv.URL, key, "pay 10", "X-Tenant", "A"); !r.replayed() || r.body != a.body {
			t.Fatalf("A's retry: replayed=%v %q, want %q", r.replayed(), r.body, a.body)
		}
		if r := post(t, srv.URL, key, "pay 10", "X-Tenant", "B"); !r.replayed() || r.body != b.body {
			t.Fatalf("B's retry: replayed=%v %q, want %q", r.replayed(), r.body, b.body)
		}
		for _, tenant := range []string{"broken", ""} {
			r := post(t, srv.URL, newKey(), "x", "X-Tenant", tenant)
			if r.status != http.StatusInternalServerError || r.problemType(t) != httpidem.ProblemScopeFailed || strings.Contains(r.body, "secret") {
				t.Fatalf("tenant %q: %d %q", tenant, r.status, r.body)
			}
		}
		if h.n.Load() != 2 {
			t.Fatalf("handler ran %d times, want 2", h.n.Load())
		}
	})
}

// TestKeySeparators: keys and scopes with ':' and '\' cannot be arranged to
// collide: key "b" in scope "x:a" is not key "a:b" in scope "x", and a key
// with separators replays itself.
func TestKeySeparators(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store.Store) {
		var h counter
		srv := serve(t, ledger(s), &h, httpidem.WithScope(func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil }))
		suffix := newKey()
		one := post(t, srv.URL, "a:"+suffix, "x", "X-Tenant", "x")
		two := post(t, srv.URL, suffix, "x", "X-Tenant", "x:a")
		three := post(t, srv.URL, `a\:`+suffix, "x", "X-Tenant", `x`)
		if one.replayed() || two.replayed() || three.replayed() || h.n.Load() != 3 {
			t.Fatalf("separator keys collided: runs %d", h.n.Load())
		}
		if r := post(t, srv.URL, "a:"+suffix, "x", "X-Tenant", "x"); !r.replayed() || r.body != one.body {
			t.Fatalf("key with ':' did not replay itself: %q", r.body)
		}
	})
}

// TestPanic: a handler that panics releases the key (the retry runs it
// again) and the panic reaches net/http (the client sees the connection
// cut).
func TestPanic(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store.Store) {
		var runs atomic.Int64
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if runs.Add(1) == 1 {
				panic("boom")
			}
			_, _ = io.WriteString(w, "ok")
		})
		srv := serve(t, ledger(s), h)
		key := newKey()
		if r := do(t, http.MethodPost, srv.URL, []string{quoted(key)}, "x"); r.err == nil {
			t.Fatalf("panicking handler: got %d %q, want a cut connection", r.status, r.body)
		}
		r := post(t, srv.URL, key, "x")
		if r.status != http.StatusOK || r.body != "ok" || r.replayed() || runs.Load() != 2 {
			t.Fatalf("retry after panic: %d %q replayed=%v runs=%d", r.status, r.body, r.replayed(), runs.Load())
		}
	})
}

// TestClientGone: the handler's context is the request's. A client that
// disconnects cancels it: a handler that then gives up without answering
// leaves nothing recorded (the retry runs it again); a handler that still
// answers (its work was done) has that answer recorded and replayed.
func TestClientGone(t *testing.T) {
	forEachStore(t, func(t *testing.T, s store.Store) {
		for _, answers := range []bool{false, true} {
			t.Run(fmt.Sprintf("answers=%v", answers), func(t *testing.T) {
				var runs atomic.Int64
				started := make(chan struct{}, 2)
				finished := make(chan struct{}, 2)
				h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					defer func() { finished <- struct{}{} }()
					if runs.Add(1) == 1 {
						started <- struct{}{}
						<-r.Context().Done()
						if !answers {
							return
						}
					}
					w.WriteHeader(http.StatusCreated)
					_, _ = fmt.Fprintf(w, "run %d", runs.Load())
				})
				srv := serve(t, ledger(s), h)
				key := newKey()
				ctx, cancel := context.WithCancel(context.Background())
				gone := make(chan reply, 1)
				go func() { gone <- doCtx(ctx, t, http.MethodPost, srv.URL, []string{quoted(key)}, "x") }()
				<-started
				cancel()
				if r := <-gone; r.err == nil {
					t.Fatalf("cancelled request got %d", r.status)
				}
				<-finished
				// The ledger records the outcome after the handler returns:
				// wait until the key is no longer in progress.
				waitFor(t, "the first attempt's outcome", func() bool {
					rec, err := s.Get(context.Background(), opKey(key))
					return err == nil && rec.Status != idem.StatusInProgress
				})
				r := post(t, srv.URL, key, "x")
				if answers {
					if r.status != http.StatusCreated || !r.replayed() || r.body != "run 1" || runs.Load() != 1 {
						t.Fatalf("retry: %d %q replayed=%v runs=%d, want the first run's answer", r.status, r.body, r.replayed(), runs.Load())
					}
				} else if r.status != http.StatusCreated || r.replayed() || r.body != "run 2" {
					t.Fatalf("retry: %d %q replayed=%v, want a second run", r.status, r.body, r.replayed())
				}
			})
		}
	})
}
