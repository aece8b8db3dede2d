package otelidem_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/otelidem"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/sqlitestore"
	"github.com/idemkit/idem/webhook"
)

// The wiring of docs/observability.md: the observer on the Ledger (the
// consumer and the Receiver on it report too), the queue's stats as
// gauges, and publishers that carry the trace context. A message
// published inside a request's span is handled in that same trace.
func Example() {
	ctx := context.Background()
	// The program's providers: in memory here; an OTLP or Prometheus
	// exporter in production (or otel.SetTracerProvider and
	// otel.SetMeterProvider, which otelidem.New uses by default).
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))

	dir, _ := os.MkdirTemp("", "otelidem-example")
	defer os.RemoveAll(dir)
	st, err := sqlitestore.Open(ctx, filepath.Join(dir, "idem.db"))
	if err != nil {
		panic(err)
	}
	defer st.Close()
	queues, _ := sqlqueue.NewSQLite(ctx, st.DB(), sqlqueue.WithGroupCommit(st))
	defer queues.Close()
	events, _ := queues.Queue("events")

	obs := otelidem.New(otelidem.WithTracerProvider(tp), otelidem.WithMeterProvider(mp),
		otelidem.WithMessagingSystem("sqlqueue"),
		otelidem.WithQueueStats(func(ctx context.Context) ([]otelidem.QueueStats, error) {
			s, err := events.Stats(ctx)
			return []otelidem.QueueStats{otelidem.QueueStats(s)}, err
		}))
	discard := slog.New(slog.DiscardHandler)
	l := idem.New(st, idem.WithObserver(obs), idem.WithLogger(discard))

	// A webhook Receiver whose captured events carry the request's trace.
	scheme, _ := webhook.NewStandard("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	_, err = webhook.NewReceiver("payments", scheme, l, webhook.PublishTx[*sql.Tx](otelidem.TxPublisher[*sql.Tx](events)))
	if err != nil {
		panic(err)
	}

	// An outbox: rows written with otelidem.TxPublisher carry the trace
	// of the transaction's request; the relay reports to the observer
	// and publishes through otelidem.Publisher, which keeps a row's
	// trace.
	outboxRows, _ := queues.Queue("outbox")
	if _, err := outbox.NewRelay(outboxRows, otelidem.Publisher(events), outbox.WithObserver(obs)); err != nil {
		panic(err)
	}
	_ = otelidem.TxPublisher[*sql.Tx](outboxRows) // for outbox.PublishTx(ctx, ..., tx, key, m)

	// Code that publishes itself: the message carries its span's
	// traceparent.
	rctx, request := tp.Tracer("shop").Start(ctx, "POST /orders")
	_, err = otelidem.Publisher(events).Publish(rctx, queue.Outgoing{Body: []byte("order 42"), Attributes: map[string]string{"order": "42"}})
	request.End()
	if err != nil {
		panic(err)
	}

	// The consumer continues each message's trace.
	worker, _ := queue.NewConsumer(events, l,
		func(m queue.Message) (idem.OperationKey, error) { return idem.Key("order", m.Attributes["order"]), nil },
		func(ctx context.Context, m queue.Message) ([]byte, error) { return nil, nil },
		queue.WithLogger(discard))
	run, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- worker.Run(run) }()
	for s, _ := events.Stats(ctx); s.Ready+s.InFlight+s.Delayed > 0; s, _ = events.Stats(ctx) {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	<-done

	for _, s := range spans.Ended() {
		fmt.Printf("%s: in the request's trace: %v\n", s.Name(), s.SpanContext().TraceID() == request.SpanContext().TraceID())
	}
	var rm metricdata.ResourceMetrics
	_ = reader.Collect(ctx, &rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == otelidem.MetricOperations {
			for _, dp := range sum.DataPoints {
				outcome, _ := dp.Attributes.Value(otelidem.AttrOutcome)
				fmt.Printf("%s{%s} %d\n", m.Name, outcome.Emit(), dp.Value)
			}
		}
	}
	// Output:
	// POST /orders: in the request's trace: true
	// idem.do: in the request's trace: true
	// process events: in the request's trace: true
	// idem.operations{executed} 1
}
