// Package queue runs queue consumers whose effects happen once although the
// broker delivers at least once.
//
// A [Consumer] receives messages from a broker, computes each message's
// operation key with a [KeyFunc] (from business ids, identical on every
// redelivery and every producer retry), and runs the [Handler] inside an
// [idem.Ledger] call for that key: a copy of a message whose key is done is
// acked without running the handler again.
//
//	key := func(m queue.Message) (idem.OperationKey, error) {
//		order, user, _ := strings.Cut(string(m.Body), " ")
//		return idem.Key("receipt", order, user), nil
//	}
//	c, err := queue.NewConsumer(src, ledger, key, send)
//	if err != nil {
//		return err
//	}
//	err = c.Run(ctx) // until ctx is done, then lets handlers finish
//
// The package's Consumer example runs this on an in-memory queue; [NewTypedConsumer]
// (see its example) decodes each body once into a value of your type,
// which gives the key and goes to the handler. The broker's message id is
// a key only when you say so, with [MessageIDKey]: a producer's retry has
// a new one.
//
// A broker is reached through three small interfaces: a [Source] hands out
// [Delivery] values, each of which is acked, retried after a delay, extended
// or dead-lettered; a [Publisher] sends an [Outgoing] message with an
// optional dedup id and group id. Adapters live in subpackages: sqlqueue
// (SQLite and PostgreSQL, the embedded default), jetstream, amqpqueue,
// sqsqueue, and lambdasqs for AWS Lambda's SQS event source; memqueue is
// in memory, for tests.
//
// # Guarantees
//
// The ledger's answer decides each delivery's fate (see [Consumer] for the
// whole table): done or replayed → Ack; another worker holds the key →
// Retry soon ([WithBusyDelay]); a key that cannot be computed, a body that
// cannot be decoded, an [idem.Permanent] error or a key reused for another
// payload → DeadLetter with the reason; any other error (a store error, a
// lost lease, an indeterminate key) → Retry with backoff, and DeadLetter
// on the last receive allowed. Every delivery held is extended while it
// runs or waits, so it is not handed to another worker; if it is anyway
// (a lapsed visibility, a crash), the ledger still runs its effect once:
// the second copy finds the key busy or done. What the handler's effect
// does when a worker dies mid-call is the ledger's policy
// ([idem.AtLeastOnce] by default, [idem.AtMostOnce]).
//
// # Defaults that agree
//
// A consumer's handler timeout and its source's visibility (how long a
// delivery stays hidden: SQS's visibility timeout, JetStream's ack wait,
// sqlqueue's and memqueue's visibility, 30 s by default everywhere) must
// agree: [NewConsumer] refuses a visibility shorter than the handler
// timeout, and warns below six times it. The defaults always agree, by
// deriving the one the caller did not set from the one the broker already
// has: without [WithHandlerTimeout], a handler gets a sixth of the
// source's visibility, at most [DefaultHandlerTimeout] (30 s; all of it
// where the visibility is unbounded: amqpqueue, lambdasqs). So every
// adapter's defaults give a 5 s handler timeout (30 s under AMQP and
// Lambda) and no warning. Give a slow handler more time by raising the
// queue's visibility (3 minutes: 30 s) or with WithHandlerTimeout.
//
// # Other options
//
// [WithConcurrency] (default 8 handlers at once), [WithBatchSize] (10
// messages a receive), [WithMaxReceives] (5 deliveries, then dead
// letter), [WithBackoff] (1 s doubling to 5 minutes, with jitter),
// [WithBusyDelay] (at most 5 s), [WithShutdownTimeout] (30 s for handlers
// to finish after Run's context ends), [WithExtendEvery] (a third of the
// visibility), [WithCallOptions] (per-message ledger options such as
// [idem.Fingerprint]) and [WithLogger] (default slog.Default). docs/usage.md in the repository
// walks through a consumer's setup:
// https://github.com/idemkit/idem/blob/main/docs/usage.md#queue-consumers
package queue
