package httpidem_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/httpidem"
)

// TestOptions: the options a user sets change what the middleware does.
func TestOptions(t *testing.T) {
	l := ledger(newMem())

	t.Run("methods", func(t *testing.T) {
		var h counter
		srv := serve(t, l, &h, httpidem.WithMethods(http.MethodPut))
		key := quoted(newKey())
		for i := 0; i < 2; i++ {
			do(t, http.MethodPut, srv.URL, []string{key}, "x")
			do(t, http.MethodPost, srv.URL, []string{key}, "x")
		}
		if h.n.Load() != 3 { // PUT once, POST twice
			t.Fatalf("runs %d, want 3", h.n.Load())
		}
	})

	t.Run("fingerprint headers", func(t *testing.T) {
		var h counter
		srv := serve(t, l, &h, httpidem.WithFingerprintHeaders("x-account"))
		key := newKey()
		post(t, srv.URL, key, "x", "X-Account", "1")
		if r := post(t, srv.URL, key, "x", "X-Account", "2"); r.status != http.StatusUnprocessableEntity {
			t.Fatalf("another X-Account: %d", r.status)
		}
		if r := post(t, srv.URL, key, "x", "X-Account", "1"); !r.replayed() {
			t.Fatalf("same X-Account: %d not replayed", r.status)
		}
	})

	t.Run("namespaces", func(t *testing.T) {
		var h counter
		a := serve(t, l, &h, httpidem.WithNamespace("app-a"))
		b := serve(t, l, &h, httpidem.WithNamespace("app-b"))
		key := newKey()
		post(t, a.URL, key, "x")
		if r := post(t, b.URL, key, "x"); r.replayed() || h.n.Load() != 2 {
			t.Fatalf("namespace b replayed namespace a's key")
		}
	})

	t.Run("retention and problem base", func(t *testing.T) {
		var h counter
		m := httpidem.New(l, httpidem.WithRetention(time.Hour))
		if m.Retention() != time.Hour {
			t.Fatalf("Retention() = %v", m.Retention())
		}
		srv := serve(t, l, &h, httpidem.WithRetention(time.Hour), httpidem.WithProblemBase("https://api.example.com/problems/"))
		r := post(t, srv.URL, newKey(), "x")
		if r.header.Get(httpidem.HeaderRetention) != "3600" {
			t.Fatalf("advertised retention %q, want 3600", r.header.Get(httpidem.HeaderRetention))
		}
		r = do(t, http.MethodPost, srv.URL, []string{`"unterminated`}, "x")
		var p struct{ Type string }
		_ = json.Unmarshal([]byte(r.body), &p)
		if p.Type != "https://api.example.com/problems/"+httpidem.ProblemKeyInvalid {
			t.Fatalf("problem type %q", p.Type)
		}
	})

	t.Run("replay headers", func(t *testing.T) {
		srv := serve(t, l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Request-Cost", "7")
			w.Header().Set("Set-Cookie", "s=1")
			w.Header().Add("Link", "</a>; rel=a")
			w.Header().Add("Link", "</b>; rel=b")
		}), httpidem.WithReplayHeaders("x-request-cost", "Set-Cookie", "Link"))
		key := newKey()
		post(t, srv.URL, key, "x")
		r := post(t, srv.URL, key, "x")
		if r.header.Get("X-Request-Cost") != "7" || r.header.Get("Set-Cookie") != "" || strings.Join(r.header.Values("Link"), ",") != "</a>; rel=a,</b>; rel=b" {
			t.Fatalf("replayed headers %v: want X-Request-Cost and both Links, never Set-Cookie", r.header)
		}
	})
}
