package otelidem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/otelidem"
)

// telemetry is an Observer writing to an in-memory span recorder and a
// manual metric reader.
type telemetry struct {
	obs    *otelidem.Observer
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	tp     *sdktrace.TracerProvider
}

func newTelemetry(t testing.TB, opts ...otelidem.Option) *telemetry {
	t.Helper()
	tel := &telemetry{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tel.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tel.spans), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(tel.reader))
	t.Cleanup(func() {
		_ = tel.tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	tel.obs = otelidem.New(append([]otelidem.Option{otelidem.WithTracerProvider(tel.tp), otelidem.WithMeterProvider(mp)}, opts...)...)
	return tel
}

// collect returns every data point of the metrics, by metric name.
func (tel *telemetry) collect(t testing.TB) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tel.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// sum returns the value of the counter name's point whose attributes
// include want (0 when there is none).
func sum(t testing.TB, ms map[string]metricdata.Aggregation, name string, want ...attribute.KeyValue) int64 {
	t.Helper()
	s, ok := ms[name].(metricdata.Sum[int64])
	if !ok {
		return 0
	}
	var n int64
	for _, dp := range s.DataPoints {
		if hasAll(dp.Attributes, want) {
			n += dp.Value
		}
	}
	return n
}

func hasAll(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

func histCount(t testing.TB, ms map[string]metricdata.Aggregation, name string, want ...attribute.KeyValue) uint64 {
	t.Helper()
	h, ok := ms[name].(metricdata.Histogram[float64])
	if !ok {
		return 0
	}
	var n uint64
	for _, dp := range h.DataPoints {
		if hasAll(dp.Attributes, want) {
			n += dp.Count
		}
	}
	return n
}

func op(ctx context.Context, o idem.Observer, key string, end idem.Event) {
	ctx = o.Observe(ctx, idem.Event{Kind: idem.OpStart, Key: key, Policy: end.Policy, Started: time.Now()})
	end.Kind, end.Key = idem.OpEnd, key
	o.Observe(ctx, end)
}

func TestOperationMetrics(t *testing.T) {
	tel := newTelemetry(t)
	ctx := context.Background()
	outcomes := map[string]int{"executed": 3, "replayed": 2, "busy": 4, "indeterminate": 1, "mismatch": 1, "store-error": 1}
	for outcome, n := range outcomes {
		for range n {
			op(ctx, tel.obs, "k", idem.Event{Outcome: outcome, Duration: time.Millisecond})
		}
	}
	op(ctx, tel.obs, "k", idem.Event{Outcome: "executed", Takeover: true, Fence: 2, Attempt: 2, AttemptID: "a2"})
	op(ctx, tel.obs, "k", idem.Event{Outcome: "indeterminate", Policy: idem.AtMostOnce})
	tel.obs.Observe(ctx, idem.Event{Kind: idem.LeaseLost, Reason: "heartbeat-refused"})
	tel.obs.Observe(ctx, idem.Event{Kind: idem.LeaseLost, Reason: "the lease ran out before the store could be reached"})
	tel.obs.Observe(ctx, idem.Event{Kind: idem.StoreFailed, Op: "claim", Err: errors.New("boom")})

	ms := tel.collect(t)
	outcomes["executed"]++
	for outcome, n := range outcomes {
		if got := sum(t, ms, otelidem.MetricOperations, otelidem.AttrOutcome.String(outcome), otelidem.AttrPolicy.String("at_least_once")); got != int64(n) {
			t.Errorf("%s{outcome=%s} = %d, want %d", otelidem.MetricOperations, outcome, got, n)
		}
	}
	if got := sum(t, ms, otelidem.MetricOperations, otelidem.AttrPolicy.String("at_most_once")); got != 1 {
		t.Errorf("at_most_once operations = %d, want 1", got)
	}
	if got := histCount(t, ms, otelidem.MetricOperationDuration, otelidem.AttrOutcome.String("busy")); got != 4 {
		t.Errorf("busy durations recorded = %d, want 4", got)
	}
	for name, want := range map[string]int64{otelidem.MetricTakeovers: 1, otelidem.MetricIndeterminate: 2,
		otelidem.MetricBusy: 4, otelidem.MetricLeaseLosses: 2, otelidem.MetricStoreErrors: 1} {
		if got := sum(t, ms, name); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	// A reason that is prose is counted as "other": no series per error text.
	if got := sum(t, ms, otelidem.MetricLeaseLosses, otelidem.AttrReason.String("other")); got != 1 {
		t.Errorf("lease losses with reason other = %d, want 1", got)
	}
	if got := sum(t, ms, otelidem.MetricLeaseLosses, otelidem.AttrReason.String("heartbeat-refused")); got != 1 {
		t.Errorf("lease losses with reason heartbeat-refused = %d, want 1", got)
	}
}

// No metric point carries a key, an attempt id or a message id: their
// cardinality would make a series per operation.
func TestMetricsHoldNoKey(t *testing.T) {
	tel := newTelemetry(t)
	ctx := context.Background()
	for _, k := range []string{"order:1", "order:2"} {
		dctx := tel.obs.Observe(ctx, idem.Event{Kind: idem.DeliveryStart, Queue: "orders", MessageID: "m-" + k, Receives: 1})
		op(dctx, tel.obs, k, idem.Event{Outcome: "executed", Fence: 1, Attempt: 1, AttemptID: "att-" + k})
		tel.obs.Observe(dctx, idem.Event{Kind: idem.DeliveryEnd, Queue: "orders", MessageID: "m-" + k, Key: k,
			Outcome: "dead-lettered", Reason: "permanent failure: " + k, Fence: 1, AttemptID: "att-" + k})
	}
	for name, data := range tel.collect(t) {
		var sets []attribute.Set
		switch d := data.(type) {
		case metricdata.Sum[int64]:
			for _, dp := range d.DataPoints {
				sets = append(sets, dp.Attributes)
			}
		case metricdata.Histogram[float64]:
			for _, dp := range d.DataPoints {
				sets = append(sets, dp.Attributes)
			}
		}
		if len(sets) != 1 {
			t.Errorf("%s has %d series for two operations of two keys, want 1", name, len(sets))
		}
		for _, s := range sets {
			for _, kv := range s.ToSlice() {
				if v := kv.Value.Emit(); v == "order:1" || v == "order:2" || v == "att-order:1" || v == "m-order:1" {
					t.Errorf("%s carries %s=%s", name, kv.Key, v)
				}
			}
		}
	}
}

func TestDeliveryAndWebhookMetrics(t *testing.T) {
	tel := newTelemetry(t)
	ctx := context.Background()
	deliver := func(outcome, reason string) {
		dctx := tel.obs.Observe(ctx, idem.Event{Kind: idem.DeliveryStart, Queue: "orders", MessageID: "1", Receives: 1})
		tel.obs.Observe(dctx, idem.Event{Kind: idem.DeliveryEnd, Queue: "orders", Outcome: outcome, Reason: reason})
	}
	deliver("acked", "")
	deliver("acked", "")
	deliver("retried", "")
	deliver("dead-lettered", "mismatch")
	deliver("dead-lettered", "max-receives")
	deliver("dead-lettered", "max-receives")
	hook := func(outcome, reason string, status int) {
		wctx := tel.obs.Observe(ctx, idem.Event{Kind: idem.WebhookStart, Source: "stripe"})
		tel.obs.Observe(wctx, idem.Event{Kind: idem.WebhookEnd, Source: "stripe", Outcome: outcome, Reason: reason, Status: status})
	}
	hook("captured", "", 200)
	hook("replayed", "", 200)
	hook("refused", "signature", 401)
	hook("refused", "signature", 401)
	hook("refused", "store-error", 500)
	tel.obs.Observe(ctx, idem.Event{Kind: idem.RelayPublished, Queue: "orders", Duration: 2 * time.Second})
	tel.obs.Observe(ctx, idem.Event{Kind: idem.RelayRefused, Queue: "orders", Reason: "refused"})

	ms := tel.collect(t)
	orders := attribute.String("messaging.destination.name", "orders")
	checks := []struct {
		name  string
		attrs []attribute.KeyValue
		want  int64
	}{
		{otelidem.MetricDeliveries, []attribute.KeyValue{orders, otelidem.AttrOutcome.String("acked")}, 2},
		{otelidem.MetricDeliveries, []attribute.KeyValue{orders, otelidem.AttrOutcome.String("retried")}, 1},
		{otelidem.MetricDeliveries, []attribute.KeyValue{orders, otelidem.AttrOutcome.String("dead-lettered")}, 3},
		{otelidem.MetricDeadLetters, []attribute.KeyValue{orders, otelidem.AttrReason.String("max-receives")}, 2},
		{otelidem.MetricDeadLetters, []attribute.KeyValue{orders, otelidem.AttrReason.String("mismatch")}, 1},
		{otelidem.MetricWebhookRequests, []attribute.KeyValue{otelidem.AttrWebhookSource.String("stripe")}, 5},
		{otelidem.MetricWebhookRequests, []attribute.KeyValue{otelidem.AttrOutcome.String("captured")}, 1},
		{otelidem.MetricWebhookRefusals, []attribute.KeyValue{otelidem.AttrReason.String("signature")}, 2},
		{otelidem.MetricWebhookRefusals, []attribute.KeyValue{otelidem.AttrReason.String("store-error")}, 1},
		{otelidem.MetricRelayPublished, []attribute.KeyValue{orders}, 1},
		{otelidem.MetricRelayRefused, []attribute.KeyValue{orders, otelidem.AttrReason.String("refused")}, 1},
	}
	for _, c := range checks {
		if got := sum(t, ms, c.name, c.attrs...); got != c.want {
			t.Errorf("%s%v = %d, want %d", c.name, c.attrs, got, c.want)
		}
	}
	h := ms[otelidem.MetricRelayLag].(metricdata.Histogram[float64])
	if len(h.DataPoints) != 1 || h.DataPoints[0].Sum != 2 {
		t.Errorf("relay lag = %+v, want one point of 2 s", h.DataPoints)
	}
}

func TestQueueStatsGauges(t *testing.T) {
	calls := 0
	tel := newTelemetry(t, otelidem.WithQueueStats(func(context.Context) ([]otelidem.QueueStats, error) {
		calls++
		return []otelidem.QueueStats{{Queue: "orders", Ready: 5, InFlight: 2, Delayed: 1, DeadLettered: 3, OldestAge: 90 * time.Second}}, nil
	}), otelidem.WithQueueStats(func(context.Context) ([]otelidem.QueueStats, error) {
		return nil, errors.New("the queue's database is down")
	}))
	ms := tel.collect(t)
	if calls != 1 {
		t.Fatalf("stats called %d times in one collection, want 1", calls)
	}
	g := ms[otelidem.MetricQueueMessages].(metricdata.Gauge[int64])
	got := map[string]int64{}
	for _, dp := range g.DataPoints {
		st, _ := dp.Attributes.Value(otelidem.AttrQueueState)
		got[st.AsString()] = dp.Value
	}
	want := map[string]int64{"ready": 5, "in_flight": 2, "delayed": 1, "dead_lettered": 3}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s{state=%s} = %d, want %d", otelidem.MetricQueueMessages, k, got[k], v)
		}
	}
	age := ms[otelidem.MetricQueueOldestAge].(metricdata.Gauge[float64])
	if len(age.DataPoints) != 1 || age.DataPoints[0].Value != 90 {
		t.Errorf("%s = %+v, want 90", otelidem.MetricQueueOldestAge, age.DataPoints)
	}
}

// A delivery whose message carries a traceparent continues the publisher's
// trace; the operation inside it is its child; the lease events land on the
// operation's span.
func TestDeliveryContinuesThePublishersTrace(t *testing.T) {
	tel := newTelemetry(t, otelidem.WithMessagingSystem("sqlqueue"))
	ctx, pub := tel.tp.Tracer("test").Start(context.Background(), "publish")
	attrs := map[string]string{"other": "x"}
	otelidem.Inject(ctx, attrs)
	pub.End()
	if attrs["traceparent"] == "" {
		t.Fatalf("Inject wrote no traceparent: %v", attrs)
	}

	dctx := tel.obs.Observe(context.Background(), idem.Event{Kind: idem.DeliveryStart, Queue: "orders", MessageID: "7", Receives: 2, Attributes: attrs})
	octx := tel.obs.Observe(dctx, idem.Event{Kind: idem.OpStart, Key: "order:7", KeyHashed: true, Correlation: "c1"})
	tel.obs.Observe(octx, idem.Event{Kind: idem.LeaseExtended, Deadline: time.Now()})
	tel.obs.Observe(octx, idem.Event{Kind: idem.LeaseLost, Reason: "heartbeat-refused"})
	tel.obs.Observe(octx, idem.Event{Kind: idem.OpEnd, Key: "order:7", KeyHashed: true, Outcome: "lease-lost", Fence: 3, Attempt: 2, AttemptID: "att"})
	tel.obs.Observe(dctx, idem.Event{Kind: idem.DeliveryEnd, Queue: "orders", Key: "order:7", KeyHashed: true, Outcome: "dead-lettered", Reason: "max-receives"})

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range tel.spans.Ended() {
		spans[s.Name()] = s
	}
	p, d, o := spans["publish"], spans["process orders"], spans["idem.do"]
	if d == nil || o == nil {
		t.Fatalf("spans ended: %v", tel.spans.Ended())
	}
	if d.SpanContext().TraceID() != p.SpanContext().TraceID() || d.Parent().SpanID() != p.SpanContext().SpanID() {
		t.Errorf("delivery span's parent = %v, want the publisher's span %v", d.Parent(), p.SpanContext())
	}
	if o.Parent().SpanID() != d.SpanContext().SpanID() {
		t.Errorf("operation span's parent = %v, want the delivery span", o.Parent())
	}
	if d.SpanKind() != trace.SpanKindConsumer || d.Status().Code != codes.Error {
		t.Errorf("delivery span: kind %v status %v, want consumer, error", d.SpanKind(), d.Status())
	}
	wantAttrs(t, d, attribute.String("messaging.system", "sqlqueue"), attribute.String("messaging.destination.name", "orders"),
		attribute.String("messaging.message.id", "7"), attribute.String("messaging.operation.type", "process"),
		attribute.Int("idem.receives", 2), attribute.String("idem.outcome", "dead-lettered"),
		attribute.String("idem.reason", "max-receives"), attribute.String("idem.key_hash", "order:7"))
	wantAttrs(t, o, attribute.String("idem.key_hash", "order:7"), attribute.String("idem.outcome", "lease-lost"),
		attribute.Int64("idem.fence", 3), attribute.Int("idem.attempt", 2), attribute.String("idem.attempt_id", "att"),
		attribute.Bool("idem.takeover", false), attribute.String("idem.correlation_id", "c1"),
		attribute.String("idem.policy", "at_least_once"))
	if o.Status().Code != codes.Error {
		t.Errorf("lease-lost operation's status = %v, want error", o.Status())
	}
	var events []string
	for _, ev := range o.Events() {
		events = append(events, ev.Name)
	}
	if len(events) != 2 || events[0] != "idem.lease.extended" || events[1] != "idem.lease.lost" {
		t.Errorf("operation span's events = %v, want lease extended then lost", events)
	}
}

func TestHTTPSpans(t *testing.T) {
	tel := newTelemetry(t)
	ctx := context.Background()
	rctx := tel.obs.Observe(ctx, idem.Event{Kind: idem.RequestStart, Method: "POST", Route: "/orders"})
	tel.obs.Observe(rctx, idem.Event{Kind: idem.RequestEnd, Method: "POST", Route: "/orders", Outcome: "store-error", Status: 503})
	wctx := tel.obs.Observe(ctx, idem.Event{Kind: idem.WebhookStart, Source: "github"})
	tel.obs.Observe(wctx, idem.Event{Kind: idem.WebhookEnd, Source: "github", Outcome: "refused", Reason: "signature", Status: 401})

	bare := tel.obs.Observe(ctx, idem.Event{Kind: idem.RequestStart, Method: "PUT"})
	tel.obs.Observe(bare, idem.Event{Kind: idem.RequestEnd, Method: "PUT", Outcome: "executed", Status: 201})

	ended := tel.spans.Ended()
	if len(ended) != 3 {
		t.Fatalf("%d spans, want 3", len(ended))
	}
	if ended[2].Name() != "PUT" {
		t.Errorf("a request without a route is span %q, want PUT", ended[2].Name())
	}
	r, w := ended[0], ended[1]
	if r.Name() != "POST /orders" || r.SpanKind() != trace.SpanKindServer || r.Status().Code != codes.Error {
		t.Errorf("request span %q kind %v status %v, want POST /orders, server, error (a 5xx)", r.Name(), r.SpanKind(), r.Status())
	}
	wantAttrs(t, r, attribute.String("http.request.method", "POST"), attribute.String("http.route", "/orders"),
		attribute.Int("http.response.status_code", 503), attribute.String("idem.outcome", "store-error"))
	if w.Name() != "webhook github" || w.Status().Code == codes.Error {
		t.Errorf("webhook span %q status %v, want webhook github, not an error (a 4xx is the sender's)", w.Name(), w.Status())
	}
	wantAttrs(t, w, attribute.String("idem.webhook.source", "github"), attribute.Int("http.response.status_code", 401),
		attribute.String("idem.reason", "signature"))
}

// Observers chained with idem.Observers pass the span on: the second sees
// the first's context.
func TestObserversCarryTheSpan(t *testing.T) {
	tel := newTelemetry(t)
	var seen trace.SpanContext
	after := idem.ObserverFunc(func(ctx context.Context, e idem.Event) context.Context {
		if e.Kind == idem.OpEnd {
			seen = trace.SpanContextFromContext(ctx)
		}
		return ctx
	})
	o := idem.Observers(tel.obs, after)
	op(context.Background(), o, "k", idem.Event{Outcome: "executed"})
	if ended := tel.spans.Ended(); len(ended) != 1 || seen.SpanID() != ended[0].SpanContext().SpanID() {
		t.Errorf("the next observer saw span %v, want the operation's", seen)
	}
}

func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want ...attribute.KeyValue) {
	t.Helper()
	got := attribute.NewSet(s.Attributes()...)
	for _, kv := range want {
		if v, ok := got.Value(kv.Key); !ok || v != kv.Value {
			t.Errorf("span %q: %s = %v (set %v), want %v", s.Name(), kv.Key, v.Emit(), ok, kv.Value.Emit())
		}
	}
}

// A consumer running inside a span of its own (a Lambda invocation's)
// keeps the publisher's span as the delivery's parent and links its own.
func TestDeliveryLinksTheConsumersSpan(t *testing.T) {
	tel := newTelemetry(t)
	pctx, pub := tel.tp.Tracer("test").Start(context.Background(), "publish")
	attrs := map[string]string{}
	otelidem.Inject(pctx, attrs)
	pub.End()
	cctx, invocation := tel.tp.Tracer("test").Start(context.Background(), "invocation")
	dctx := tel.obs.Observe(cctx, idem.Event{Kind: idem.DeliveryStart, Queue: "q", Attributes: attrs})
	tel.obs.Observe(dctx, idem.Event{Kind: idem.DeliveryEnd, Queue: "q", Outcome: "acked"})
	invocation.End()
	var d sdktrace.ReadOnlySpan
	for _, s := range tel.spans.Ended() {
		if s.Name() == "process q" {
			d = s
		}
	}
	if d == nil || d.Parent().SpanID() != pub.SpanContext().SpanID() {
		t.Fatalf("delivery span %v: want the publisher's span as parent", d)
	}
	if links := d.Links(); len(links) != 1 || links[0].SpanContext.SpanID() != invocation.SpanContext().SpanID() {
		t.Errorf("delivery span's links = %v, want the invocation's span", links)
	}
}
