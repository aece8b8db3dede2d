package idem

import (
	"context"
	"log/slog"
	"time"

	"github.com/idemkit/idem/store"
)

// Defaults used by [New] when no option says otherwise.
const (
	DefaultLease     = 30 * time.Second
	DefaultRetention = store.DefaultRetention // 7 days
)

// Option configures a [Ledger] in [New].
type Option interface{ applyLedger(*config) }

// CallOption configures one call of [Ledger.Do], [Run] or [DoTx].
type CallOption interface{ applyCall(*callConfig) }

// LedgerCallOption works both in [New] (the Ledger's default) and in one
// call (that call only).
type LedgerCallOption struct{ f func(*callConfig) }

func (o LedgerCallOption) applyLedger(c *config)   { o.f(&c.call) }
func (o LedgerCallOption) applyCall(c *callConfig) { o.f(c) }

type ledgerOption func(*config)

func (o ledgerOption) applyLedger(c *config) { o(c) }

type callOption func(*callConfig)

func (o callOption) applyCall(c *callConfig) { o(c) }

type config struct {
	call       callConfig
	cacheSize  int
	logger     *slog.Logger
	owner      string
	hashedKeys bool
	coalesce   int
	// coalesceFrom: see WithCoalescingFrom (0: DefaultCoalescingFrom).
	coalesceFrom int
	observer     Observer
}

type callConfig struct {
	lease     time.Duration
	leaseCap  time.Duration // WithLeaseAtMost; 0: none
	leaseEnd  time.Time     // the call's start plus leaseCap: no heartbeat extends the lease past it; zero: none
	retention time.Duration
	policy    Policy
	// takeover: this call took over a lapsed attempt (set once claimed).
	takeover    bool
	fingerprint string
	correlation string
	reconcile   ReconcileFunc
	claimed     *Claimed // WithClaimed; nil: Do claims the key itself
	// obs is what the call came to, for its OpEnd: set only when the
	// Ledger has an Observer (see observedCall), nil otherwise.
	obs *opState
}

// opState is what a call came to, recorded by logOutcome for its OpEnd:
// the outcome and the attempt it names. Written on the call's goroutine
// only.
type opState struct {
	// key is the key as events carry it (its hash under
	// WithHashedKeysInLogs).
	key       string
	outcome   string
	fence     int64
	attempt   int
	attemptID string
}

// observedCall is a call's config and its opState in one allocation, for
// a Ledger with an Observer: the observer adds no allocation to a call,
// and a call without one carries a nil pointer only.
type observedCall struct {
	call callConfig
	op   opState
}

// WithLease sets how long a claim holds the key before it lapses (default
// [DefaultLease], 30 s). While fn runs, the Ledger extends the lease about
// every third of it, so the lease bounds how long a crashed holder blocks the
// key, not how long fn may run. Non-positive values are ignored.
func WithLease(d time.Duration) LedgerCallOption {
	return LedgerCallOption{func(c *callConfig) {
		if d > 0 {
			c.lease = d
		}
	}}
}

// WithLeaseAtMost caps the call's lease at d, whatever [WithLease] (on the
// Ledger or the call, before or after it) sets, and ends it no later than d
// after the call starts: heartbeats stop extending it there, and fn's
// context is cancelled when it runs out. It is for callers with a
// deadline, such as a Lambda handler: a lease that outlives the invocation
// would keep the key from the next delivery that long after the process
// is killed at its deadline. Non-positive values are ignored.
func WithLeaseAtMost(d time.Duration) CallOption {
	return callOption(func(c *callConfig) {
		if d > 0 && (c.leaseCap == 0 || d < c.leaseCap) {
			c.leaseCap = d
		}
	})
}

// WithRetention sets how long a finished record is remembered (default
// [DefaultRetention], 7 days). It must cover the sender's whole retry horizon:
// a duplicate that arrives after it runs again. Non-positive values are
// ignored.
func WithRetention(d time.Duration) LedgerCallOption {
	return LedgerCallOption{func(c *callConfig) {
		if d > 0 {
			c.retention = d
		}
	}}
}

// WithPolicy sets what a lapsed attempt and an error from fn mean (default
// [AtLeastOnce]); see [Policy].
func WithPolicy(p Policy) LedgerCallOption {
	return LedgerCallOption{func(c *callConfig) { c.policy = p }}
}

// WithCache keeps up to n completed results in process (an LRU), so a
// duplicate of a recently completed key is answered without a store round
// trip. Only completed records are cached: they cannot change until their
// retention passes (an operator's `idem delete` is not seen by a running
// cache). Default 0: no cache.
func WithCache(n int) Option {
	return ledgerOption(func(c *config) { c.cacheSize = n })
}

// WithCoalescing lets concurrent calls share the store's round trips: the
// claims of calls made while the store is busy with earlier ones are sent
// together as one batch of at most max (if the store implements
// [store.BatchClaimer]), and so are their completions
// ([store.BatchFinisher]). No call waits for a timer, and batching starts
// only when [DefaultCoalescingFrom] (12) calls are under way at once
// ([WithCoalescingFrom] changes it): below that, a batch of one or two
// costs more than it saves.
//
// It pays on stores with a network round trip or a commit per call
// (pgstore, redisstore) when many goroutines call the Ledger at once, as a
// queue consumer's handlers do; on sqlitestore it neither gains nor costs,
// and on memstore there is nothing to share. Default 0 (off); max ≤ 1
// turns it off. Outcomes are the same either way; a store failure during a
// batch is every waiting call's store error. docs/design.md ("Coalesced
// calls") says when batches start and stop, what they cost, and how a
// cancelled call or a slow key behaves in one.
func WithCoalescing(max int) Option {
	return ledgerOption(func(c *config) { c.coalesce = max })
}

// WithCoalescingFrom sets how many calls must be under way at once, the
// call itself included, for a Ledger made with [WithCoalescing] to start
// sending its claims (or completions) in batches (default
// [DefaultCoalescingFrom]). Lower it for a store whose batch call saves
// much more than handing calls to a batch costs (measure: CPU per call
// and calls a second at the concurrency you run); 1 coalesces at any load (a Ledger that stops for want of load
// starts again at its next call). n < 1 means the default. Without
// WithCoalescing it does nothing.
func WithCoalescingFrom(n int) Option {
	return ledgerOption(func(c *config) { c.coalesceFrom = n })
}

// DefaultCoalescingFrom is the load at which a Ledger made with
// [WithCoalescing] starts coalescing unless [WithCoalescingFrom] says
// otherwise: tuned on redisstore and pgstore, where from about 12 to 24
// concurrent callers batches start to cost less than they save.
const DefaultCoalescingFrom = 12

// coalescingFlights is how many batches a Ledger with [WithCoalescing]
// keeps in flight to the store at once while it coalesces. Fewer flights
// make bigger batches; two keep one going while the other waits on a slow
// key. (On pgstore at 64 callers one and two flights measured alike, four
// about half as fast.)
const coalescingFlights = 2

// WithLogger sets the logger (default [slog.Default]); a logger in a call's
// context ([ContextWithLogger]) takes its place for that call. Every call
// logs one line with the key, the outcome, the fence, the attempt and a
// correlation id, at a level that says whether anyone need look:
//
//   - INFO: an effect ran (executed, reconciled, rolled-back) or fn
//     returned an error (released, failed);
//   - DEBUG: expected answers that ran nothing (replayed, busy, a key
//     found failed);
//   - WARN: takeover, lease-lost, indeterminate, abandoned, a mismatch (a
//     key reused for another request: a caller bug);
//   - ERROR: store-error, and a panic in fn.
func WithLogger(l *slog.Logger) Option {
	return ledgerOption(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}

// WithOwner names this process in claims and journals (default
// "hostname:pid").
func WithOwner(name string) Option {
	return ledgerOption(func(c *config) {
		if name != "" {
			c.owner = name
		}
	})
}

// WithHashedKeysInLogs logs a key's sha256 prefix ("key_hash") instead of the
// key, for keys that carry personal data. The store still keeps the key.
func WithHashedKeysInLogs() Option {
	return ledgerOption(func(c *config) { c.hashedKeys = true })
}

// Fingerprint names the bytes that are "the request" (a payload, a body):
// their sha256 is stored with the claim, and a later call with the same key
// but a different fingerprint gets [ErrMismatch] instead of another's result,
// whatever the key's state, a lapsed attempt included (it is taken over only
// by the same request). A released key takes the new call's fingerprint.
// Calls without a fingerprint, and keys recorded without one, are never a
// mismatch.
func Fingerprint(request []byte) CallOption {
	fp := store.FingerprintOf(request)
	return callOption(func(c *callConfig) { c.fingerprint = fp })
}

// WithCorrelationID ties the call's log lines and journal entry to an id the
// caller already has (a message id, a request id). Without it the Ledger
// makes a random one.
func WithCorrelationID(id string) CallOption {
	return callOption(func(c *callConfig) { c.correlation = id })
}

// Lapsed describes, for a [ReconcileFunc], an earlier attempt that may have
// done its effect without recording it: one that started and never recorded
// its outcome (its lease lapsed, or it abandoned the key), or one that
// released the key with an error (it may have failed after its effect).
type Lapsed struct {
	Key         string
	Fence       int64 // the earlier attempt's fence
	Attempt     int
	Owner       string
	Correlation string
	Started     time.Time
	Reason      string // the error it reported, if any
	// Outcome is the earlier attempt's journal outcome: store.OutcomeLapsed,
	// store.OutcomeAbandoned or store.OutcomeReleased.
	Outcome store.Outcome
}

// ReconcileFunc decides a lapsed attempt by asking the world whether its
// effect happened (search the mail provider by a deterministic Message-ID,
// look the charge up by the provider's idempotency key). It returns done and
// the result to record, or done=false when the effect did not happen (fn then
// runs). An error leaves the key lapsed for a later call or an operator.
type ReconcileFunc func(ctx context.Context, lapsed Lapsed) (result []byte, done bool, err error)

// WithReconcile sets a hook that runs before fn whenever a call takes over a
// lapsed attempt, under either policy, and whenever the previous attempt
// released the key with an error (under [AtLeastOnce] a handler that fails
// after its effect releases the key; the hook keeps the effect from
// repeating). With it, an [AtMostOnce] key that would be indeterminate is
// claimed and reconciled instead. The hook is not called for a fresh key or
// after a release without an error.
func WithReconcile(fn ReconcileFunc) CallOption {
	return callOption(func(c *callConfig) { c.reconcile = fn })
}
