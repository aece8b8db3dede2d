package queue

import (
	"log/slog"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/dispatch"
)

// Defaults of a [Consumer].
const (
	DefaultConcurrency = 8
	DefaultBatchSize   = 10
	// DefaultHandlerTimeout is the longest handler timeout a Consumer
	// takes by itself: without [WithHandlerTimeout], a handler gets a sixth
	// of its source's visibility, at most this (all of it when the
	// visibility is unbounded, as on AMQP and in Lambda). See
	// [WithHandlerTimeout].
	DefaultHandlerTimeout  = 30 * time.Second
	DefaultMaxReceives     = 5
	DefaultBackoffBase     = time.Second
	DefaultBackoffMax      = 5 * time.Minute
	DefaultBusyDelay       = 5 * time.Second // the longest wait of a busy message; see WithBusyDelay
	DefaultShutdownTimeout = 30 * time.Second
)

// Option configures a [Consumer].
type Option func(*config)

type config struct {
	dispatch.Settings               // concurrency, batch size, backoff, shutdown timeout, extension interval
	handlerTimeout    time.Duration // 0: derived from the source's visibility (defaultHandlerTimeout)
	maxReceives       int
	busyDelay         time.Duration
	logger            *slog.Logger
	callOptions       func(Message) []idem.CallOption
	overrunMargin     time.Duration // tests only; 0: derived (see Consumer.overrunMargin)
}

func defaultConfig() config {
	return config{
		Settings: dispatch.Settings{
			Concurrency:     DefaultConcurrency,
			BatchSize:       DefaultBatchSize,
			Backoff:         dispatch.Backoff{Base: DefaultBackoffBase, Max: DefaultBackoffMax},
			ShutdownTimeout: DefaultShutdownTimeout,
		},
		maxReceives: DefaultMaxReceives,
		busyDelay:   DefaultBusyDelay,
	}
}

// WithConcurrency sets how many handlers run at once (default
// [DefaultConcurrency]). A FIFO group's messages take one slot between them:
// they run one after another. Messages beyond it wait for a free slot, kept
// invisible meanwhile (see [WithExtendEvery]). Values below 1 are ignored.
func WithConcurrency(n int) Option {
	return func(c *config) { c.SetConcurrency(n) }
}

// WithBatchSize sets the most messages asked of the source at once (default
// [DefaultBatchSize]; SQS allows at most 10). The consumer never asks for
// more than it has free handler slots. Values below 1 are ignored.
func WithBatchSize(n int) Option {
	return func(c *config) { c.SetBatchSize(n) }
}

// WithHandlerTimeout bounds one handler call: the handler's context is
// cancelled then. The source's visibility must be at least this long:
// [NewConsumer] refuses a shorter one, and warns below six times it (the
// AWS guidance for SQS event sources).
//
// The default agrees with the source: a sixth of its visibility, at most
// [DefaultHandlerTimeout] (30 s), and at least 1 s unless the visibility
// itself is shorter; 30 s when the visibility is unbounded (AMQP, Lambda,
// where the invocation's deadline bounds the handler instead). So with a
// queue's default visibility of 30 s (sqlqueue, memqueue, an SQS queue,
// JetStream's ack wait) a handler gets 5 s, and nothing warns; a handler
// that needs longer raises the queue's visibility (3 minutes gives the
// full 30 s) or sets this option, and the warning then says when the two
// disagree. Only a visibility under 6 s warns with the default.
//
// A handler that ignores its cancelled context and
// outlives its timeout by more than a margin (a second plus
// [idem.Ledger.FinishTimeout], which covers the ledger's writes after the
// handler returns) loses its delivery's invisibility: the delivery is no
// longer extended, and the message goes to another worker once its
// visibility lapses. The ledger's lease, extended while the handler runs,
// still keeps the key from running twice: the other worker finds it busy.
// Values below 1 are ignored.
func WithHandlerTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.handlerTimeout = d
		}
	}
}

// WithMaxReceives sets how many deliveries a message gets (default
// [DefaultMaxReceives]): a retryable failure on the last one, or a message
// that arrives with a higher receive count and whose key is neither done nor
// running, is dead-lettered with the reason. 0 means no limit (a poison
// message then retries forever, with backoff).
func WithMaxReceives(n int) Option {
	return func(c *config) {
		if n >= 0 {
			c.maxReceives = n
		}
	}
}

// WithBackoff sets the retry delay after a retryable failure: base doubled
// per receive, capped at max, with jitter (a delay between half and all of
// it). Defaults [DefaultBackoffBase] and [DefaultBackoffMax]. Non-positive
// values are ignored.
func WithBackoff(base, max time.Duration) Option {
	return func(c *config) { c.SetBackoff(base, max) }
}

// WithBusyDelay sets the longest retry delay of a message whose key another
// attempt holds (default [DefaultBusyDelay], 5 s).
//
// A busy message is not put off for the whole delay: the holder is most
// often another copy of the same message, done in milliseconds. The first
// wait is at most 25 ms; each later busy receive of the message waits up
// to four times longer (100 ms, 400 ms, 1.6 s, ...), and at least about as
// long as the holder has been running ([idem.InProgressError.Running]: a
// holder that has run for 2 s likely needs about 2 s more), up to this
// delay; each wait is jittered to between half and all of it, and none
// goes past the end of the holder's lease
// ([idem.InProgressError.RetryAfter]), when a holder that died can be
// taken over. So a duplicate of a quick holder is acked within tens of
// milliseconds, and a long holder costs a handful of receives, then one
// every half to whole busy delay. Busy retries count as receives (see
// [WithMaxReceives]): on a message's last two receives allowed, a busy
// key is looked at again just after the holder's lease ends (up to this
// delay), so that the message still has a receive left when a holder that
// died is taken over (or found indeterminate); one over the maximum
// is still retried while the key is held, and acked once it is done.
// Non-positive values are ignored.
func WithBusyDelay(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.busyDelay = d
		}
	}
}

// WithShutdownTimeout sets how long [Consumer.Run] lets in-flight handlers
// finish after its context is done (default [DefaultShutdownTimeout]). Past
// it, their contexts are cancelled and their messages handed back.
// Non-positive values are ignored.
func WithShutdownTimeout(d time.Duration) Option {
	return func(c *config) { c.SetShutdownTimeout(d) }
}

// WithExtendEvery sets how often a delivery the consumer holds is extended
// (default: a third of the source's visibility; never, when the source's
// visibility is 0), by the source's visibility (three times the interval
// when it is 0). A delivery is extended from the moment the consumer gets
// it until it is settled: while its handler runs, and while it waits for a
// free handler slot or behind the earlier messages of its FIFO group.
// Non-positive values are ignored.
func WithExtendEvery(d time.Duration) Option {
	return func(c *config) { c.SetExtendEvery(d) }
}

// WithLogger sets the logger for per-message lines (default [slog.Default]).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// WithCallOptions adds ledger call options per message: a fingerprint of
// the payload ([idem.Fingerprint]), a policy, a Reconcile hook. The consumer
// already passes [idem.WithCorrelationID] with the message id; an option
// returned here comes after it and wins.
func WithCallOptions(f func(Message) []idem.CallOption) Option {
	return func(c *config) { c.callOptions = f }
}
