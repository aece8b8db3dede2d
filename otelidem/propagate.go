package otelidem

import (
	"context"
	"maps"

	"go.opentelemetry.io/otel/propagation"

	"github.com/idemkit/idem/queue"
)

// Inject writes the trace context of ctx (traceparent and tracestate, with
// the default propagator) into attrs, for code that writes messages itself:
// an outbox row's attributes, written in the business transaction, so that
// the relay's publish and the consumer continue the trace of the request
// that wrote it. attrs must not be nil; nothing is written when ctx has no
// valid span context. Of opts, only [WithPropagator] applies.
func Inject(ctx context.Context, attrs map[string]string, opts ...Option) {
	newConfig(opts).propagator.Inject(ctx, propagation.MapCarrier(attrs))
}

// Extract returns ctx with the trace context found in attrs (a received
// message's attributes), for a consumer that is not a queue.Consumer. Of
// opts, only [WithPropagator] applies.
func Extract(ctx context.Context, attrs map[string]string, opts ...Option) context.Context {
	return newConfig(opts).propagator.Extract(ctx, propagation.MapCarrier(attrs))
}

// Publisher returns a queue.Publisher that publishes through p with the
// trace context of the ctx of each Publish written into the message's
// attributes (a copy: the caller's map is never changed). A message that
// already carries the propagator's fields keeps them: it was traced where
// it was written (an outbox row). Of opts, only [WithPropagator] applies.
//
// The returned Publisher has a FIFO method reporting p's (false when p has
// none), so that webhook.Publish still gives each event its group on an SQS
// FIFO queue.
func Publisher(p queue.Publisher, opts ...Option) queue.Publisher {
	return &publisher{p: p, propagator: newConfig(opts).propagator}
}

type publisher struct {
	p          queue.Publisher
	propagator propagation.TextMapPropagator
}

func (p *publisher) Publish(ctx context.Context, m queue.Outgoing) (queue.Published, error) {
	m.Attributes = withTraceContext(ctx, p.propagator, m.Attributes)
	return p.p.Publish(ctx, m)
}

// FIFO reports whether the wrapped publisher publishes to a FIFO queue that
// requires a group.
func (p *publisher) FIFO() bool {
	f, ok := p.p.(interface{ FIFO() bool })
	return ok && f.FIFO()
}

// TxPublisher is [Publisher] for a transactional publisher: with
// webhook.PublishTx, each captured event carries the trace context of the
// Receiver's request.
func TxPublisher[Tx any](p queue.TxPublisher[Tx], opts ...Option) queue.TxPublisher[Tx] {
	return &txPublisher[Tx]{p: p, propagator: newConfig(opts).propagator}
}

type txPublisher[Tx any] struct {
	p          queue.TxPublisher[Tx]
	propagator propagation.TextMapPropagator
}

func (p *txPublisher[Tx]) PublishTx(ctx context.Context, tx Tx, m queue.Outgoing) (queue.Published, error) {
	m.Attributes = withTraceContext(ctx, p.propagator, m.Attributes)
	return p.p.PublishTx(ctx, tx, m)
}

// withTraceContext returns attrs with ctx's trace context added: attrs
// itself when there is none to add or attrs already has one, else a copy.
func withTraceContext(ctx context.Context, pr propagation.TextMapPropagator, attrs map[string]string) map[string]string {
	for _, f := range pr.Fields() {
		if _, ok := attrs[f]; ok {
			return attrs
		}
	}
	carrier := propagation.MapCarrier{}
	pr.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return attrs
	}
	out := make(map[string]string, len(attrs)+len(carrier))
	maps.Copy(out, attrs)
	maps.Copy(out, carrier)
	return out
}
