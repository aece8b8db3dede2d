package otelidem_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/otelidem"
)

// promObserver is an Observer whose metrics a Prometheus registry serves,
// as idem serve's /metrics does.
func promObserver(t testing.TB, opts ...otelidem.Option) (*otelidem.Observer, *httptest.Server) {
	t.Helper()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	hs := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(hs.Close)
	return otelidem.New(append([]otelidem.Option{otelidem.WithMeterProvider(mp)}, opts...)...), hs
}

// scrapeFamilies returns the metric families a scrape of url holds, each
// with the sum of its values (a histogram's count).
func scrapeFamilies(t testing.TB, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for name, mf := range mfs {
		var v float64
		for _, m := range mf.GetMetric() {
			v += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
		out[name] = v
	}
	return out
}

// docMetrics returns the metrics table of docs/observability.md: OTel name
// to Prometheus name.
func docMetrics(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `(idem\\.[a-z_.]+)` \\| `(idem_[a-z_]+)` \\|")
	out := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(string(b), -1) {
		out[m[1]] = m[2]
	}
	if len(out) < 10 {
		t.Fatalf("docs/observability.md lists %d metrics: the table's format changed?", len(out))
	}
	return out
}

// TestDocsQueryOnlyListedMetrics: the metrics table of
// docs/observability.md is what a Prometheus scrape of otelidem holds, and
// the alert rules and the Grafana dashboard query only metrics it lists.
func TestDocsQueryOnlyListedMetrics(t *testing.T) {
	documented := docMetrics(t)
	obs, hs := promObserver(t, otelidem.WithQueueStats(func(context.Context) ([]otelidem.QueueStats, error) {
		return []otelidem.QueueStats{{Queue: "q", Ready: 1, OldestAge: time.Second}}, nil
	}))
	ctx := context.Background()
	// One event of every kind, with every outcome that has a metric of its own.
	for _, e := range []idem.Event{
		{Kind: idem.OpEnd, Outcome: "executed", Takeover: true},
		{Kind: idem.OpEnd, Outcome: "busy"},
		{Kind: idem.OpEnd, Outcome: "indeterminate"},
		{Kind: idem.LeaseExtended},
		{Kind: idem.LeaseLost, Reason: "refused"},
		{Kind: idem.StoreFailed, Op: "claim"},
		{Kind: idem.DeliveryEnd, Queue: "q", Outcome: "dead-lettered", Reason: "max-receives"},
		{Kind: idem.WebhookEnd, Source: "s", Outcome: "refused", Reason: "signature", Status: 401},
		{Kind: idem.RequestEnd, Method: "POST", Route: "/r", Outcome: "executed", Status: 200},
		{Kind: idem.RelayPublished, Queue: "q", Duration: time.Second},
		{Kind: idem.RelayRefused, Queue: "q", Reason: "refused"},
	} {
		obs.Observe(ctx, e)
	}
	scraped := scrapeFamilies(t, hs.URL)
	var promNames []string
	for otelName, prom := range documented {
		promNames = append(promNames, prom)
		if _, ok := scraped[prom]; !ok {
			t.Errorf("docs/observability.md lists %s as %s; a scrape has no such metric", otelName, prom)
		}
	}
	for name := range scraped {
		if strings.HasPrefix(name, "idem_") && !slices.Contains(promNames, name) {
			t.Errorf("a scrape holds %s, which docs/observability.md does not list", name)
		}
	}

	// The alert rules' and the dashboard's queries.
	doc, err := os.ReadFile("../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	rules := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindSubmatch(doc)
	if rules == nil {
		t.Fatal("docs/observability.md has no YAML block of alert rules")
	}
	raw, err := os.ReadFile("../docs/grafana/idem.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("docs/grafana/idem.json: %v", err)
	}
	queries := map[string]string{"alert rules": string(rules[1])}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			queries["dashboard panel "+p.Title] += tg.Expr + "\n"
		}
	}
	if len(queries) < 10 {
		t.Fatalf("the dashboard has %d panels with queries", len(queries)-1)
	}
	metricRef := regexp.MustCompile(`\bidem_[a-z_]+`)
	for where, q := range queries {
		for _, name := range metricRef.FindAllString(q, -1) {
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
			if strings.HasPrefix(base, "idem_reason") || strings.HasPrefix(base, "idem_outcome") || strings.HasPrefix(base, "idem_webhook_source") ||
				strings.HasPrefix(base, "idem_queue_state") || strings.HasPrefix(base, "idem_store_op") || strings.HasPrefix(base, "idem_policy") {
				continue // a label, not a metric
			}
			if !slices.Contains(promNames, base) {
				t.Errorf("%s queries %s, which docs/observability.md does not list", where, name)
			}
		}
	}
}
