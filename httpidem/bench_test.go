package httpidem_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/store/memstore"
)

// BenchmarkOverhead measures what the middleware adds to a bare handler on
// memstore, through httptest (no network): a new key each time (claim,
// handler, record), a retry of a finished key (replay), and a request
// without a key (pass-through).
func BenchmarkOverhead(b *testing.B) {
	body := []byte(`{"amount":1000,"currency":"eur"}`)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"ch_1","amount":1000,"currency":"eur"}`)
	})
	run := func(b *testing.B, handler http.Handler, key func(i int) string) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/charges", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if k := key(i); k != "" {
				req.Header.Set(httpidem.HeaderKey, k)
			}
			w := httptest.NewRecorder()
			handler.ServeHTTP(w, req)
			if w.Code != http.StatusCreated {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
		}
	}
	newMiddleware := func() http.Handler {
		l := idem.New(memstore.New(), idem.WithLogger(quiet()))
		return httpidem.New(l, httpidem.WithLogger(quiet())).Handler(h)
	}
	b.Run("bare", func(b *testing.B) { run(b, h, func(int) string { return "" }) })
	b.Run("no-key", func(b *testing.B) { run(b, newMiddleware(), func(int) string { return "" }) })
	b.Run("new-key", func(b *testing.B) {
		run(b, newMiddleware(), func(i int) string { return `"key-` + strconv.Itoa(i) + `"` })
	})
	b.Run("replay", func(b *testing.B) { run(b, newMiddleware(), func(int) string { return `"the-same-key"` }) })
}
