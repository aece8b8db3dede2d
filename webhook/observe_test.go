package webhook

import (
	"bytes"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testobserve"
)

// The Receiver reports each request to its ledger's observer, with the
// ledger's call nested in it: captured, replayed, refused by signature.
func TestReceiverReportsToTheLedgersObserver(t *testing.T) {
	for _, mode := range []string{"plain", "tx"} {
		t.Run(mode, func(t *testing.T) {
			rec := new(testobserve.Recorder)
			e := newEnv(t, idem.WithObserver(rec))
			var logs bytes.Buffer
			rc, s := newReceiver(t, e, captures(e)[mode], WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			body := `{"type":"invoice.paid"}`
			now := time.Now()
			if a := serve(rc, swRequest(t, s, "evt_1", body, now)); a.status != http.StatusOK {
				t.Fatalf("first delivery: %d %s", a.status, a.body)
			}
			if a := serve(rc, swRequest(t, s, "evt_1", body, now.Add(time.Minute))); a.status != http.StatusOK {
				t.Fatalf("retry: %d %s", a.status, a.body)
			}
			forged := swRequest(t, s, "evt_2", body, now)
			forged.Header.Set("Webhook-Signature", "v1,"+strings.Repeat("A", 44))
			if a := serve(rc, forged); a.status != http.StatusUnauthorized {
				t.Fatalf("forged: %d %s", a.status, a.body)
			}

			want := []idem.EventKind{
				idem.WebhookStart, idem.OpStart, idem.OpEnd, idem.WebhookEnd,
				idem.WebhookStart, idem.OpStart, idem.OpEnd, idem.WebhookEnd,
				idem.WebhookStart, idem.WebhookEnd,
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
				op              string
			}{{"captured", "", 200, "executed"}, {"replayed", "", 200, "replayed"}, {"refused", "signature", 401, ""}} {
				start, end := evs[4*i], evs[min(4*i+3, 9)] // the refusal has no ledger call
				if start.Source != "acme" || start.Method != http.MethodPost {
					t.Errorf("request %d: WebhookStart %+v", i, start.Event)
				}
				if end.Outcome != w.outcome || end.Reason != w.reason || end.Status != w.status || end.Source != "acme" {
					t.Errorf("request %d: WebhookEnd %s %q %d, want %s %q %d", i, end.Outcome, end.Reason, end.Status, w.outcome, w.reason, w.status)
				}
				if w.op == "" {
					continue
				}
				if op := evs[4*i+2]; op.Outcome != w.op || evs[4*i+1].Parent != start.Span || end.Key != op.Key || end.Key != "accept:acme:evt_1" {
					t.Errorf("request %d: the ledger's call %+v (parent %d) is not request %d's (span %d, key %q)", i, op.Event, evs[4*i+1].Parent, i, start.Span, end.Key)
				}
			}
			if !strings.Contains(logs.String(), `level=WARN msg="webhook: request refused" source=acme status=401`) {
				t.Errorf("a forged signature is not a warning:\n%s", logs.String())
			}
		})
	}
}
