package httpidem_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/internal/testobserve"
	"github.com/idemkit/idem/store/memstore"
)

// The middleware reports each keyed request to its ledger's observer, with
// the ledger's call nested in it.
func TestMiddlewareReportsToTheLedgersObserver(t *testing.T) {
	rec := new(testobserve.Recorder)
	m := httpidem.New(ledger(memstore.New(), idem.WithObserver(rec)), httpidem.WithLogger(quiet()))
	mux := http.NewServeMux() // routes to the middleware: its events name the route
	mux.Handle("POST /orders", m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("order 1"))
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	key := newKey()
	for i, body := range []string{`{"n":1}`, `{"n":1}`, `{"n":2}`} {
		if r := post(t, srv.URL+"/orders", key, body); r.status != []int{201, 201, 422}[i] {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	if r := do(t, http.MethodPost, srv.URL+"/orders", []string{"not an sf-string"}, "{}"); r.status != http.StatusBadRequest {
		t.Fatalf("invalid key: %d %s", r.status, r.body)
	}
	// The server may answer before RequestEnd is observed: wait for it.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if n := len(rec.Kinds()); n >= 14 {
			break
		}
	}
	want := []idem.EventKind{
		idem.RequestStart, idem.OpStart, idem.OpEnd, idem.RequestEnd,
		idem.RequestStart, idem.OpStart, idem.OpEnd, idem.RequestEnd,
		idem.RequestStart, idem.OpStart, idem.OpEnd, idem.RequestEnd,
		idem.RequestStart, idem.RequestEnd,
	}
	if got := rec.Kinds(); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if err := rec.Check(); err != nil {
		t.Fatal(err)
	}
	evs := rec.Events()
	for i, w := range []struct {
		outcome, reason string
		status          int
	}{{"executed", "", 201}, {"replayed", "", 201}, {"mismatch", httpidem.ProblemKeyReused, 422}, {"refused", httpidem.ProblemKeyInvalid, 400}} {
		start, end := evs[4*i], evs[min(4*i+3, 13)]
		if start.Method != http.MethodPost || start.Route != "POST /orders" {
			t.Errorf("request %d: RequestStart %+v", i, start.Event)
		}
		if end.Outcome != w.outcome || end.Reason != w.reason || end.Status != w.status || end.Route != "POST /orders" {
			t.Errorf("request %d: RequestEnd %s %q %d, want %s %q %d", i, end.Outcome, end.Reason, end.Status, w.outcome, w.reason, w.status)
		}
		if i == 3 {
			continue
		}
		if op := evs[4*i+2]; op.Outcome != w.outcome || evs[4*i+1].Parent != start.Span || end.Key != op.Key || end.Key == "" {
			t.Errorf("request %d: the ledger's call %+v (parent %d) is not the request's (span %d, key %q)", i, op.Event, evs[4*i+1].Parent, start.Span, end.Key)
		}
		if i < 2 && (end.Fence == 0 || end.Fence != evs[4*i+2].Fence) {
			t.Errorf("request %d: RequestEnd fence %d, the ledger's %d", i, end.Fence, evs[4*i+2].Fence)
		}
	}
}
