package httpidem_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/store/memstore"
)

// A payment endpoint that requires an Idempotency-Key, with keys scoped to
// the caller's account. The retry of a request does not charge again: it
// gets the first answer, marked Idempotent-Replayed.
func ExampleNew() {
	l := idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler)))
	m := httpidem.New(l,
		httpidem.WithRequired(true),
		httpidem.WithScope(func(r *http.Request) (string, error) {
			return r.Header.Get("X-Account"), nil // set by authentication, in a real server
		}),
	)
	charges := 0
	mux := http.NewServeMux()
	mux.Handle("POST /charges", m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":"ch_%d"}`, charges)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	send := func(key string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"amount":1000}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Account", "acct_1")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d replayed=%q %s", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), body)
		if !strings.HasSuffix(string(body), "\n") {
			fmt.Println()
		}
	}
	send(`"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
	send(`"8e03978e-40d5-43e8-bc93-6894a57f9324"`) // a retry
	send("")                                       // no key
	fmt.Println("charges:", charges)
	// Output:
	// 201 replayed="" {"charge":"ch_1"}
	// 201 replayed="true" {"charge":"ch_1"}
	// 400 replayed="" {"type":"https://github.com/idemkit/idem/blob/main/docs/problems.md#httpidem-key-missing","title":"Idempotency-Key is missing","status":400,"detail":"This endpoint requires an Idempotency-Key header."}
	// charges: 1
}
