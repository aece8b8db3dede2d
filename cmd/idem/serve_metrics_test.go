package main

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// newMetricsServeTest serves s with /metrics on, as idem serve does by
// default.
func newMetricsServeTest(t *testing.T, srv *server) *api {
	t.Helper()
	m, err := newServeMetrics()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.shutdown)
	srv.obs, srv.metrics = m.observer, m.handler
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &api{t: t, base: hs.URL}
}

// scrape reads /metrics as Prometheus does.
func scrape(t *testing.T, c *api) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(c.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("/metrics: %d %s", resp.StatusCode, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// counter is the sum of name's samples whose labels include want
// (label=value pairs).
func counter(mfs map[string]*dto.MetricFamily, name string, want ...string) float64 {
	mf := mfs[name]
	if mf == nil {
		return -1
	}
	var n float64
	for _, m := range mf.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		ok := true
		for i := 0; i+1 < len(want); i += 2 {
			if labels[want[i]] != want[i+1] {
				ok = false
			}
		}
		if ok {
			n += m.GetCounter().GetValue()
		}
	}
	return n
}

// TestServeMetrics: the claims served are counted by outcome, with the
// names of docs/observability.md, in a real scrape of /metrics.
func TestServeMetrics(t *testing.T) {
	clk := newClock()
	s, _ := openSQLite(t, clk)
	t.Cleanup(func() { s.Close() })
	c := newMetricsServeTest(t, newServer(s, slog.New(slog.DiscardHandler), nil, 4096, false))

	// k1: acquired, completed (a repeated complete counts once), done.
	a := c.post("/v1/claim", obj{"key": "k1"}).expect(t, 200, "acquired")
	done := obj{"key": "k1", "fence": a.num("fence"), "attempt_id": a.str("attempt_id"), "result": b64("r")}
	c.post("/v1/complete", done).expect(t, 200, "completed")
	c.post("/v1/complete", done).expect(t, 200, "completed")
	c.post("/v1/claim", obj{"key": "k1"}).expect(t, 200, "done")
	// k2: acquired, busy twice, extended, taken over once its lease lapsed,
	// released; the lapsed attempt's extend is lease-lost.
	a = c.post("/v1/claim", obj{"key": "k2", "lease": "10s"}).expect(t, 200, "acquired")
	c.post("/v1/claim", obj{"key": "k2"}).expect(t, 409, "busy")
	c.post("/v1/claim", obj{"key": "k2"}).expect(t, 409, "busy")
	c.post("/v1/extend", obj{"key": "k2", "fence": a.num("fence"), "attempt_id": a.str("attempt_id"), "lease": "10s"}).expect(t, 200, "extended")
	clk.Advance(11 * time.Second)
	b := c.post("/v1/claim", obj{"key": "k2"}).expect(t, 200, "takeover")
	c.post("/v1/extend", obj{"key": "k2", "fence": a.num("fence"), "attempt_id": a.str("attempt_id")}).expect(t, 409, "lease-lost")
	c.post("/v1/release", obj{"key": "k2", "fence": b.num("fence"), "attempt_id": b.str("attempt_id")}).expect(t, 200, "released")
	// k3: another fingerprint is a mismatch.
	a = c.post("/v1/claim", obj{"key": "k3", "fingerprint": "a"}).expect(t, 200, "acquired")
	c.post("/v1/complete", obj{"key": "k3", "fence": a.num("fence"), "attempt_id": a.str("attempt_id")}).expect(t, 200, "completed")
	c.post("/v1/claim", obj{"key": "k3", "fingerprint": "b"}).expect(t, 422, "mismatch")
	// k4: an at_most_once attempt that lapsed is indeterminate.
	c.post("/v1/claim", obj{"key": "k4", "policy": "at_most_once", "lease": "1s"}).expect(t, 200, "acquired")
	clk.Advance(2 * time.Second)
	c.post("/v1/claim", obj{"key": "k4"}).expect(t, 409, "indeterminate")
	// Bad input is no operation.
	c.post("/v1/claim", obj{"key": ""}).expect(t, 400, "invalid-key")

	mfs := scrape(t, c)
	ops := "idem_operations_total"
	for _, w := range []struct {
		labels []string
		want   float64
	}{
		{[]string{"idem_outcome", "acquired"}, 5},
		{[]string{"idem_outcome", "acquired", "idem_policy", "at_most_once"}, 1},
		{[]string{"idem_outcome", "executed"}, 2},
		{[]string{"idem_outcome", "replayed"}, 1},
		{[]string{"idem_outcome", "busy"}, 2},
		{[]string{"idem_outcome", "released"}, 1},
		{[]string{"idem_outcome", "mismatch"}, 1},
		{[]string{"idem_outcome", "indeterminate"}, 1},
		{nil, 13},
	} {
		if got := counter(mfs, ops, w.labels...); got != w.want {
			t.Errorf("%s%v = %v, want %v", ops, w.labels, got, w.want)
		}
	}
	for name, want := range map[string]float64{
		"idem_takeovers_total": 1, "idem_busy_total": 2, "idem_indeterminate_total": 1,
		"idem_lease_extensions_total": 1, "idem_lease_losses_total": 1,
	} {
		if got := counter(mfs, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := counter(mfs, "idem_http_requests_total", "http_route", "/v1/claim"); got != 11 {
		t.Errorf("claims requested = %v, want 11", got)
	}
	if got := counter(mfs, "idem_http_requests_total", "http_route", "/v1/claim", "idem_outcome", "invalid-key", "http_response_status_code", "400"); got != 1 {
		t.Errorf("invalid-key claims = %v, want 1", got)
	}
	if mfs["idem_operation_duration_seconds"].GetType() != dto.MetricType_HISTOGRAM {
		t.Errorf("idem_operation_duration_seconds is %v, want a histogram", mfs["idem_operation_duration_seconds"].GetType())
	}
	if mfs["go_goroutines"] == nil || mfs["process_cpu_seconds_total"] == nil {
		t.Error("no Go runtime or process metrics")
	}
	// No key reaches a label.
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.HasPrefix(l.GetValue(), "k") && len(l.GetValue()) == 2 {
					t.Errorf("%s has label %s=%s", name, l.GetName(), l.GetValue())
				}
			}
		}
	}
}

// TestServeReadyz: /readyz is 200 while the store answers a read and 503
// with a problem once it cannot (here, closed); --metrics=false leaves no
// /metrics.
func TestServeReadyz(t *testing.T) {
	s := openServeSQLite(t)
	c := newMetricsServeTest(t, newServer(s, slog.New(slog.DiscardHandler), nil, 4096, false))
	if a := c.do("GET", "/readyz", "").expect(t, 200, ""); a.str("status") != "ok" {
		t.Fatalf("readyz: %s", a)
	}
	s.Close()
	if a := c.do("GET", "/readyz", "").expect(t, 503, "store-unavailable"); a.header.Get("Retry-After") == "" {
		t.Fatalf("503 without Retry-After: %v", a.header)
	}
	if got := counter(scrape(t, c), "idem_http_requests_total", "http_route", "/readyz", "http_response_status_code", "503"); got != 1 {
		t.Errorf("readyz 503s counted = %v, want 1", got)
	}

	off, _ := newServeTest(t, openServeSQLite(t), "", false)
	off.do("GET", "/metrics", "").expect(t, 404, "not-found")
}

// TestServeMetricsNeedToken: with --token-file, a scrape needs the token
// too.
func TestServeMetricsNeedToken(t *testing.T) {
	srv := newServer(openServeSQLite(t), slog.New(slog.DiscardHandler), []byte("secret"), 4096, false)
	c := newMetricsServeTest(t, srv)
	c.do("GET", "/metrics", "").expect(t, 401, "unauthorized")
	c.token = "secret"
	if a := c.do("GET", "/readyz", ""); a.status != 200 {
		t.Fatalf("readyz with the token: %s", a)
	}
}
