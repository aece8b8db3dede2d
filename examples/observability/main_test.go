package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRun runs the demo: the trace it prints runs from the webhook request
// to the effect, and the scrape counts what it sent.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, filepath.Join(t.TempDir(), "idem.db"), ""); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{
		"webhook evt_x: 401",
		"  webhook payments (server)\n    idem.do (internal)\n      process payment-events (consumer)\n        idem.do (internal)\n          mark paid o-2 (internal)\n",
		`idem_webhook_requests_total{http_response_status_code="200",idem_outcome="captured",idem_webhook_source="payments"} 3`,
		`idem_webhook_requests_total{http_response_status_code="200",idem_outcome="replayed",idem_webhook_source="payments"} 1`,
		`idem_webhook_refusals_total{idem_reason="signature",idem_webhook_source="payments"} 1`,
		`idem_deliveries_total{idem_outcome="acked",idem_reason="executed",messaging_destination_name="payment-events"} 3`,
		`idem_operations_total{idem_outcome="executed",idem_policy="at_least_once"} 6`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the output lacks %q:\n%s", want, got)
		}
	}
}
