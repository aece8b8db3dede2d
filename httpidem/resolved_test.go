package httpidem_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/store"
)

// TestResolvedDoneKey: an operator who finds that an indeterminate request's
// effect happened resolves its key as done (idem resolve KEY --done), with
// no result or with a note of their own. The middleware did not record that
// result, so it has no response to replay: retries get what a completed key
// whose response was not kept gets (422 response-not-kept), never a 5xx that
// makes the client retry for ever, and the handler does not run again.
func TestResolvedDoneKey(t *testing.T) {
	for _, result := range []string{"", `{"charged":true}`, "ses-0007"} {
		t.Run("result="+result, func(t *testing.T) {
			ctx := context.Background()
			s := newMem()
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.WriteHeader(http.StatusBadGateway) // the charge may have happened
			})
			srv := serve(t, ledger(s, idem.WithPolicy(idem.AtMostOnce)), h)
			key := newKey()
			if r := post(t, srv.URL, key, "x"); r.status != http.StatusBadGateway {
				t.Fatalf("first: %d %q", r.status, r.body)
			}
			if r := post(t, srv.URL, key, "x"); r.status != http.StatusInternalServerError || r.problemType(t) != httpidem.ProblemOutcomeUnknown {
				t.Fatalf("before the operator decides: %d %q, want 500 outcome-unknown", r.status, r.body)
			}
			if _, err := s.Resolve(ctx, store.ResolveRequest{Key: opKey(key), Done: true, Result: []byte(result), Reason: "operator: charge found", By: "op"}); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 2; i++ {
				r := post(t, srv.URL, key, "x")
				if r.status != http.StatusUnprocessableEntity || r.problemType(t) != httpidem.ProblemResponseNotKept {
					t.Fatalf("retry %d after resolve --done: %d %q, want 422 response-not-kept", i, r.status, r.body)
				}
			}
			if runs.Load() != 1 {
				t.Fatalf("handler ran %d times, want 1", runs.Load())
			}
		})
	}
}
