package otelidem_test

import (
	"context"
	"database/sql"
	"maps"
	"path/filepath"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/otelidem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/memqueue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/sqlitestore"
)

func tracer(t testing.TB) trace.Tracer {
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp.Tracer("test")
}

type recordingPublisher struct {
	got  []queue.Outgoing
	fifo bool
}

func (p *recordingPublisher) Publish(_ context.Context, m queue.Outgoing) (queue.Published, error) {
	p.got = append(p.got, m)
	return queue.Published{ID: "1"}, nil
}

func (p *recordingPublisher) FIFO() bool { return p.fifo }

func TestPublisherInjectsACopy(t *testing.T) {
	ctx, span := tracer(t).Start(context.Background(), "capture")
	defer span.End()
	inner := &recordingPublisher{fifo: true}
	p := otelidem.Publisher(inner)
	attrs := map[string]string{"webhook-source": "stripe"}
	before := maps.Clone(attrs)
	if _, err := p.Publish(ctx, queue.Outgoing{Body: []byte("x"), Attributes: attrs}); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(attrs, before) {
		t.Errorf("the caller's attributes changed: %v", attrs)
	}
	sent := inner.got[0].Attributes
	if sent["webhook-source"] != "stripe" || sent["traceparent"] == "" {
		t.Fatalf("published attributes %v, want the caller's and a traceparent", sent)
	}
	got := trace.SpanContextFromContext(otelidem.Extract(context.Background(), sent))
	if got.TraceID() != span.SpanContext().TraceID() || got.SpanID() != span.SpanContext().SpanID() {
		t.Errorf("traceparent names %v, want the publishing span %v", got, span.SpanContext())
	}
	if f, ok := p.(interface{ FIFO() bool }); !ok || !f.FIFO() {
		t.Error("the wrapper hides the FIFO queue's FIFO method: webhook.Publish would give no group")
	}

	// Without a span there is nothing to carry: the message goes as it is.
	if _, err := p.Publish(context.Background(), queue.Outgoing{Attributes: attrs}); err != nil {
		t.Fatal(err)
	}
	if _, ok := inner.got[1].Attributes["traceparent"]; ok {
		t.Errorf("a publish without a span carries %v", inner.got[1].Attributes)
	}

	// A message written with its own trace context (an outbox row) keeps it.
	row := map[string]string{}
	otelidem.Inject(ctx, row)
	_, other := tracer(t).Start(context.Background(), "relay")
	defer other.End()
	if _, err := p.Publish(trace.ContextWithSpan(context.Background(), other), queue.Outgoing{Attributes: row}); err != nil {
		t.Fatal(err)
	}
	if inner.got[2].Attributes["traceparent"] != row["traceparent"] {
		t.Errorf("the relay's publish replaced the row's traceparent")
	}
}

// The embedded adapters carry the traceparent from publish to receive
// (the brokers: TestBrokersCarryTheTraceContext).
func TestAdaptersCarryTheTraceContext(t *testing.T) {
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	queues, err := sqlqueue.NewSQLite(ctx, st.DB(), sqlqueue.WithGroupCommit(st))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { queues.Close() })
	sq, err := queues.Queue("traced")
	if err != nil {
		t.Fatal(err)
	}
	type adapter interface {
		queue.Publisher
		queue.Source
	}
	for name, q := range map[string]adapter{"memqueue": memqueue.New(), "sqlqueue": sq} {
		t.Run(name, func(t *testing.T) {
			pctx, span := tracer(t).Start(ctx, "publish")
			span.End()
			if _, err := otelidem.Publisher(q).Publish(pctx, queue.Outgoing{Body: []byte("m")}); err != nil {
				t.Fatal(err)
			}
			ds, err := q.Receive(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			got := trace.SpanContextFromContext(otelidem.Extract(ctx, ds[0].Message().Attributes))
			if got.TraceID() != span.SpanContext().TraceID() {
				t.Errorf("received trace %v, want %v", got.TraceID(), span.SpanContext().TraceID())
			}
			_ = ds[0].Ack(ctx)
		})
	}

	// PublishTx through the TxPublisher wrapper.
	pctx, span := tracer(t).Start(ctx, "capture")
	span.End()
	tx, err := st.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := otelidem.TxPublisher[*sql.Tx](sq).PublishTx(pctx, tx, queue.Outgoing{Body: []byte("tx")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	ds, err := sq.Receive(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := trace.SpanContextFromContext(otelidem.Extract(ctx, ds[0].Message().Attributes)); got.TraceID() != span.SpanContext().TraceID() {
		t.Errorf("PublishTx: received trace %v, want %v", got.TraceID(), span.SpanContext().TraceID())
	}

	// sqlqueue's Stats converts to QueueStats.
	s, err := sq.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if qs := otelidem.QueueStats(s); qs.Queue != "traced" || qs.InFlight != 1 {
		t.Errorf("QueueStats(sqlqueue.Stats) = %+v, want the in-flight message of traced", qs)
	}
}

// With nothing set, the program's global propagator is a no-op: Inject
// still writes W3C trace context, and New works on the global no-op
// providers.
func TestDefaultsCarryW3CTraceContext(t *testing.T) {
	ctx, span := tracer(t).Start(context.Background(), "request")
	defer span.End()
	attrs := map[string]string{}
	otelidem.Inject(ctx, attrs)
	if got := attrs["traceparent"]; !strings.Contains(got, span.SpanContext().TraceID().String()) {
		t.Errorf("traceparent %q, want one naming trace %s", got, span.SpanContext().TraceID())
	}
	o := otelidem.New()
	octx := o.Observe(ctx, idem.Event{Kind: idem.OpStart, Key: "k"})
	o.Observe(octx, idem.Event{Kind: idem.OpEnd, Key: "k", Outcome: "executed"})
	if trace.SpanFromContext(octx).SpanContext().TraceID() != span.SpanContext().TraceID() {
		t.Error("on the global no-op tracer, the operation's context lost the caller's trace")
	}
}
