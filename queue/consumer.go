package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/dispatch"
	"github.com/idemkit/idem/store"
)

// Handler does a message's effect. Its result is recorded by the ledger and
// replayed (without calling the handler) for every later delivery of a
// message with the same key. Return [idem.Permanent] for a failure that no
// retry can fix (the message is dead-lettered), [Undecodable] for a payload
// it cannot read, [idem.NotDone] under [idem.AtMostOnce] when the effect
// certainly did not happen; any other error is retried with backoff.
type Handler func(ctx context.Context, m Message) ([]byte, error)

// KeyFunc computes a message's operation key, usually from a business id in
// its body ("the receipt for order 42"), so that two messages meaning the
// same effect share a key whatever their broker ids. An error means the
// message cannot be understood: it is dead-lettered at once.
type KeyFunc func(m Message) (idem.OperationKey, error)

// MessageIDKey keys messages by the broker's message id under prefix. Use it
// only when the id is the identity of the effect: a producer that publishes
// the same request twice gets two ids, and both run.
func MessageIDKey(prefix string) KeyFunc {
	return func(m Message) (idem.OperationKey, error) {
		if m.ID == "" {
			return idem.OperationKey{}, errors.New("the message has no id")
		}
		if prefix == "" {
			//idem:allow deliveryid MessageIDKey is the documented opt-in for ids that are the effect's identity
			return idem.Key(m.ID), nil
		}
		//idem:allow deliveryid as above
		return idem.Key(prefix, m.ID), nil
	}
}

// ErrVisibilityTooShort is returned by [NewConsumer] when the source's
// visibility (or ack wait) is shorter than the handler timeout: a slow
// handler's message would be handed to another worker while it runs.
var ErrVisibilityTooShort = errors.New("queue: visibility shorter than the handler timeout")

// Consumer runs a handler once per operation key over the deliveries of a
// [Source]. Each message's fate follows from the ledger's answer:
//
//   - done (executed, replayed "skipped, already done", taken over, or
//     reconciled): Ack.
//   - [idem.ErrInProgress] (another worker holds the key): Retry soon, then
//     less and less often: see [WithBusyDelay].
//   - a key that cannot be computed, or [ErrUndecodable] from the handler:
//     DeadLetter at once.
//   - [idem.Permanent] from the handler, a replayed permanent failure
//     ([idem.ErrFailed]), or a key reused with a different payload
//     ([idem.ErrMismatch], also while another worker holds the key):
//     DeadLetter with the reason.
//   - any other error, including [idem.ErrIndeterminate] (an [idem.AtMostOnce]
//     attempt lapsed: retried until someone resolves the key), a store error
//     and [idem.ErrLeaseLost]: Retry with exponential backoff and jitter, or
//     DeadLetter when this was the last receive allowed.
//   - a message that arrives with a receive count over the maximum: the
//     handler does not run; the key's record decides: done → Ack (a
//     replay; done for a different payload → DeadLetter as a mismatch),
//     another attempt running → Retry as when busy (busy retries and
//     hand-backs count as receives too), otherwise DeadLetter.
//
// A message of a FIFO group runs only after the earlier messages of its
// group in the same batch are acked or dead-lettered; once one is retried,
// the rest of its group in the batch are handed back (Retry(0)) in order,
// and other groups go on.
//
// Every delivery the consumer holds is extended, every third of the
// source's visibility ([WithExtendEvery]), from the moment it gets it until
// it is settled: while its handler runs, and while it waits for a free
// handler slot (a batch larger than [WithConcurrency], a source that
// returned more than asked) or behind the earlier messages of its group.
// None lapses to be handed to another worker, which would count a receive
// against it (enough of them dead-letter a message that never ran) and
// could run a message of a group before the earlier ones end. While a
// handler runs, the ledger also extends its key's lease. No extension is
// made after the handlers' context ends: the deadline of
// [Consumer.HandleBatch]'s context, [Consumer.Run]'s shutdown timeout.
//
// Nor is a delivery extended once its handler has run for its timeout
// plus a margin: a second, plus the time the ledger may take to record the
// outcome after the handler returns ([idem.Ledger.FinishTimeout]: the
// call's lease, at least 5 s, and a third of it). A handler that ignores
// its cancelled context and outlives that loses its message's
// invisibility (logged once, "queue: handler outlived its timeout"): the
// message goes to another worker when its visibility lapses, rather than
// staying held for as long as the handler hangs. Its effect still does not
// run twice: the ledger extends the key's lease while the handler runs, so
// the other worker finds the key busy and retries later. The handler's
// slot stays taken until it returns. A handler that honours its context
// keeps its message invisible until it is settled, however long the
// ledger's closing writes take within their own timeout.
//
// An extension that fails is logged and the next one made on time; if the
// message is handed to another worker meanwhile, the ledger still runs its
// effect once: whichever copy comes second finds the key busy or done.
//
// A panic in the handler is recovered, logged with its stack, and treated as
// a retryable error (the ledger has already released or abandoned the key
// by the policy).
//
// Every message gets one log line, "queue message <outcome>", with the key
// (or its hash, as the ledger logs keys), outcome (executed, replayed,
// reconciled, takeover, busy, retried, indeterminate, held-back,
// handed-back, dead-lettered), action (ack, retry, dead-letter), fence,
// attempt, receive_count, message_id and correlation_id (the message id,
// which the ledger also journals with the attempt), plus cause for a dead
// letter (undecodable, max-receives, mismatch, failed, retried,
// indeterminate), delay for a retry, reason, group_id, and settle_error when
// the broker refused the settlement. The fence and attempt are those of
// the ledger's attempt for the message's key (the one that ran the handler,
// or the holder's for a busy key); 0 when there is none (an undecodable
// message, a mismatch). The ledger's own line for the same call carries the
// same correlation id. The line is at DEBUG for what needs no one's
// attention (executed, replayed, reconciled, busy, held-back, handed-back:
// the ledger's INFO line already says an effect ran), WARN for a takeover,
// an indeterminate key, a retry after an error and a dead letter, ERROR
// when the broker refused the settlement. A logger in the delivery's
// context ([idem.ContextWithLogger]) takes the place of [WithLogger]'s.
//
// The consumer reports to its ledger's [idem.Observer]: a DeliveryStart
// before the message's key is computed (the ledger's OpStart nests under
// the context it returns) and one DeliveryEnd when the message is settled
// (or handed back unhandled). Queue is the source's Name() when it has one.
type Consumer struct {
	src     Source
	ledger  *idem.Ledger
	key     KeyFunc
	handler Handler
	// bind, set by [NewTypedConsumer] in place of key and handler, decodes
	// a message once and returns its key and the call that runs its
	// handler on the decoded value.
	bind func(Message) (idem.OperationKey, func(context.Context) ([]byte, error), error)
	cfg  config
	log  *slog.Logger
	loop *dispatch.Loop[Delivery]
}

// NewConsumer returns a Consumer of src that runs h under l for the key k
// computes. It returns an error wrapping [ErrVisibilityTooShort] when src's
// visibility is shorter than the handler timeout, and logs a warning when it
// is shorter than six times the handler timeout. Without
// [WithHandlerTimeout] the handler timeout is a sixth of src's visibility
// (at most [DefaultHandlerTimeout]), so neither happens with the defaults
// unless the visibility is under 6 s.
func NewConsumer(src Source, l *idem.Ledger, k KeyFunc, h Handler, opts ...Option) (*Consumer, error) {
	if src == nil || l == nil || k == nil || h == nil {
		return nil, errors.New("queue: NewConsumer needs a source, a ledger, a key function and a handler")
	}
	return newConsumer(src, l, &Consumer{key: k, handler: h}, opts)
}

// newConsumer completes c (its key and handler, or its bind, already set)
// for src and l.
func newConsumer(src Source, l *idem.Ledger, c *Consumer, opts []Option) (*Consumer, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	log := cmp.Or(cfg.logger, slog.Default())
	v := src.Visibility()
	if cfg.handlerTimeout <= 0 {
		cfg.handlerTimeout = defaultHandlerTimeout(v)
	}
	c.src, c.ledger, c.cfg, c.log = src, l, cfg, log
	if v > 0 {
		if v < cfg.handlerTimeout {
			return nil, fmt.Errorf("%w: visibility %v, handler timeout %v: raise the queue's visibility timeout (or ack wait) or lower WithHandlerTimeout",
				ErrVisibilityTooShort, v, cfg.handlerTimeout)
		}
		if v < 6*cfg.handlerTimeout {
			log.Warn("queue: visibility is shorter than six times the handler timeout; a redelivery may race a slow handler if an extension fails",
				slog.Duration("visibility", v), slog.Duration("handler_timeout", cfg.handlerTimeout))
		}
	}
	receive := src.Receive
	if cs := c.fusedSource(src); cs != nil {
		receive = c.receiveFused(cs) // see fused.go
	}
	var extendBy time.Duration
	c.cfg.ExtendEvery, extendBy = dispatch.Extension(v, c.cfg.ExtendEvery)
	c.loop = &dispatch.Loop[Delivery]{
		Settings: c.cfg.Settings,
		ExtendBy: extendBy,
		FillWait: fillWait,
		Log:      log,
		Lines: dispatch.Lines{
			ReceiveFailed:        "queue: receive failed",
			ReceiveFailedLevel:   slog.LevelError,
			ReceivedDespiteError: "queue: receive failed after handing out messages; handling them",
			ShutdownTimeout:      "queue: shutdown timeout passed; cancelling the handlers still running and handing their messages back",
			Abandoned:            "queue: handlers still running after their contexts were cancelled; returning without them",
			ExtendFailed:         "queue: extending the delivery failed",
			ExtendBounded: "queue: handler outlived its timeout; no longer extending its message, which another worker gets once its visibility lapses " +
				"(the ledger's lease keeps the key from running twice)",
		},
		Receive:  receive,
		Group:    func(d Delivery) string { return d.Message().GroupID },
		Extend:   func(ctx context.Context, d Delivery, by time.Duration) error { return d.Extend(ctx, by) },
		Process:  c.process,
		HandBack: c.handBack,
		Attrs:    func(d Delivery) []slog.Attr { return []slog.Attr{slog.String("message_id", d.Message().ID)} },
	}
	return c, nil
}

// minDefaultHandlerTimeout is the least handler timeout a Consumer takes
// by itself, unless the source's visibility is shorter still: a very short
// visibility then warns rather than leaving handlers a few milliseconds.
const minDefaultHandlerTimeout = time.Second

// defaultHandlerTimeout is the handler timeout of a consumer of a source of
// visibility v without [WithHandlerTimeout]: v/6 (the AWS guidance read the
// other way: the visibility is six times the handler timeout), within
// [minDefaultHandlerTimeout] (or v, when shorter) and [DefaultHandlerTimeout];
// DefaultHandlerTimeout for an unbounded visibility (0).
func defaultHandlerTimeout(v time.Duration) time.Duration {
	if v <= 0 {
		return DefaultHandlerTimeout
	}
	return min(DefaultHandlerTimeout, max(v/6, min(v, minDefaultHandlerTimeout)))
}

// settleTimeout bounds one Ack, Retry or DeadLetter. Settling uses a context
// apart from the handler's: a message whose handler was cancelled must still
// be handed back.
const settleTimeout = 30 * time.Second

// Run receives and handles messages until ctx is done. Then it stops
// receiving, hands back the messages waiting for a free handler slot, lets
// in-flight handlers finish for the shutdown timeout, cancels those still
// running, hands back every message not done (Retry(0)), and returns nil.
// Nothing is acked that was not done. A receive error is logged and retried
// with backoff. A handler that ignores its cancelled context does not keep
// Run from returning (it waits 5 s more for it): its key stays guarded by
// the ledger's lease and its message comes back when its visibility lapses.
func (c *Consumer) Run(ctx context.Context) error {
	c.loop.Run(ctx)
	return nil
}

// fillWait is how long the receive loop, holding fewer free handler slots
// than half a batch, waits for more to free up before it receives: under
// load a receive of one message per freed slot would cost a broker round
// trip per message.
const fillWait = 5 * time.Millisecond

// handBack returns a message to the broker untouched (Retry(0)): the
// consumer is stopping (handed-back), or an earlier message of its group
// was not done or handed back (held-back).
func (c *Consumer) handBack(ctx context.Context, d Delivery, why dispatch.HandBackReason) {
	c.undoUnused(d)
	v := verdict{outcome: "held-back", action: actionRetry, reason: "the consumer is stopping"}
	switch why {
	case dispatch.Stopping:
		v.outcome = "handed-back"
	case dispatch.BehindNotDone:
		v.reason = "an earlier message of its group is not done"
	}
	m := d.Message()
	ctx, started := c.deliveryStart(ctx, m)
	c.settle(ctx, d, m, v, idem.Attempt{}, started)
}

// deliveryStart reports m's DeliveryStart to the ledger's observer, if it
// has one, and returns the context the delivery goes on with and when it
// started (zero without an observer).
func (c *Consumer) deliveryStart(ctx context.Context, m Message) (context.Context, time.Time) {
	obs := c.ledger.Observer()
	if obs == nil {
		return ctx, time.Time{}
	}
	started := time.Now()
	e := idem.Event{Kind: idem.DeliveryStart, Queue: c.queueName(), MessageID: m.ID, Receives: m.ReceiveCount, Attributes: m.Attributes, Started: started}
	if next := obs.Observe(ctx, e); next != nil {
		ctx = next
	}
	return ctx, started
}

// queueName is the source's name, for events, if it has one.
func (c *Consumer) queueName() string {
	if n, ok := c.src.(interface{ Name() string }); ok {
		return n.Name()
	}
	return ""
}

// deliveryEnd reports how a delivery was settled (settleErr: the broker
// refused it) to the ledger's observer.
func (c *Consumer) deliveryEnd(ctx context.Context, obs idem.Observer, m Message, v verdict, att idem.Attempt, started time.Time, settleErr error) {
	e := idem.Event{Kind: idem.DeliveryEnd, Queue: c.queueName(), MessageID: m.ID, Receives: m.ReceiveCount, Attributes: m.Attributes,
		Reason: v.outcome, Fence: att.Fence, Attempt: att.Number, AttemptID: att.ID, Takeover: att.Takeover, Err: settleErr,
		Started: started, Duration: time.Since(started)}
	if att.Key != "" {
		e.Key, e.KeyHashed = c.ledger.ObservedKey(att.Key)
	}
	switch v.action {
	case actionAck:
		e.Outcome = "acked"
	case actionDeadLetter:
		e.Outcome, e.Reason = "dead-lettered", v.cause
	default:
		e.Outcome = "retried"
		if v.outcome == "handed-back" || v.outcome == "held-back" {
			e.Outcome = "handed-back"
		}
		e.Delay = v.delay
	}
	obs.Observe(ctx, e)
}

// HandleBatch handles deliveries already received (FIFO groups in order,
// at most the configured concurrency at once) and returns when every one is
// settled. Every delivery is extended from the call until it is settled,
// also while it waits for a handler slot. Handlers run under ctx: when it
// has a deadline (an AWS Lambda invocation), the handler timeout and the
// ledger lease end no later than it, no delivery is extended after it, and
// messages not started by then are handed back.
func (c *Consumer) HandleBatch(ctx context.Context, ds []Delivery) {
	c.loop.HandleBatch(ctx, ds)
}

type action string

const (
	actionAck        action = "ack"
	actionRetry      action = "retry"
	actionDeadLetter action = "dead-letter"
)

type verdict struct {
	outcome string // what happened: executed, replayed, busy, dead-lettered, ...
	cause   string // for a dead letter: the ledger's answer (mismatch, failed, indeterminate, retried), or ""
	action  action
	delay   time.Duration
	reason  string
}

// process handles one delivery and reports whether it is settled as done or
// dead-lettered (so its FIFO group may go on). The extension that has kept
// it invisible since the consumer got it (see [Consumer]) goes on while it
// is handled and stops before it is settled.
func (c *Consumer) process(ctx context.Context, d Delivery, keep *dispatch.Keep[Delivery]) bool {
	m := d.Message()
	ctx, started := c.deliveryStart(ctx, m)
	key, run, opts, err := c.prepared(d)
	if err != nil {
		keep.Stop()
		return c.settle(ctx, d, m, verdict{outcome: "dead-lettered", cause: "undecodable", action: actionDeadLetter,
			reason: "undecodable: no operation key: " + undecodableText(err)}, idem.Attempt{}, started)
	}
	logKey := c.ledger.LogKey(key.String())
	keep.Name(logKey) // for the lines of its failed extensions
	if c.cfg.maxReceives > 0 && m.ReceiveCount > c.cfg.maxReceives {
		// Busy retries and hand-backs count as receives too: before giving
		// up on the message, ask the ledger whether its key is done or
		// still running.
		v, res := c.overMax(ctx, key, m, opts)
		keep.Stop()
		return c.settle(ctx, d, m, v, attemptOf(key, res, nil, nil), started, logKey)
	}

	hctx, cancel := context.WithTimeout(ctx, c.cfg.handlerTimeout)
	defer cancel()
	if dl, ok := ctx.Deadline(); ok {
		// The lease must not outlive the invocation: a Lambda killed at its
		// deadline leaves the key to the next delivery no later than that.
		opts = append(opts, idem.WithLeaseAtMost(max(time.Until(dl), time.Second)))
	}
	// Extended until the outcome is recorded, not only while the handler
	// may run: the ledger's closing writes come after the handler timeout.
	// But not for good: a handler that ignores its cancelled context must
	// not hold its message for as long as it hangs. Past the bound, the
	// message's visibility lapses and another worker gets it, and finds
	// the key busy (the ledger extends the lease while the handler runs).
	// With a ctx deadline (Lambda), no extension is made past it anyway.
	keep.StopAfter(c.cfg.handlerTimeout + c.overrunMargin(opts))
	// Also stopped when the handler ends its goroutine (runtime.Goexit):
	// the message is then left as after a crash, to come back when its
	// visibility lapses.
	defer keep.Stop()
	res, fnCtx, err := c.do(hctx, key, m, run, opts)
	keep.Stop()
	v := c.judge(ctx, m, res, err)
	return c.settle(ctx, d, m, v, attemptOf(key, res, err, fnCtx), started, logKey)
}

// undecodableText is err's text without the "undecodable message: " of
// [Undecodable], for a reason that already says undecodable.
func undecodableText(err error) string {
	if u, ok := err.(*undecodableError); ok {
		return u.err.Error()
	}
	return err.Error()
}

// handlerGrace is how long past its timeout a handler that honours its
// context may take to return (to unwind, to log).
const handlerGrace = time.Second

// overrunMargin is how long past the handler timeout a delivery under
// handling is still extended: the handler's grace to return once its
// context is cancelled, then what the ledger may still do once it has
// returned ([idem.Ledger.FinishTimeout]: a heartbeat under way, then the
// writes that record the outcome, under the call's lease, at least 5 s).
// The claim and a Reconcile hook run within the handler timeout. So a
// handler that honours its context is not cut short, however slow the
// store, unless the store outlasts the ledger's own timeout (the ledger
// then gives up on the write, and the message is retried anyway).
func (c *Consumer) overrunMargin(opts []idem.CallOption) time.Duration {
	if c.cfg.overrunMargin > 0 {
		return c.cfg.overrunMargin
	}
	return handlerGrace + c.ledger.FinishTimeout(opts...)
}

// attemptOf is the ledger's attempt for key that the message's line and
// DeliveryEnd name: the one that ran the handler (fnCtx: its context, nil
// when it did not run), else the one an answer names (a replay's, a busy
// key's holder, a failed or indeterminate key's last).
func attemptOf(key idem.OperationKey, res idem.Result, err error, fnCtx context.Context) idem.Attempt {
	if fnCtx != nil {
		if a, ok := idem.AttemptFromContext(fnCtx); ok {
			return a
		}
	}
	a := idem.Attempt{Key: key.String(), Fence: res.Fence, Number: res.Attempt, Takeover: res.Takeover}
	if res.Fence != 0 || err == nil {
		return a
	}
	var (
		busy *idem.InProgressError
		ind  *idem.IndeterminateError
		fail *idem.FailedError
	)
	switch {
	case errors.As(err, &busy):
		a.Fence, a.Number = busy.Fence, busy.Attempt
	case errors.As(err, &ind):
		a.Fence, a.Number = ind.Fence, ind.Attempt
	case errors.As(err, &fail):
		a.Fence, a.Number = fail.Fence, fail.Attempt
	}
	return a
}

// prepare computes m's key and ledger call options, and for a typed
// consumer the call that runs its handler on m decoded (nil: call
// c.handler with m), turning a panic in the caller's decode, key or
// options function into an error: the message is then dead-lettered, not
// the process crashed.
func (c *Consumer) prepare(m Message) (key idem.OperationKey, run func(context.Context) ([]byte, error), opts []idem.CallOption, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	if c.bind != nil {
		key, run, err = c.bind(m)
	} else {
		key, err = c.key(m)
	}
	if err == nil {
		err = key.Err()
	}
	if err != nil {
		return key, nil, nil, err
	}
	opts = []idem.CallOption{idem.WithCorrelationID(m.ID)}
	if c.cfg.callOptions != nil {
		opts = append(opts, c.cfg.callOptions(m)...)
	}
	return key, run, opts, nil
}

// overMax decides a message received more times than allowed from its
// key's record: done → ack (replayed); another attempt running → retry
// as when busy ([Consumer.busyWait]); otherwise (absent, failed, released, lapsed) →
// dead letter. A store error retries.
func (c *Consumer) overMax(ctx context.Context, key idem.OperationKey, m Message, opts []idem.CallOption) (verdict, idem.Result) {
	dead := verdict{outcome: "dead-lettered", cause: "max-receives", action: actionDeadLetter,
		reason: fmt.Sprintf("received %d times, more than the maximum of %d", m.ReceiveCount, c.cfg.maxReceives)}
	rec, err := c.ledger.Store().Get(ctx, key.String())
	switch {
	case errors.Is(err, store.ErrNotFound):
		return dead, idem.Result{}
	case err != nil:
		return verdict{outcome: "retried", action: actionRetry, delay: c.backoff(m.ReceiveCount), reason: "reading the key's record: " + err.Error()}, idem.Result{}
	}
	now, err := c.ledger.Store().Now(ctx)
	if err != nil {
		return verdict{outcome: "retried", action: actionRetry, delay: c.backoff(m.ReceiveCount), reason: "reading the store's clock: " + err.Error()}, idem.Result{}
	}
	switch {
	case rec.Status == idem.StatusCompleted && !rec.Expired(now):
		return c.replayOverMax(ctx, key, m, opts, dead)
	case rec.Status == idem.StatusInProgress && !rec.Lapsed(now):
		var running time.Duration
		if e, ok := rec.EntryOf(rec.AttemptID); ok && !e.Started.IsZero() {
			running = max(now.Sub(e.Started), 0)
		}
		return c.busy(m, running, max(rec.LeaseUntil.Sub(now), time.Millisecond)), idem.Result{}
	}
	return dead, idem.Result{}
}

// errOverMax is what the ledger is told when it would run the handler of a
// message over its receives: the key's completed record went away between
// the read and the call. The handler does not run.
var errOverMax = errors.New("queue: not run: the message is over its receives")

// replayOverMax answers a message over its receives whose key is completed.
// The ledger, not the record alone, decides: it compares the message's
// fingerprint with the record's, so a message that reused the key for
// another payload is a mismatch (dead-lettered), not a replay (acked
// without its effect ever happening).
func (c *Consumer) replayOverMax(ctx context.Context, key idem.OperationKey, m Message, opts []idem.CallOption, dead verdict) (verdict, idem.Result) {
	res, err := c.ledger.Do(ctx, key, func(context.Context) ([]byte, error) { return nil, idem.NotDone(errOverMax) }, opts...)
	var busy *idem.InProgressError
	switch {
	case err == nil:
		return verdict{outcome: "replayed", action: actionAck, reason: "skipped, already done"}, res
	case errors.Is(err, errOverMax):
		return dead, idem.Result{}
	case errors.Is(err, idem.ErrMismatch):
		return verdict{outcome: "dead-lettered", cause: "mismatch", action: actionDeadLetter, reason: err.Error()}, idem.Result{}
	case errors.As(err, &busy):
		return c.busy(m, busy.Running, busy.RetryAfter), idem.Result{}
	case errors.Is(err, idem.ErrInProgress):
		return c.busy(m, 0, 0), idem.Result{}
	case errors.Is(err, idem.ErrFailed), errors.Is(err, idem.ErrIndeterminate):
		return dead, idem.Result{}
	}
	return verdict{outcome: "retried", action: actionRetry, delay: c.backoff(m.ReceiveCount), reason: err.Error()}, idem.Result{}
}

// do runs the handler (run, when prepare gave one) under the ledger,
// turning a panic into an error. fnCtx is the context the handler ran
// under (nil: it did not run), which carries its attempt.
func (c *Consumer) do(ctx context.Context, key idem.OperationKey, m Message, run func(context.Context) ([]byte, error), opts []idem.CallOption) (res idem.Result, fnCtx context.Context, err error) {
	defer func() {
		if p := recover(); p != nil {
			idem.LoggerFromContext(ctx, c.log).LogAttrs(ctx, slog.LevelError, "queue: handler panicked", c.ledger.LogKey(key.String()),
				slog.String("message_id", m.ID), slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
			err = fmt.Errorf("queue: handler panicked: %v", p)
		}
	}()
	res, err = c.ledger.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
		fnCtx = ctx
		var (
			v   []byte
			err error
		)
		if run != nil {
			v, err = run(ctx)
		} else {
			v, err = c.handler(ctx, m)
		}
		if errors.Is(err, ErrUndecodable) {
			// The handler could not read the message, so it did nothing:
			// the key is released under either policy, not left
			// indeterminate under AtMostOnce, and a redriven message runs.
			return v, idem.NotDone(err)
		}
		return v, err
	}, opts...)
	return res, fnCtx, err
}

// judge maps the ledger's answer to what happens to the delivery.
func (c *Consumer) judge(ctx context.Context, m Message, res idem.Result, err error) verdict {
	var (
		busy *idem.InProgressError
		perm *idem.PermanentError
	)
	switch {
	case err == nil:
		v := verdict{outcome: "executed", action: actionAck}
		switch {
		case res.Replayed:
			v.outcome, v.reason = "replayed", "skipped, already done"
		case res.Reconciled:
			v.outcome, v.reason = "reconciled", "a Reconcile hook found the earlier attempt's effect done; not repeated"
		case res.Takeover:
			v.outcome, v.reason = "takeover", "took over a lapsed attempt; the effect ran again and the lapsed attempt may have done it too"
		}
		return v
	case ctx.Err() != nil:
		return verdict{outcome: "handed-back", action: actionRetry, reason: "stopped before the handler finished: " + err.Error()}
	case errors.As(err, &busy):
		return c.busy(m, busy.Running, busy.RetryAfter)
	case errors.Is(err, idem.ErrInProgress):
		return c.busy(m, 0, 0)
	case errors.Is(err, ErrUndecodable):
		return verdict{outcome: "dead-lettered", cause: "undecodable", action: actionDeadLetter, reason: err.Error()}
	case errors.Is(err, idem.ErrMismatch):
		return verdict{outcome: "dead-lettered", cause: "mismatch", action: actionDeadLetter, reason: err.Error()}
	case errors.Is(err, idem.ErrFailed): // its text says "failed permanently"
		return verdict{outcome: "dead-lettered", cause: "failed", action: actionDeadLetter, reason: err.Error()}
	case errors.As(err, &perm):
		return verdict{outcome: "dead-lettered", cause: "failed", action: actionDeadLetter, reason: "permanent failure: " + err.Error()}
	}
	outcome := "retried"
	if errors.Is(err, idem.ErrIndeterminate) {
		outcome = "indeterminate"
	}
	if c.cfg.maxReceives > 0 && m.ReceiveCount >= c.cfg.maxReceives {
		return verdict{outcome: "dead-lettered", cause: outcome, action: actionDeadLetter,
			reason: fmt.Sprintf("failed on receive %d of at most %d: %v", m.ReceiveCount, c.cfg.maxReceives, err)}
	}
	return verdict{outcome: outcome, action: actionRetry, delay: c.backoff(m.ReceiveCount), reason: err.Error()}
}

// settle applies v to the delivery, logs the message's line and reports
// its DeliveryEnd (att: the ledger's attempt for its key; started: when
// its DeliveryStart was). It reports whether the message is acked or
// dead-lettered.
func (c *Consumer) settle(ctx context.Context, d Delivery, m Message, v verdict, att idem.Attempt, started time.Time, extra ...slog.Attr) bool {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	var err error
	switch v.action {
	case actionAck:
		err = d.Ack(sctx)
	case actionRetry:
		err = d.Retry(sctx, v.delay)
	case actionDeadLetter:
		err = d.DeadLetter(sctx, v.reason)
	}
	if obs := c.ledger.Observer(); obs != nil {
		c.deliveryEnd(ctx, obs, m, v, att, started, err)
	}
	level := slog.LevelDebug // the ledger's line says what ran
	switch {
	case err != nil:
		level = slog.LevelError
	case v.action == actionDeadLetter, v.outcome == "takeover", v.outcome == "indeterminate", v.outcome == "retried":
		level = slog.LevelWarn
	}
	if log := idem.LoggerFromContext(ctx, c.log); log.Enabled(ctx, level) {
		attrs := append(extra,
			slog.String("outcome", v.outcome),
			slog.String("action", string(v.action)),
			slog.Int64("fence", att.Fence),
			slog.Int("attempt", att.Number),
			slog.Int("receive_count", m.ReceiveCount),
			slog.String("message_id", m.ID),
			slog.String("correlation_id", m.ID))
		if m.GroupID != "" {
			attrs = append(attrs, slog.String("group_id", m.GroupID))
		}
		if v.action == actionRetry {
			attrs = append(attrs, slog.Duration("delay", v.delay))
		}
		if v.cause != "" {
			attrs = append(attrs, slog.String("cause", v.cause))
		}
		if v.reason != "" {
			attrs = append(attrs, slog.String("reason", v.reason))
		}
		if err != nil {
			attrs = append(attrs, slog.String("settle_error", err.Error()))
		}
		log.LogAttrs(ctx, level, "queue message "+v.outcome, attrs...)
	}
	return err == nil && v.action != actionRetry
}

// busyFirst is the longest first wait of a message whose key another
// attempt holds (before jitter): most holders are another copy of the same
// message, received at about the same time and done in milliseconds.
const busyFirst = 25 * time.Millisecond

// busyGrowth is how much longer each busy receive of a message waits than
// the one before (before jitter): four times, so that a long holder costs
// a handful of receives before the waits reach the busy delay.
const busyGrowth = 4

// busy is the verdict on m when another attempt holds its key: retry after
// [Consumer.busyWait], or, on the message's last two receives allowed, just
// after the holder's lease ends (within the busy delay): a message keeps a
// receive for after the lease, when a holder that died is taken over or
// found indeterminate, rather than spend them all on quick looks and be
// dead-lettered for its receives alone.
func (c *Consumer) busy(m Message, running, leaseLeft time.Duration) verdict {
	delay := c.busyWait(m.ReceiveCount, running, leaseLeft)
	if c.cfg.maxReceives > 0 && m.ReceiveCount >= c.cfg.maxReceives-1 && leaseLeft > 0 {
		delay = min(leaseLeft+rand.N(busyFirst), c.cfg.busyDelay) // copies do not all come back at once
	}
	return verdict{outcome: "busy", action: actionRetry, delay: delay, reason: "another attempt holds the key"}
}

// busyWait is the retry delay of a busy message on its receive-th receive
// whose key's holder has run for running (0: unknown) and whose lease ends
// in leaseLeft (0: unknown). It is the longer of busyFirst·4^(receive-1)
// and running (a holder that has run for a while likely needs about as
// long again), capped at the busy delay, jittered to between half and all
// of it (copies of one message that met the same holder do not all come
// back at once), and never past the holder's lease: if the holder dies,
// the key can be taken over then.
func (c *Consumer) busyWait(receive int, running, leaseLeft time.Duration) time.Duration {
	limit := c.cfg.busyDelay
	d := min(busyFirst, limit)
	for i := 1; i < receive && d < limit; i++ {
		if d > limit/busyGrowth {
			d = limit // growing would pass the cap, or overflow
			break
		}
		d *= busyGrowth
	}
	d = min(max(d, running), limit)
	d = d/2 + rand.N(d-d/2+1)
	if leaseLeft > 0 {
		d = min(d, leaseLeft)
	}
	return d
}

// backoff is the retry delay after the n-th failure: base·2^(n-1), capped,
// then jittered to between half and all of it.
func (c *Consumer) backoff(n int) time.Duration {
	return c.cfg.Backoff.Delay(n)
}
