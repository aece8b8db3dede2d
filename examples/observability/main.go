// Command observability runs the webhook → queue → consumer → effect
// pipeline of examples/webhooks with package otelidem attached: it sends
// itself a few signed payment notifications (one twice, one forged),
// drains the queue, prints the trace of one event from the webhook request
// to the effect, and the idem_* metrics a Prometheus scrape of /metrics
// reads. With -addr it then keeps serving /metrics and the webhook
// endpoint until interrupted.
//
//	go run ./examples/observability
//	go run ./examples/observability -addr 127.0.0.1:9464   # then curl 127.0.0.1:9464/metrics
package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/otelidem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/sqlitestore"
	"github.com/idemkit/idem/webhook"
)

// secret is the Standard Webhooks example secret.
const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

func main() {
	addr := flag.String("addr", "", "keep serving /metrics and POST /hooks/payments on this address after the run")
	db := flag.String("db", "", "the SQLite file (default: a new one in a temporary directory)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, *db, *addr); err != nil {
		fmt.Fprintln(os.Stderr, "observability:", err)
		os.Exit(1)
	}
}

// run runs the demo, writing what it shows to out.
func run(ctx context.Context, out io.Writer, db, addr string) error {
	if db == "" {
		dir, err := os.MkdirTemp("", "idem-observability")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		db = filepath.Join(dir, "idem.db")
	}

	// Telemetry: spans kept in memory to print; metrics exported to a
	// Prometheus registry served on /metrics. A real program would give
	// the TracerProvider an OTLP exporter instead.
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	defer mp.Shutdown(context.Background())

	// The pipeline: examples/webhooks with the observer and traced
	// publishers.
	st, err := sqlitestore.Open(ctx, db)
	if err != nil {
		return err
	}
	defer st.Close()
	queues, err := sqlqueue.NewSQLite(ctx, st.DB(), sqlqueue.WithGroupCommit(st))
	if err != nil {
		return err
	}
	defer queues.Close()
	events, err := queues.Queue("payment-events", sqlqueue.WithVisibility(3*time.Minute))
	if err != nil {
		return err
	}
	obs := otelidem.New(otelidem.WithTracerProvider(tp), otelidem.WithMeterProvider(mp),
		otelidem.WithMessagingSystem("sqlqueue"),
		otelidem.WithQueueStats(func(ctx context.Context) ([]otelidem.QueueStats, error) {
			s, err := events.Stats(ctx)
			return []otelidem.QueueStats{otelidem.QueueStats(s)}, err
		}))
	log := slog.New(slog.DiscardHandler)
	l := idem.New(st, idem.WithObserver(obs), idem.WithLogger(log))
	scheme, err := webhook.NewStandard(secret)
	if err != nil {
		return err
	}
	receiver, err := webhook.NewReceiver("payments", scheme, l,
		webhook.PublishTx[*sql.Tx](otelidem.TxPublisher[*sql.Tx](events)), webhook.WithLogger(log))
	if err != nil {
		return err
	}
	effect := func(ctx context.Context, m queue.Message) ([]byte, error) {
		var p struct {
			OrderID string `json:"order_id"`
		}
		if err := json.Unmarshal(m.Body, &p); err != nil || p.OrderID == "" {
			return nil, queue.Undecodable(fmt.Errorf("payment %q: %v", m.Body, err))
		}
		// The effect's own span, a child of the handler's operation.
		_, span := tp.Tracer("example").Start(ctx, "mark paid "+p.OrderID)
		defer span.End()
		return []byte("paid"), nil
	}
	worker, err := queue.NewConsumer(events, l, webhook.EventKey, effect, queue.WithLogger(log))
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("POST /hooks/payments", receiver)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	base := "http://" + ln.Addr().String()

	// The provider's deliveries: three events, the first delivered twice,
	// and a forged one.
	for _, d := range []struct {
		id, order string
		forged    bool
	}{{"evt_1", "o-1", false}, {"evt_2", "o-2", false}, {"evt_3", "o-3", false}, {"evt_1", "o-1", false}, {"evt_x", "o-x", true}} {
		status, err := deliver(ctx, base+"/hooks/payments", d.id, `{"type":"payment.succeeded","order_id":"`+d.order+`"}`, d.forged)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "webhook %s: %d\n", d.id, status)
	}
	run, stopWorker := context.WithCancel(ctx)
	defer stopWorker()
	stopped := make(chan error, 1)
	go func() { stopped <- worker.Run(run) }()
	for {
		s, err := events.Stats(ctx)
		if err != nil {
			return err
		}
		if s.Ready+s.InFlight+s.Delayed == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}

	fmt.Fprintln(out, "\nthe trace of evt_2, from the webhook request to the effect:")
	printTrace(out, spans.Ended(), "mark paid o-2")
	fmt.Fprintln(out, "\nidem metrics, as Prometheus scrapes them from /metrics:")
	if err := printMetrics(out, base+"/metrics"); err != nil {
		return err
	}
	if addr != "127.0.0.1:0" {
		fmt.Fprintf(out, "\nserving %s/metrics and POST %s/hooks/payments; interrupt to stop\n", base, base)
		<-ctx.Done()
	}
	stopWorker()
	return <-stopped
}

// deliver posts a notification signed as the provider signs it (with the
// wrong body when forged).
func deliver(ctx context.Context, url, id, body string, forged bool) (int, error) {
	scheme, _ := webhook.NewStandard(secret)
	now := time.Now()
	signed := body
	if forged {
		signed += " "
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Webhook-Id", id)
	req.Header.Set("Webhook-Timestamp", fmt.Sprint(now.Unix()))
	req.Header.Set("Webhook-Signature", scheme.Sign(id, now, []byte(signed)))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, res.Body)
	return res.StatusCode, nil
}

// printTrace prints the ancestry of the span named leaf, root first, with
// the trace id and each span's kind.
func printTrace(out io.Writer, spans []sdktrace.ReadOnlySpan, leaf string) {
	byID := map[string]sdktrace.ReadOnlySpan{}
	var last sdktrace.ReadOnlySpan
	for _, s := range spans {
		byID[s.SpanContext().SpanID().String()] = s
		if s.Name() == leaf {
			last = s
		}
	}
	if last == nil {
		fmt.Fprintln(out, "  (no such span)")
		return
	}
	var chain []sdktrace.ReadOnlySpan
	for s := last; s != nil; s = byID[s.Parent().SpanID().String()] {
		chain = append([]sdktrace.ReadOnlySpan{s}, chain...)
		if !s.Parent().IsValid() {
			break
		}
	}
	fmt.Fprintf(out, "  trace %s\n", last.SpanContext().TraceID())
	for i, s := range chain {
		fmt.Fprintf(out, "  %s%s (%s)\n", strings.Repeat("  ", i), s.Name(), s.SpanKind())
	}
}

// printMetrics prints the idem_* samples of a scrape of url, histograms'
// buckets left out, without the scope labels every sample carries.
func printMetrics(out io.Writer, url string) error {
	res, err := http.Get(url)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return errors.New("/metrics: " + res.Status)
	}
	var lines []string
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "idem_") || strings.Contains(line, "_bucket{") || strings.Contains(line, "_sum{") {
			continue
		}
		for _, l := range []string{`otel_scope_name="github.com/idemkit/idem/otelidem",`, `otel_scope_schema_url="",`, `otel_scope_version="",`, `,otel_scope_version=""`} {
			line = strings.ReplaceAll(line, l, "")
		}
		lines = append(lines, "  "+line)
	}
	sort.Strings(lines)
	fmt.Fprintln(out, strings.Join(lines, "\n"))
	return sc.Err()
}
