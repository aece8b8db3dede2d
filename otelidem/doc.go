// Package otelidem reports what idem does to OpenTelemetry: a span per
// operation, delivery and request, metrics of their outcomes, and the W3C
// trace context carried through the queue, so that one trace runs from a
// webhook request through its capture, the queue and the consumer to the
// effect, across processes and brokers.
//
// Attach it to the Ledger; the queue consumers, webhook Receivers, httpidem
// middleware and outbox relays built on that Ledger report to it too:
//
//	obs := otelidem.New() // the global TracerProvider, MeterProvider and propagator
//	l := idem.New(st, idem.WithObserver(obs))
//
// and publish through [Publisher] (or [TxPublisher], or [Inject] for rows
// written by hand, such as outbox rows) so that each message carries the
// publishing span's traceparent in its attributes.
//
// # Spans
//
//   - "idem.do" (internal), one per Ledger.Do, Run or DoTx: idem.key (or
//     idem.key_hash when the Ledger hashes keys in its logs), idem.policy,
//     idem.correlation_id, and at its end idem.outcome, idem.fence,
//     idem.attempt, idem.attempt_id, idem.takeover. Lease extensions, a lost
//     lease and store failures are span events. Its status is Error for the
//     outcomes store-error, lease-lost, failed and indeterminate.
//   - "process QUEUE" (consumer), one per delivery: messaging.system (see
//     [WithMessagingSystem]), messaging.destination.name,
//     messaging.message.id, messaging.operation.type "process",
//     messaging.operation.name "process", idem.receives, and at its end
//     idem.outcome, idem.reason, the key and the attempt. Its parent is the
//     trace context found in the message's attributes (the publisher's
//     span), not the consumer's own context: a delivery is one message, so
//     the semantic conventions allow the creation context as parent, and
//     only a parent (a link would start a new trace) puts the webhook
//     request, the capture, the handler and its effect in one trace. A span
//     the consumer's own context had (a Lambda invocation's) is linked.
//     Status Error when dead-lettered.
//   - "webhook SOURCE" (server), one per webhook Receiver request:
//     idem.webhook.source, http.response.status_code, idem.outcome,
//     idem.reason; Error on a 5xx.
//   - "METHOD ROUTE" (server), one per httpidem request:
//     http.request.method, http.route, http.response.status_code,
//     idem.outcome, idem.reason; Error on a 5xx.
//
// # Metrics
//
// Every metric is named idem.*; docs/observability.md lists them with
// their units and attributes. No metric attribute holds a key, a message
// id or an error text: their cardinality is bounded. A reason that is not
// a short token (lower-case letters, digits, '-', '_', at most 32 bytes) is
// counted as "other".
//
// With [WithQueueStats], the depth of each queue and the age of its oldest
// message are observed at each collection.
//
// # Prometheus
//
// otelidem writes to an OpenTelemetry MeterProvider only. To serve the
// same instruments to a Prometheus scrape, give it a MeterProvider with
// the OpenTelemetry Prometheus exporter
// (go.opentelemetry.io/otel/exporters/prometheus) and serve
// promhttp.Handler(), as idem serve does: one set of instruments then feeds
// both OTLP users and Prometheus, with the exporter's standard name
// translation (idem.operations becomes idem_operations_total,
// idem.operation.duration idem_operation_duration_seconds).
package otelidem
