package otelidem

import (
	"context"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/idemkit/idem"
)

// Metric names. docs/observability.md says what each counts.
const (
	MetricOperations        = "idem.operations"
	MetricOperationDuration = "idem.operation.duration"
	MetricTakeovers         = "idem.takeovers"
	MetricIndeterminate     = "idem.indeterminate"
	MetricBusy              = "idem.busy"
	MetricLeaseExtensions   = "idem.lease.extensions"
	MetricLeaseLosses       = "idem.lease.losses"
	MetricStoreErrors       = "idem.store.errors"
	MetricDeliveries        = "idem.deliveries"
	MetricDeliveryDuration  = "idem.delivery.duration"
	MetricDeadLetters       = "idem.dead_letters"
	MetricWebhookRequests   = "idem.webhook.requests"
	MetricWebhookRefusals   = "idem.webhook.refusals"
	MetricWebhookDuration   = "idem.webhook.duration"
	MetricHTTPRequests      = "idem.http.requests"
	MetricHTTPDuration      = "idem.http.duration"
	MetricRelayPublished    = "idem.relay.published"
	MetricRelayRefused      = "idem.relay.refused"
	MetricRelayLag          = "idem.relay.lag"
	MetricQueueMessages     = "idem.queue.messages"
	MetricQueueOldestAge    = "idem.queue.oldest_age"
)

// durationBounds are the histograms' bucket bounds in seconds: from a
// memstore call (tens of µs) to a slow effect (a minute).
var durationBounds = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// lagBounds are the relay lag's bounds in seconds: a relay polls, so its
// lag is rarely under a millisecond and can reach minutes when it is down.
var lagBounds = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

type instruments struct {
	operations, takeovers, indeterminate, busy    metric.Int64Counter
	leaseExtensions, leaseLosses, storeErrors     metric.Int64Counter
	deliveries, deadLetters                       metric.Int64Counter
	webhookRequests, webhookRefusals, httpRequest metric.Int64Counter
	relayPublishedN, relayRefusedN                metric.Int64Counter
	opDuration, deliveryDuration                  metric.Float64Histogram
	webhookDuration, httpDuration, relayLag       metric.Float64Histogram
	sets                                          setCache
}

// setCache keeps the attribute sets of the measurements made so far, so
// that a measurement does not build and sort its set again: the values
// are few (outcomes, reasons, queues, routes) and each comes back at
// every event.
type setCache struct {
	mu   sync.RWMutex
	opts map[setKey]metric.MeasurementOption
}

// setKey names a set: which measurement (kind) and its attribute values.
type setKey struct {
	kind       uint8
	a, b, c, d string
}

// maxCachedSets bounds the cache; past it, sets are built each time.
const maxCachedSets = 4096

func (c *setCache) get(k setKey, attrs func() []attribute.KeyValue) metric.MeasurementOption {
	c.mu.RLock()
	o, ok := c.opts[k]
	c.mu.RUnlock()
	if ok {
		return o
	}
	o = metric.WithAttributeSet(attribute.NewSet(attrs()...))
	c.mu.Lock()
	if c.opts == nil {
		c.opts = map[setKey]metric.MeasurementOption{}
	}
	if len(c.opts) < maxCachedSets {
		c.opts[k] = o
	}
	c.mu.Unlock()
	return o
}

// The kinds of setKey.
const (
	setOp uint8 = iota
	setPolicy
	setDelivery
	setDeliveryDuration
	setDeadLetter
	setWebhook
	setWebhookDuration
	setWebhookRefusal
	setRequest
	setRequestDuration
)

func newInstruments(m metric.Meter, stats []func(context.Context) ([]QueueStats, error)) *instruments {
	in := &instruments{}
	counter := func(dst *metric.Int64Counter, name, unit, desc string) {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		if err != nil {
			otel.Handle(err)
			c, _ = noop.NewMeterProvider().Meter(ScopeName).Int64Counter(name)
		}
		*dst = c
	}
	histogram := func(dst *metric.Float64Histogram, name, desc string, bounds []float64) {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(bounds...))
		if err != nil {
			otel.Handle(err)
			h, _ = noop.NewMeterProvider().Meter(ScopeName).Float64Histogram(name)
		}
		*dst = h
	}
	counter(&in.operations, MetricOperations, "{operation}", "Ledger operations, by outcome and policy.")
	histogram(&in.opDuration, MetricOperationDuration, "Duration of Ledger operations, by outcome and policy.", durationBounds)
	counter(&in.takeovers, MetricTakeovers, "{operation}", "Operations that took over a lapsed attempt (its effect may run twice).")
	counter(&in.indeterminate, MetricIndeterminate, "{operation}", "Operations answered indeterminate: a key that needs a Reconcile hook or an operator.")
	counter(&in.busy, MetricBusy, "{operation}", "Operations answered busy: another attempt holds the key.")
	counter(&in.leaseExtensions, MetricLeaseExtensions, "{extension}", "Heartbeats that extended a running attempt's lease.")
	counter(&in.leaseLosses, MetricLeaseLosses, "{attempt}", "Running attempts that lost their key, by reason.")
	counter(&in.storeErrors, MetricStoreErrors, "{call}", "Store calls that failed, by the call.")
	counter(&in.deliveries, MetricDeliveries, "{delivery}", "Queue deliveries settled, by queue, outcome and reason (the ledger's answer: executed, replayed, busy, ...; a dead letter's cause).")
	histogram(&in.deliveryDuration, MetricDeliveryDuration, "Time to handle and settle a delivery, by queue and outcome.", durationBounds)
	counter(&in.deadLetters, MetricDeadLetters, "{message}", "Messages dead-lettered by a consumer, by queue and reason.")
	counter(&in.webhookRequests, MetricWebhookRequests, "{request}", "Webhook requests answered, by source and outcome.")
	counter(&in.webhookRefusals, MetricWebhookRefusals, "{request}", "Webhook requests refused, by source and reason.")
	histogram(&in.webhookDuration, MetricWebhookDuration, "Time to answer a webhook request, by source and outcome.", durationBounds)
	counter(&in.httpRequest, MetricHTTPRequests, "{request}", "HTTP requests answered by httpidem or idem serve, by method, route, outcome and status.")
	histogram(&in.httpDuration, MetricHTTPDuration, "Time to answer an HTTP request of httpidem or idem serve, by method, route and outcome.", durationBounds)
	counter(&in.relayPublishedN, MetricRelayPublished, "{message}", "Outbox messages the relay published.")
	counter(&in.relayRefusedN, MetricRelayRefused, "{message}", "Outbox messages the publisher refused, by reason.")
	histogram(&in.relayLag, MetricRelayLag, "Time from an outbox message's write to its publish.", lagBounds)
	if len(stats) > 0 {
		registerQueueStats(m, stats)
	}
	return in
}

func registerQueueStats(m metric.Meter, stats []func(context.Context) ([]QueueStats, error)) {
	messages, err := m.Int64ObservableGauge(MetricQueueMessages, metric.WithUnit("{message}"),
		metric.WithDescription("Messages in a queue, by state (ready, in_flight, delayed, dead_lettered)."))
	if err != nil {
		otel.Handle(err)
		return
	}
	oldest, err := m.Float64ObservableGauge(MetricQueueOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest message in a queue (0 when it is empty)."))
	if err != nil {
		otel.Handle(err)
		return
	}
	_, err = m.RegisterCallback(func(ctx context.Context, obs metric.Observer) error {
		for _, f := range stats {
			qs, err := f(ctx)
			if err != nil {
				// One queue's failure does not hide the others'.
				otel.Handle(err)
				continue
			}
			for _, s := range qs {
				dest := semconv.MessagingDestinationName(s.Queue)
				for _, st := range [...]struct {
					state string
					n     int64
				}{{"ready", s.Ready}, {"in_flight", s.InFlight}, {"delayed", s.Delayed}, {"dead_lettered", s.DeadLettered}} {
					obs.ObserveInt64(messages, st.n, metric.WithAttributes(dest, AttrQueueState.String(st.state)))
				}
				obs.ObserveFloat64(oldest, s.OldestAge.Seconds(), metric.WithAttributes(dest))
			}
		}
		return nil
	}, messages, oldest)
	if err != nil {
		otel.Handle(err)
	}
}

func (in *instruments) op(ctx context.Context, e idem.Event) {
	policy := e.Policy.String()
	set := in.sets.get(setKey{kind: setOp, a: e.Outcome, b: policy}, func() []attribute.KeyValue {
		return []attribute.KeyValue{AttrOutcome.String(e.Outcome), AttrPolicy.String(policy)}
	})
	in.operations.Add(ctx, 1, set)
	in.opDuration.Record(ctx, e.Duration.Seconds(), set)
	if !e.Takeover && e.Outcome != "indeterminate" && e.Outcome != "busy" {
		return
	}
	policySet := in.sets.get(setKey{kind: setPolicy, a: policy}, func() []attribute.KeyValue {
		return []attribute.KeyValue{AttrPolicy.String(policy)}
	})
	if e.Takeover {
		in.takeovers.Add(ctx, 1, policySet)
	}
	switch e.Outcome {
	case "indeterminate":
		in.indeterminate.Add(ctx, 1, policySet)
	case "busy":
		in.busy.Add(ctx, 1, policySet)
	}
}

func (in *instruments) leaseExtended(ctx context.Context) { in.leaseExtensions.Add(ctx, 1) }

func (in *instruments) leaseLost(ctx context.Context, e idem.Event) {
	in.leaseLosses.Add(ctx, 1, metric.WithAttributes(AttrReason.String(token(e.Reason))))
}

func (in *instruments) storeFailed(ctx context.Context, e idem.Event) {
	in.storeErrors.Add(ctx, 1, metric.WithAttributes(AttrStoreOp.String(token(e.Op))))
}

func (in *instruments) delivery(ctx context.Context, e idem.Event) {
	reason := token(e.Reason)
	in.deliveries.Add(ctx, 1, in.sets.get(setKey{kind: setDelivery, a: e.Queue, b: e.Outcome, c: reason}, func() []attribute.KeyValue {
		return []attribute.KeyValue{semconv.MessagingDestinationName(e.Queue), AttrOutcome.String(e.Outcome), AttrReason.String(reason)}
	}))
	in.deliveryDuration.Record(ctx, e.Duration.Seconds(), in.sets.get(setKey{kind: setDeliveryDuration, a: e.Queue, b: e.Outcome}, func() []attribute.KeyValue {
		return []attribute.KeyValue{semconv.MessagingDestinationName(e.Queue), AttrOutcome.String(e.Outcome)}
	}))
	if e.Outcome == "dead-lettered" {
		in.deadLetters.Add(ctx, 1, in.sets.get(setKey{kind: setDeadLetter, a: e.Queue, b: reason}, func() []attribute.KeyValue {
			return []attribute.KeyValue{semconv.MessagingDestinationName(e.Queue), AttrReason.String(reason)}
		}))
	}
}

func (in *instruments) webhook(ctx context.Context, e idem.Event) {
	status := statusText(e.Status)
	in.webhookRequests.Add(ctx, 1, in.sets.get(setKey{kind: setWebhook, a: e.Source, b: e.Outcome, c: status}, func() []attribute.KeyValue {
		return []attribute.KeyValue{AttrWebhookSource.String(e.Source), AttrOutcome.String(e.Outcome), semconv.HTTPResponseStatusCode(e.Status)}
	}))
	in.webhookDuration.Record(ctx, e.Duration.Seconds(), in.sets.get(setKey{kind: setWebhookDuration, a: e.Source, b: e.Outcome}, func() []attribute.KeyValue {
		return []attribute.KeyValue{AttrWebhookSource.String(e.Source), AttrOutcome.String(e.Outcome)}
	}))
	if e.Outcome == "refused" {
		reason := token(e.Reason)
		in.webhookRefusals.Add(ctx, 1, in.sets.get(setKey{kind: setWebhookRefusal, a: e.Source, b: reason}, func() []attribute.KeyValue {
			return []attribute.KeyValue{AttrWebhookSource.String(e.Source), AttrReason.String(reason)}
		}))
	}
}

func (in *instruments) request(ctx context.Context, e idem.Event) {
	in.httpRequest.Add(ctx, 1, in.sets.get(setKey{kind: setRequest, a: e.Method, b: e.Route, c: e.Outcome, d: statusText(e.Status)}, func() []attribute.KeyValue {
		return []attribute.KeyValue{semconv.HTTPRequestMethodKey.String(e.Method), semconv.HTTPRoute(e.Route),
			AttrOutcome.String(e.Outcome), semconv.HTTPResponseStatusCode(e.Status)}
	}))
	in.httpDuration.Record(ctx, e.Duration.Seconds(), in.sets.get(setKey{kind: setRequestDuration, a: e.Method, b: e.Route, c: e.Outcome}, func() []attribute.KeyValue {
		return []attribute.KeyValue{semconv.HTTPRequestMethodKey.String(e.Method), semconv.HTTPRoute(e.Route), AttrOutcome.String(e.Outcome)}
	}))
}

// statusText is status for a set's key: the common ones without an
// allocation.
func statusText(status int) string {
	switch status {
	case 200:
		return "200"
	case 201:
		return "201"
	case 401:
		return "401"
	case 409:
		return "409"
	case 500:
		return "500"
	case 503:
		return "503"
	}
	return strconv.Itoa(status)
}

func (in *instruments) relayPublished(ctx context.Context, e idem.Event) {
	dest := metric.WithAttributes(semconv.MessagingDestinationName(e.Queue))
	in.relayPublishedN.Add(ctx, 1, dest)
	if e.Duration > 0 { // 0: the outbox did not say when the row was written
		in.relayLag.Record(ctx, e.Duration.Seconds(), dest)
	}
}

func (in *instruments) relayRefused(ctx context.Context, e idem.Event) {
	in.relayRefusedN.Add(ctx, 1, metric.WithAttributes(semconv.MessagingDestinationName(e.Queue),
		AttrReason.String(token(e.Reason))))
}

// token returns reason when it is a short token, else "other": a metric
// attribute must not take an unbounded set of values (an error's text, a
// receive count), which would make a series per message.
func token(reason string) string {
	if reason == "" {
		return "none"
	}
	if len(reason) > 32 {
		return "other"
	}
	for i := 0; i < len(reason); i++ {
		c := reason[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return "other"
		}
	}
	return reason
}
