package outbox

import (
	"log/slog"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/dispatch"
)

// Defaults of a [Relay].
const (
	DefaultConcurrency     = 8
	DefaultBatchSize       = 10
	DefaultPublishTimeout  = 30 * time.Second
	DefaultBackoffBase     = time.Second
	DefaultBackoffMax      = 5 * time.Minute
	DefaultShutdownTimeout = 30 * time.Second
	// DefaultDedupPrefix begins the dedup id the relay derives for an
	// outbox message that has none of its own (see [Relay]).
	DefaultDedupPrefix = "outbox:"
)

// Option configures a [Relay].
type Option func(*config)

type config struct {
	dispatch.Settings // concurrency, batch size, backoff, shutdown timeout, extension interval
	publishTimeout    time.Duration
	maxReceives       int
	dedupPrefix       string
	permanent         []error
	logger            *slog.Logger
	observer          idem.Observer
}

func defaultConfig() config {
	return config{
		Settings: dispatch.Settings{
			Concurrency:     DefaultConcurrency,
			BatchSize:       DefaultBatchSize,
			Backoff:         dispatch.Backoff{Base: DefaultBackoffBase, Max: DefaultBackoffMax},
			ShutdownTimeout: DefaultShutdownTimeout,
		},
		publishTimeout: DefaultPublishTimeout,
		dedupPrefix:    DefaultDedupPrefix,
	}
}

// WithConcurrency sets how many publishes run at once (default
// [DefaultConcurrency]). The messages of one FIFO group take one slot
// between them: they are published one after another, in order. Values
// below 1 are ignored.
func WithConcurrency(n int) Option {
	return func(c *config) { c.SetConcurrency(n) }
}

// WithBatchSize sets the most messages asked of the outbox at once
// (default [DefaultBatchSize]). The relay never asks for more than it has
// free publish slots. Values below 1 are ignored.
func WithBatchSize(n int) Option {
	return func(c *config) { c.SetBatchSize(n) }
}

// WithPublishTimeout bounds one publish to the target (default
// [DefaultPublishTimeout]). A publish that times out is retried like any
// other transient failure, with the same dedup id. The outbox's visibility
// must be at least this long: [NewRelay] refuses a shorter one. Values
// below 1 are ignored.
func WithPublishTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.publishTimeout = d
		}
	}
}

// WithMaxReceives sets how many deliveries an outbox message gets before a
// transient publish failure dead-letters it instead of retrying it
// (default 0: no limit). The default keeps every message in the outbox
// through a broker outage of any length, retried with capped backoff; a
// limit trades that for a FIFO group that is not held up for ever by one
// message the target keeps refusing with an error that does not say it is
// permanent. Negative values are ignored.
func WithMaxReceives(n int) Option {
	return func(c *config) {
		if n >= 0 {
			c.maxReceives = n
		}
	}
}

// WithBackoff sets the delay before a message whose publish failed is
// tried again: base doubled per receive, capped at max, with jitter (a
// delay between half and all of it). Defaults [DefaultBackoffBase] and
// [DefaultBackoffMax]. Non-positive values are ignored.
func WithBackoff(base, max time.Duration) Option {
	return func(c *config) { c.SetBackoff(base, max) }
}

// WithShutdownTimeout sets how long [Relay.Run] lets publishes under way
// finish after its context is done (default [DefaultShutdownTimeout]).
// Past it their contexts are cancelled and their messages handed back to
// the outbox, to be published again (with the same dedup id) by the next
// relay. Non-positive values are ignored.
func WithShutdownTimeout(d time.Duration) Option {
	return func(c *config) { c.SetShutdownTimeout(d) }
}

// WithExtendEvery sets how often a delivery the relay holds is extended
// (default: a third of the outbox's visibility; never when the visibility
// is 0), by the outbox's visibility (three times the interval when it is
// 0). A delivery is extended from receipt until it is settled: while it is
// published, and while it waits for a free slot or behind the earlier
// messages of its group. Non-positive values are ignored.
func WithExtendEvery(d time.Duration) Option {
	return func(c *config) { c.SetExtendEvery(d) }
}

// WithDedupPrefix sets the prefix of the dedup id the relay derives for a
// message that has none of its own (default [DefaultDedupPrefix]). Give
// each outbox that relays into a shared target a prefix of its own (a
// service name): the derived id is made of the outbox's message id, which
// is unique in one database only.
func WithDedupPrefix(p string) Option {
	return func(c *config) { c.dedupPrefix = p }
}

// WithPermanentErrors adds errors that mark a publish refused for good: a
// publish error for which errors.Is(err, target) holds for one of them
// dead-letters the message at once instead of retrying it. Errors matching
// [queue.ErrRefused] (every adapter's refusal of a message as it is:
// sqlqueue.ErrBadMessage, jetstream.ErrBadAttribute, sqsqueue.ErrBadBody,
// ...), wrapping [idem.PermanentError] ([idem.Permanent]),
// [queue.ErrUnsupported] or [queue.ErrUndecodable] are permanent without
// it; add the errors of a Publisher of your own, or errors your broker
// returns that you know will not change on a retry.
func WithPermanentErrors(targets ...error) Option {
	return func(c *config) {
		for _, t := range targets {
			if t != nil {
				c.permanent = append(c.permanent, t)
			}
		}
	}
}

// WithLogger sets the relay's logger (default [slog.Default]): each
// relayed message at debug, failures and dead letters at warn.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// WithObserver sets the observer the relay reports to (default none; the
// relay has no ledger to take one from): a RelayPublished event for each
// message the target confirmed (MessageID: the outbox message's id;
// Duration: its age, when the outbox says when it was written; Attributes:
// its own; Queue: the outbox's Name(), if it has one) and a RelayRefused
// for each publish that failed (Err; Reason "refused" when dead-lettered
// as refused for good, "max-receives" when dead-lettered out of receives,
// "retried" otherwise). A publish cut short by the relay stopping is
// neither.
func WithObserver(o idem.Observer) Option {
	return func(c *config) { c.observer = o }
}
