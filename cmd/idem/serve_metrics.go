package main

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/otelidem"
)

// serveMetrics is what /metrics serves: otelidem's instruments, read by the
// OpenTelemetry Prometheus exporter into a registry of serve's own (with
// the Go runtime's and the process's collectors), so that serve counts its
// claims with the very metrics a Go worker's otelidem.Observer exports, under
// the names docs/observability.md lists.
type serveMetrics struct {
	observer idem.Observer
	handler  http.Handler
	provider *sdkmetric.MeterProvider
	reg      *prometheus.Registry
}

func newServeMetrics() (*serveMetrics, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp),
		sdkmetric.WithResource(resource.NewSchemaless(attribute.String("service.name", "idem-serve"))))
	return &serveMetrics{
		// Serve exports no traces: a no-op tracer keeps the observer's
		// spans free.
		observer: otelidem.New(otelidem.WithMeterProvider(mp), otelidem.WithTracerProvider(tracenoop.NewTracerProvider())),
		handler:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		provider: mp,
		reg:      reg,
	}, nil
}

// counters sums each idem_* counter over its labels, for the console's
// overview; nil when the registry cannot be read.
func (m *serveMetrics) counters() map[string]float64 {
	mfs, err := m.reg.Gather()
	if err != nil {
		return nil
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "idem_") {
			continue
		}
		for _, mt := range mf.GetMetric() {
			if c := mt.GetCounter(); c != nil {
				out[mf.GetName()] += c.GetValue()
			}
		}
	}
	return out
}

func (m *serveMetrics) shutdown() { _ = m.provider.Shutdown(context.Background()) }

// routeOf is the route a path is counted under: a record's path holds a
// key, and an unknown path is anything, so neither becomes a series of
// its own.
func routeOf(path string) string {
	switch path {
	case "/v1/claim", "/v1/complete", "/v1/release", "/v1/fail", "/v1/abandon", "/v1/extend", "/v1/records", "/healthz", "/readyz":
		return path
	}
	if strings.HasPrefix(path, "/v1/records/") && strings.HasSuffix(path, "/story") {
		return "/v1/records/{key}/story"
	}
	if strings.HasPrefix(path, "/v1/records/") {
		return "/v1/records/{key}"
	}
	return "other"
}

// opOutcomes maps a call's outcome on each route to the outcome of the
// operation it ends, in the Ledger's words (idem.Event's OpEnd): a claim
// that is answered (done, busy, ...) ends its operation there; a claim
// acquired starts an attempt that a later complete, release, fail or
// abandon ends. Outcomes absent here (bad input) are no operation.
var opOutcomes = map[string]map[string]string{
	"/v1/claim": {"acquired": "acquired", "takeover": "acquired", "done": "replayed", "busy": "busy",
		"indeterminate": "indeterminate", "failed": "failed", "mismatch": "mismatch",
		"store-error": "store-error", "client-gone": "released"},
	"/v1/complete": {"completed": "executed", "lease-lost": "lease-lost", "store-error": "store-error"},
	"/v1/release":  {"released": "released", "lease-lost": "lease-lost", "store-error": "store-error"},
	"/v1/fail":     {"failed": "failed", "lease-lost": "lease-lost", "store-error": "store-error"},
	"/v1/abandon":  {"abandoned": "abandoned", "lease-lost": "lease-lost", "store-error": "store-error"},
}

// observeCall tells s.obs how the call ended: the operation it made, if
// any (a repeated finish was counted by its first try), then the request.
// ctx is the one the request's start returned.
func (s *server) observeCall(ctx context.Context, r *http.Request, c *call, path string, start time.Time) {
	route := routeOf(path)
	var key string
	if c.key != "" {
		key = s.ledger.LogKey(c.key).Value.String()
	}
	if c.storeOp != "" {
		s.obs.Observe(ctx, idem.Event{Kind: idem.StoreFailed, Op: c.storeOp, Key: key, KeyHashed: s.hashKeys})
	}
	switch {
	case route == "/v1/extend" && c.outcome == "extended":
		s.obs.Observe(ctx, idem.Event{Kind: idem.LeaseExtended, Key: key, KeyHashed: s.hashKeys, Fence: c.fence, AttemptID: c.attemptID})
	case route == "/v1/extend" && c.outcome == "lease-lost":
		s.obs.Observe(ctx, idem.Event{Kind: idem.LeaseLost, Key: key, KeyHashed: s.hashKeys, Fence: c.fence, AttemptID: c.attemptID, Reason: "refused"})
	default:
		if outcome, ok := opOutcomes[route][c.outcome]; ok && !c.repeated {
			octx := s.obs.Observe(ctx, idem.Event{Kind: idem.OpStart, Key: key, KeyHashed: s.hashKeys, Policy: c.policy,
				Correlation: c.id, Started: start})
			s.obs.Observe(octx, idem.Event{Kind: idem.OpEnd, Key: key, KeyHashed: s.hashKeys, Policy: c.policy,
				Correlation: c.id, Outcome: outcome, Fence: c.fence, Attempt: c.attempt, AttemptID: c.attemptID,
				Takeover: c.outcome == "takeover", Started: start, Duration: time.Since(start)})
		}
	}
	s.obs.Observe(ctx, idem.Event{Kind: idem.RequestEnd, Method: r.Method, Route: route, Outcome: c.outcome,
		Status: c.status, Started: start, Duration: time.Since(start)})
}
