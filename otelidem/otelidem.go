package otelidem

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
)

// ScopeName is the instrumentation scope of otelidem's tracer and meter.
const ScopeName = "github.com/idemkit/idem/otelidem"

// Attribute keys of idem's own, under idem.*.
const (
	AttrKey           = attribute.Key("idem.key")
	AttrKeyHash       = attribute.Key("idem.key_hash")
	AttrOutcome       = attribute.Key("idem.outcome")
	AttrReason        = attribute.Key("idem.reason")
	AttrPolicy        = attribute.Key("idem.policy")
	AttrFence         = attribute.Key("idem.fence")
	AttrAttempt       = attribute.Key("idem.attempt")
	AttrAttemptID     = attribute.Key("idem.attempt_id")
	AttrTakeover      = attribute.Key("idem.takeover")
	AttrCorrelationID = attribute.Key("idem.correlation_id")
	AttrReceives      = attribute.Key("idem.receives")
	AttrStoreOp       = attribute.Key("idem.store.op")
	AttrWebhookSource = attribute.Key("idem.webhook.source")
	AttrQueueState    = attribute.Key("idem.queue.state")
)

// An Option configures [New], [Publisher], [TxPublisher] and [Inject].
type Option func(*config)

type config struct {
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	propagator     propagation.TextMapPropagator
	system         string
	stats          []func(context.Context) ([]QueueStats, error)
}

// WithTracerProvider sets where spans go. Default: otel.GetTracerProvider()
// at the call of New (a no-op until the program sets one).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tracerProvider = tp }
}

// WithMeterProvider sets where metrics go. Default: otel.GetMeterProvider()
// at the call of New (a no-op until the program sets one).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.meterProvider = mp }
}

// WithPropagator sets how trace context is written into and read from a
// message's attributes. Default: otel.GetTextMapPropagator(), unless that
// is the no-op propagator the program gets before it sets one (it writes
// no field): then W3C Trace Context (traceparent, tracestate), so that the
// trace crosses the queue without further setup.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) { c.propagator = p }
}

// WithMessagingSystem sets the messaging.system attribute of delivery spans
// ("aws_sqs", "rabbitmq", "nats", or a name of your own for sqlqueue).
// Default: none, as idem cannot tell which broker a consumer reads; the
// attribute is then left out rather than set wrong.
func WithMessagingSystem(name string) Option {
	return func(c *config) { c.system = name }
}

// QueueStats describe one queue at one moment. Its fields are those of
// sqlqueue.Stats, which converts to it: otelidem.QueueStats(s).
type QueueStats struct {
	Queue string
	// Ready, InFlight and Delayed count the messages in the queue, by
	// state; DeadLettered the messages in its dead-letter store.
	Ready        int64
	InFlight     int64
	Delayed      int64
	DeadLettered int64
	// OldestAge is the age of the oldest message in the queue (0 when it
	// is empty).
	OldestAge time.Duration
}

// WithQueueStats observes the queues stats reports at each metric
// collection: idem.queue.messages (by idem.queue.state: ready, in_flight,
// delayed, dead_lettered) and idem.queue.oldest_age, each with
// messaging.destination.name. An error from stats skips that collection
// (and is passed to otel.Handle). For sqlqueue:
//
//	otelidem.WithQueueStats(func(ctx context.Context) ([]otelidem.QueueStats, error) {
//		s, err := q.Stats(ctx) // a *sqlqueue.SQLiteQueue
//		return []otelidem.QueueStats{otelidem.QueueStats(s)}, err
//	})
//
// Default: none. Several WithQueueStats add up.
func WithQueueStats(stats func(context.Context) ([]QueueStats, error)) Option {
	return func(c *config) {
		if stats != nil {
			c.stats = append(c.stats, stats)
		}
	}
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if c.tracerProvider == nil {
		c.tracerProvider = otel.GetTracerProvider()
	}
	if c.meterProvider == nil {
		c.meterProvider = otel.GetMeterProvider()
	}
	if c.propagator == nil {
		c.propagator = otel.GetTextMapPropagator()
		if len(c.propagator.Fields()) == 0 {
			c.propagator = propagation.TraceContext{}
		}
	}
	return c
}

// Observer is an [idem.Observer] that records spans and metrics. Build it
// with [New]; it is safe for concurrent use.
type Observer struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	system     string
	m          *instruments
}

var _ idem.Observer = (*Observer)(nil)

// New returns an Observer that writes to the providers of opts (the
// globals by default). An instrument the MeterProvider refuses is reported
// to otel.Handle and left out; the Observer works without it.
func New(opts ...Option) *Observer {
	c := newConfig(opts)
	o := &Observer{
		tracer:     c.tracerProvider.Tracer(ScopeName),
		propagator: c.propagator,
		system:     c.system,
	}
	o.m = newInstruments(c.meterProvider.Meter(ScopeName), c.stats)
	return o
}

// Observe records e; see the package doc for what each kind becomes.
func (o *Observer) Observe(ctx context.Context, e idem.Event) context.Context {
	switch e.Kind {
	case idem.OpStart:
		ctx, _ = o.tracer.Start(ctx, "idem.do", trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithTimestamp(startOf(e)),
			trace.WithAttributes(keyAttr(e), AttrPolicy.String(e.Policy.String()),
				AttrCorrelationID.String(e.Correlation)))
		return ctx
	case idem.OpEnd:
		o.m.op(ctx, e)
		span := trace.SpanFromContext(ctx)
		if span.IsRecording() {
			var buf [6]attribute.KeyValue
			attrs := attemptAttrs(append(buf[:0], AttrOutcome.String(e.Outcome)), e)
			switch e.Outcome {
			case "store-error", "lease-lost", "failed", "indeterminate":
				attrs = setError(span, attrs, e)
			}
			// One call: each takes the span's lock and grows its slice.
			span.SetAttributes(attrs...)
		}
		span.End()
	case idem.LeaseExtended:
		o.m.leaseExtended(ctx)
		trace.SpanFromContext(ctx).AddEvent("idem.lease.extended",
			trace.WithAttributes(attribute.String("idem.lease.deadline", e.Deadline.UTC().Format(time.RFC3339Nano))))
	case idem.LeaseLost:
		o.m.leaseLost(ctx, e)
		trace.SpanFromContext(ctx).AddEvent("idem.lease.lost", trace.WithAttributes(AttrReason.String(e.Reason)))
	case idem.StoreFailed:
		o.m.storeFailed(ctx, e)
		span := trace.SpanFromContext(ctx)
		if span.IsRecording() {
			attrs := []attribute.KeyValue{AttrStoreOp.String(e.Op)}
			if e.Err != nil {
				attrs = append(attrs, attribute.String("exception.message", e.Err.Error()))
			}
			span.AddEvent("idem.store.failed", trace.WithAttributes(attrs...))
		}

	case idem.DeliveryStart:
		var links []trace.Link
		if len(e.Attributes) > 0 {
			// The publisher's span is the parent: see the package doc. A
			// span the consumer's own context had (a Lambda invocation's)
			// is linked instead.
			local := trace.SpanContextFromContext(ctx)
			ctx = o.propagator.Extract(ctx, propagation.MapCarrier(e.Attributes))
			if remote := trace.SpanContextFromContext(ctx); local.IsValid() && remote.IsValid() && !remote.Equal(local) {
				links = []trace.Link{{SpanContext: local}}
			}
		}
		attrs := make([]attribute.KeyValue, 0, 7)
		if o.system != "" {
			attrs = append(attrs, semconv.MessagingSystemKey.String(o.system))
		}
		attrs = append(attrs,
			semconv.MessagingDestinationName(e.Queue),
			semconv.MessagingMessageID(e.MessageID),
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingOperationName("process"),
			AttrReceives.Int(e.Receives))
		ctx, _ = o.tracer.Start(ctx, "process "+e.Queue, trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithTimestamp(startOf(e)), trace.WithAttributes(attrs...), trace.WithLinks(links...))
		return ctx
	case idem.DeliveryEnd:
		o.m.delivery(ctx, e)
		span := trace.SpanFromContext(ctx)
		if span.IsRecording() {
			var buf [9]attribute.KeyValue
			attrs := append(buf[:0], AttrOutcome.String(e.Outcome))
			if e.Reason != "" {
				attrs = append(attrs, AttrReason.String(e.Reason))
			}
			if e.Key != "" {
				attrs = append(attrs, keyAttr(e))
			}
			attrs = attemptAttrs(attrs, e)
			if e.Outcome == "dead-lettered" {
				attrs = setError(span, attrs, e)
			}
			span.SetAttributes(attrs...)
		}
		span.End()

	case idem.WebhookStart:
		ctx, _ = o.tracer.Start(ctx, "webhook "+e.Source, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithTimestamp(startOf(e)),
			trace.WithAttributes(AttrWebhookSource.String(e.Source)))
		return ctx
	case idem.WebhookEnd:
		o.m.webhook(ctx, e)
		o.endHTTP(ctx, e)

	case idem.RequestStart:
		// The semantic conventions' name, "METHOD ROUTE", or the method
		// alone when the route is unknown (the middleware wraps a mux).
		name := e.Method
		if e.Route != "" {
			name += " " + e.Route
		}
		ctx, _ = o.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithTimestamp(startOf(e)),
			trace.WithAttributes(semconv.HTTPRequestMethodKey.String(e.Method), semconv.HTTPRoute(e.Route)))
		return ctx
	case idem.RequestEnd:
		o.m.request(ctx, e)
		o.endHTTP(ctx, e)

	case idem.RelayPublished:
		o.m.relayPublished(ctx, e)
	case idem.RelayRefused:
		o.m.relayRefused(ctx, e)
	}
	return ctx
}

func (o *Observer) endHTTP(ctx context.Context, e idem.Event) {
	span := trace.SpanFromContext(ctx)
	if span.IsRecording() {
		var buf [10]attribute.KeyValue
		attrs := append(buf[:0], AttrOutcome.String(e.Outcome))
		if e.Status != 0 {
			attrs = append(attrs, semconv.HTTPResponseStatusCode(e.Status))
		}
		if e.Reason != "" {
			attrs = append(attrs, AttrReason.String(e.Reason))
		}
		if e.Key != "" {
			attrs = append(attrs, keyAttr(e))
		}
		attrs = attemptAttrs(attrs, e)
		if e.Status >= 500 {
			// The semantic conventions: a server span is an error on 5xx,
			// not on 4xx (the client's).
			span.SetStatus(codes.Error, http.StatusText(e.Status))
			attrs = append(attrs, semconv.ErrorTypeKey.String(strconv.Itoa(e.Status)))
		}
		span.SetAttributes(attrs...)
	}
	span.End()
}

// startOf is the span's start: when idem says the operation began, or now.
func startOf(e idem.Event) time.Time {
	if e.Started.IsZero() {
		return time.Now()
	}
	return e.Started
}

func keyAttr(e idem.Event) attribute.KeyValue {
	if e.KeyHashed {
		return AttrKeyHash.String(e.Key)
	}
	return AttrKey.String(e.Key)
}

// attemptAttrs appends the attempt's attributes, where there is one.
func attemptAttrs(attrs []attribute.KeyValue, e idem.Event) []attribute.KeyValue {
	if e.Fence == 0 && e.AttemptID == "" {
		return attrs
	}
	return append(attrs, AttrFence.Int64(e.Fence), AttrAttempt.Int(e.Attempt),
		AttrAttemptID.String(e.AttemptID), AttrTakeover.Bool(e.Takeover))
}

// setError sets span's status to Error and appends error.type (the
// outcome).
func setError(span trace.Span, attrs []attribute.KeyValue, e idem.Event) []attribute.KeyValue {
	desc := e.Outcome
	if e.Reason != "" {
		desc += ": " + e.Reason
	} else if e.Err != nil {
		desc += ": " + e.Err.Error()
	}
	span.SetStatus(codes.Error, desc)
	return append(attrs, semconv.ErrorTypeKey.String(e.Outcome))
}
