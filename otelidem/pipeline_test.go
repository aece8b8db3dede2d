package otelidem_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testobserve"
	"github.com/idemkit/idem/internal/testproc"
	"github.com/idemkit/idem/otelidem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/sqlitestore"
	"github.com/idemkit/idem/webhook"
)

// The environment of TestPipeline's child processes.
const (
	envPipelineRole  = "OTELIDEM_TEST_PIPELINE_ROLE" // "crash" or "consume"
	envPipelineDB    = "OTELIDEM_TEST_PIPELINE_DB"
	envPipelineSpans = "OTELIDEM_TEST_PIPELINE_SPANS" // where "consume" writes its spans
)

const (
	hookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	// The queue's visibility: a delivery of a killed consumer comes back
	// after it. The crashed attempt's lease is shorter, so the redelivery
	// finds it lapsed: a takeover.
	pipelineVisibility = 3 * time.Second
	crashedLease       = time.Second
)

// pipeline is the webhook Receiver, the queue and a consumer's ledger on
// one SQLite file, as examples/webhooks runs them.
type pipeline struct {
	store  *sqlitestore.Store
	queues *sqlqueue.SQLite
	events *sqlqueue.SQLiteQueue
}

func openPipeline(t testing.TB, path string) *pipeline {
	t.Helper()
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	queues, err := sqlqueue.NewSQLite(ctx, st.DB(), sqlqueue.WithGroupCommit(st))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { queues.Close() })
	events, err := queues.Queue("payment-events", sqlqueue.WithVisibility(pipelineVisibility))
	if err != nil {
		t.Fatal(err)
	}
	return &pipeline{store: st, queues: queues, events: events}
}

// receiver serves the webhook Receiver on l, capturing into the queue with
// the request's trace context.
func (p *pipeline) receiver(t testing.TB, l *idem.Ledger) *httptest.Server {
	t.Helper()
	scheme, err := webhook.NewStandard(hookSecret)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := webhook.NewReceiver("payments", scheme, l, webhook.PublishTx[*sql.Tx](otelidem.TxPublisher[*sql.Tx](p.events)),
		webhook.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(rc)
	t.Cleanup(hs.Close)
	return hs
}

// consumer handles the events with effect under l: the key is the event's
// (webhook.EventKey) and the body its fingerprint, so a second message of
// one event with another body is a mismatch.
func (p *pipeline) consumer(t testing.TB, l *idem.Ledger, effect queue.Handler) *queue.Consumer {
	t.Helper()
	c, err := queue.NewConsumer(p.events, l, webhook.EventKey, effect,
		queue.WithHandlerTimeout(pipelineVisibility/6), queue.WithBusyDelay(50*time.Millisecond),
		queue.WithLogger(slog.New(slog.DiscardHandler)),
		queue.WithCallOptions(func(m queue.Message) []idem.CallOption {
			return []idem.CallOption{idem.Fingerprint(m.Body)}
		}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// drain runs c until the queue holds nothing but dead letters.
func (p *pipeline) drain(t testing.TB, c *queue.Consumer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	run, stop := context.WithCancel(ctx)
	wg.Go(func() { _ = c.Run(run) })
	defer func() { stop(); wg.Wait() }()
	for {
		st, err := p.events.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Ready+st.InFlight+st.Delayed == 0 {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("the queue was not drained: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// deliver sends a signed event as the payment provider does (a wrong
// signature when forged) and returns the status.
func deliver(t testing.TB, ctx context.Context, url, id, body string, forged bool) int {
	t.Helper()
	scheme, _ := webhook.NewStandard(hookSecret)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	sig := scheme.Sign(id, now, []byte(body))
	if forged {
		sig = scheme.Sign(id, now, []byte(body+" "))
	}
	req.Header.Set("Webhook-Id", id)
	req.Header.Set("Webhook-Timestamp", fmt.Sprint(now.Unix()))
	req.Header.Set("Webhook-Signature", sig)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// TestPipeline runs webhook → sqlqueue → consumer → effect with redeliveries
// (of webhooks, and of the queue after a consumer process is killed
// mid-effect), a mismatch, a busy key, an undecodable message and a forged
// signature, then checks that each metric, read in memory and from a real
// Prometheus scrape, equals what the test did; and that one trace runs from
// the webhook request to the effect, in this process and across a process
// boundary (the consumer in a child process, its spans written to a file).
func TestPipeline(t *testing.T) {
	switch os.Getenv(envPipelineRole) {
	case "crash":
		pipelineCrashChild(t)
		return
	case "consume":
		pipelineConsumeChild(t)
		return
	}
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "idem.db")
	p := openPipeline(t, path)

	// This process's telemetry: spans in memory, metrics read by hand and
	// by a Prometheus scrape; the recorder tallies the raw events.
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader), sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(ctx); _ = tp.Shutdown(ctx) })
	scrapeURL := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(scrapeURL.Close)
	var rec testobserve.Recorder
	sawBusy := make(chan struct{})
	var busyOnce sync.Once
	signal := idem.ObserverFunc(func(ctx context.Context, e idem.Event) context.Context {
		if e.Kind == idem.OpEnd && e.Outcome == "busy" {
			busyOnce.Do(func() { close(sawBusy) })
		}
		return ctx
	})
	obs := otelidem.New(otelidem.WithTracerProvider(tp), otelidem.WithMeterProvider(mp), otelidem.WithMessagingSystem("sqlqueue"),
		otelidem.WithQueueStats(func(ctx context.Context) ([]otelidem.QueueStats, error) {
			s, err := p.events.Stats(ctx)
			return []otelidem.QueueStats{otelidem.QueueStats(s)}, err
		}))
	l := idem.New(p.store, idem.WithObserver(idem.Observers(obs, &rec, signal)), idem.WithLogger(slog.New(slog.DiscardHandler)))
	hook := p.receiver(t, l)

	// A provider sends no trace context: each event's trace begins at the
	// Receiver's span.
	send := func(id, body string, forged bool) int { return deliver(t, ctx, hook.URL, id, body, forged) }
	body := func(order string) string { return `{"type":"payment.succeeded","order_id":"` + order + `"}` }

	// 1. The event whose consumer is killed mid-effect, in a child process.
	if got := send("evt_crash", body("o-crash"), false); got != 200 {
		t.Fatalf("evt_crash: %d", got)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if seen := testproc.KillAtLine(cctx, t, "TestPipeline", []string{envPipelineRole + "=crash", envPipelineDB + "=" + path}, "EFFECT STARTED"); len(seen) > 0 && !strings.Contains(strings.Join(seen, "\n"), "RUN") {
		t.Logf("crash child said:\n%s", strings.Join(seen, "\n"))
	}

	// 2. Events, two of them delivered twice by the sender, one forged.
	for _, id := range []string{"evt_1", "evt_2", "evt_3"} {
		if got := send(id, body("o-"+id), false); got != 200 {
			t.Fatalf("%s: %d", id, got)
		}
	}
	for _, id := range []string{"evt_1", "evt_2"} {
		if got := send(id, body("o-"+id), false); got != 200 {
			t.Fatalf("%s again: %d", id, got)
		}
	}
	if got := send("evt_forged", body("o-x"), true); got != 401 {
		t.Fatalf("forged: %d, want 401", got)
	}
	// 3. Messages no Receiver captured: a second copy of evt_3 (busy while
	// evt_3 runs, then replayed), evt_2 with another body (a mismatch), and
	// one without an event id (undecodable).
	attrs := func(id string) map[string]string {
		return map[string]string{webhook.AttrSource: "payments", webhook.AttrEventID: id, webhook.AttrVerified: "true"}
	}
	for _, m := range []queue.Outgoing{
		{Body: []byte(body("o-evt_3")), Attributes: attrs("evt_3")},
		{Body: []byte(body("o-other")), Attributes: attrs("evt_2")},
		{Body: []byte("{}")},
	} {
		if _, err := p.events.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}

	// 4. The restarted worker drains the queue. evt_3's effect waits until
	// its copy was answered busy, so that the key is busy for sure.
	var effects sync.Map // order id → times done
	var ran atomic.Int64
	effect := func(ctx context.Context, m queue.Message) ([]byte, error) {
		var ev struct {
			OrderID string `json:"order_id"`
		}
		if err := json.Unmarshal(m.Body, &ev); err != nil || ev.OrderID == "" {
			return nil, queue.Undecodable(fmt.Errorf("no order id"))
		}
		_, span := tp.Tracer("app").Start(ctx, "effect "+ev.OrderID)
		defer span.End()
		if ev.OrderID == "o-evt_3" {
			select {
			case <-sawBusy:
			case <-time.After(pipelineVisibility / 12):
			}
		}
		n, _ := effects.LoadOrStore(ev.OrderID, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		ran.Add(1)
		return []byte("done"), nil
	}
	p.drain(t, p.consumer(t, l, effect))
	if err := rec.Check(); err != nil {
		t.Fatal(err)
	}

	// What the test did, and so what each metric must say.
	var busy, retried int64
	for _, r := range rec.Events() {
		switch {
		case r.Event.Kind == idem.OpEnd && r.Event.Outcome == "busy":
			busy++
		case r.Event.Kind == idem.DeliveryEnd && r.Event.Outcome == "retried":
			retried++
		}
	}
	if busy == 0 {
		t.Fatal("no busy answer: evt_3's copy did not meet its key held")
	}
	if ran.Load() != 4 {
		t.Fatalf("effects ran %d times, want 4 (evt_crash again after its takeover, evt_1, evt_2, evt_3)", ran.Load())
	}
	payments := otelidem.AttrWebhookSource.String("payments")
	dest := attribute.String("messaging.destination.name", "payment-events")
	want := []struct {
		name, prom string
		attrs      []attribute.KeyValue
		n          int64
	}{
		// Captures 4 + effects 4 (the takeover among them).
		{otelidem.MetricOperations, "idem_operations_total", []attribute.KeyValue{otelidem.AttrOutcome.String("executed")}, 8},
		// The sender's 2 redeliveries, and evt_3's copy once evt_3 was done.
		{otelidem.MetricOperations, "idem_operations_total", []attribute.KeyValue{otelidem.AttrOutcome.String("replayed")}, 3},
		{otelidem.MetricOperations, "idem_operations_total", []attribute.KeyValue{otelidem.AttrOutcome.String("mismatch")}, 1},
		{otelidem.MetricOperations, "idem_operations_total", []attribute.KeyValue{otelidem.AttrOutcome.String("busy")}, busy},
		{otelidem.MetricBusy, "idem_busy_total", nil, busy},
		{otelidem.MetricTakeovers, "idem_takeovers_total", nil, 1},
		{otelidem.MetricIndeterminate, "idem_indeterminate_total", nil, 0},
		{otelidem.MetricWebhookRequests, "idem_webhook_requests_total", []attribute.KeyValue{payments, otelidem.AttrOutcome.String("captured")}, 4},
		{otelidem.MetricWebhookRequests, "idem_webhook_requests_total", []attribute.KeyValue{payments, otelidem.AttrOutcome.String("replayed")}, 2},
		{otelidem.MetricWebhookRefusals, "idem_webhook_refusals_total", []attribute.KeyValue{payments, otelidem.AttrReason.String("signature")}, 1},
		// evt_crash (its second receive), evt_1, evt_2, evt_3, evt_3's copy.
		{otelidem.MetricDeliveries, "idem_deliveries_total", []attribute.KeyValue{dest, otelidem.AttrOutcome.String("acked")}, 5},
		{otelidem.MetricDeliveries, "idem_deliveries_total", []attribute.KeyValue{dest, otelidem.AttrOutcome.String("retried")}, busy},
		{otelidem.MetricDeliveries, "idem_deliveries_total", []attribute.KeyValue{dest, otelidem.AttrOutcome.String("dead-lettered")}, 2},
		{otelidem.MetricDeadLetters, "idem_dead_letters_total", []attribute.KeyValue{dest, otelidem.AttrReason.String("mismatch")}, 1},
		{otelidem.MetricDeadLetters, "idem_dead_letters_total", []attribute.KeyValue{dest, otelidem.AttrReason.String("undecodable")}, 1},
	}
	if retried != busy {
		t.Errorf("%d deliveries retried for %d busy answers: each retry here is a busy key", retried, busy)
	}
	ms := (&telemetry{reader: reader}).collect(t)
	scraped := scrapeSeries(t, scrapeURL.URL)
	for _, w := range want {
		if got := sum(t, ms, w.name, w.attrs...); got != w.n {
			t.Errorf("in memory: %s%v = %d, want %d", w.name, w.attrs, got, w.n)
		}
		if got := scraped.sum(w.prom, w.attrs...); got != float64(w.n) {
			t.Errorf("scraped: %s%v = %v, want %d", w.prom, w.attrs, got, w.n)
		}
	}
	if got := scraped.sum("idem_queue_messages", dest, otelidem.AttrQueueState.String("dead_lettered")); got != 2 {
		t.Errorf("scraped: dead-lettered messages in the queue = %v, want 2", got)
	}

	// One trace from the sender's request to evt_1's effect, in process.
	checkTrace(t, spanInfos(spans.Ended()), "effect o-evt_1")

	// 5. Across a process boundary: this process receives the webhook and
	// captures it; a child process consumes it and writes its spans.
	if got := send("evt_far", body("o-far"), false); got != 200 {
		t.Fatalf("evt_far: %d", got)
	}
	spanFile := filepath.Join(dir, "spans.json")
	cmd := exec.CommandContext(cctx, os.Args[0], "-test.run=^TestPipeline$", "-test.count=1")
	cmd.Env = append(os.Environ(), envPipelineRole+"=consume", envPipelineDB+"="+path, envPipelineSpans+"="+spanFile)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("consumer process: %v\n%s", err, out)
	}
	raw, err := os.ReadFile(spanFile)
	if err != nil {
		t.Fatal(err)
	}
	var far []spanInfo
	if err := json.Unmarshal(raw, &far); err != nil {
		t.Fatal(err)
	}
	checkTrace(t, append(spanInfos(spans.Ended()), far...), "effect o-far")
	for _, s := range far {
		if strings.HasPrefix(s.Name, "webhook") {
			t.Errorf("the child process recorded %q: the spans did not come from it", s.Name)
		}
	}
}

// pipelineCrashChild consumes with a handler that says EFFECT STARTED and
// never returns: the parent kills the process there, mid-effect.
func pipelineCrashChild(t *testing.T) {
	p := openPipeline(t, os.Getenv(envPipelineDB))
	l := idem.New(p.store, idem.WithLease(crashedLease), idem.WithOwner("doomed"), idem.WithLogger(slog.New(slog.DiscardHandler)))
	c := p.consumer(t, l, func(ctx context.Context, m queue.Message) ([]byte, error) {
		fmt.Println("EFFECT STARTED")
		select {}
	})
	_ = c.Run(context.Background())
}

// pipelineConsumeChild drains the queue with its own telemetry and writes
// its spans to the file the parent reads.
func pipelineConsumeChild(t *testing.T) {
	p := openPipeline(t, os.Getenv(envPipelineDB))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	l := idem.New(p.store, idem.WithObserver(otelidem.New(otelidem.WithTracerProvider(tp))), idem.WithLogger(slog.New(slog.DiscardHandler)))
	p.drain(t, p.consumer(t, l, func(ctx context.Context, m queue.Message) ([]byte, error) {
		var ev struct {
			OrderID string `json:"order_id"`
		}
		_ = json.Unmarshal(m.Body, &ev)
		_, span := tp.Tracer("app").Start(ctx, "effect "+ev.OrderID)
		span.End()
		return nil, nil
	}))
	b, err := json.Marshal(spanInfos(spans.Ended()))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(os.Getenv(envPipelineSpans), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// spanInfo is what the trace check needs of a span, as a child process
// writes it.
type spanInfo struct {
	Name, Trace, ID, Parent string
}

func spanInfos(ss []sdktrace.ReadOnlySpan) []spanInfo {
	out := make([]spanInfo, len(ss))
	for i, s := range ss {
		out[i] = spanInfo{Name: s.Name(), Trace: s.SpanContext().TraceID().String(), ID: s.SpanContext().SpanID().String()}
		if s.Parent().IsValid() {
			out[i].Parent = s.Parent().SpanID().String()
		}
	}
	return out
}

// checkTrace checks that the span named to descends from a webhook
// request's span through its capture, the delivery and the operation, all
// in one trace.
func checkTrace(t *testing.T, spans []spanInfo, to string) {
	t.Helper()
	byID := map[string]spanInfo{}
	var leaf *spanInfo
	for i, s := range spans {
		byID[s.ID] = s
		if s.Name == to {
			leaf = &spans[i]
		}
	}
	if leaf == nil {
		t.Fatalf("no span %q among %v", to, spans)
	}
	var chain []string
	for s, ok := *leaf, true; ok; s, ok = byID[s.Parent] {
		chain = append([]string{s.Name}, chain...)
		if s.Trace != leaf.Trace {
			t.Errorf("span %q is in trace %s, its descendant %q in %s", s.Name, s.Trace, to, leaf.Trace)
		}
		if s.Parent == "" {
			break
		}
	}
	// The Receiver's request, its capture's operation, the delivery of
	// the message it published, the handler's operation, the effect.
	wantChain := []string{"webhook payments", "idem.do", "process payment-events", "idem.do", to}
	if strings.Join(chain, " > ") != strings.Join(wantChain, " > ") {
		t.Errorf("trace of %q: %s\nwant %s", to, strings.Join(chain, " > "), strings.Join(wantChain, " > "))
	}
}

// series are a scrape's samples, by metric name.
type series map[string][]sample

type sample struct {
	labels map[string]string
	value  float64
}

func scrapeSeries(t testing.TB, url string) series {
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
	out := series{}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			s := sample{labels: map[string]string{}, value: m.GetCounter().GetValue() + m.GetGauge().GetValue()}
			for _, l := range m.GetLabel() {
				s.labels[l.GetName()] = l.GetValue()
			}
			out[name] = append(out[name], s)
		}
	}
	return out
}

// sum adds the samples of name whose labels include want (an attribute's
// key with its dots made underscores, as the exporter names labels).
func (s series) sum(name string, want ...attribute.KeyValue) float64 {
	var n float64
	for _, smp := range s[name] {
		ok := true
		for _, kv := range want {
			if smp.labels[strings.ReplaceAll(string(kv.Key), ".", "_")] != kv.Value.Emit() {
				ok = false
			}
		}
		if ok {
			n += smp.value
		}
	}
	return n
}
