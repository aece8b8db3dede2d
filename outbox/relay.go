package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/dispatch"
	"github.com/idemkit/idem/queue"
)

// Relay moves messages from an outbox (a [queue.Source], usually a
// sqlqueue queue in the application's database) to a target (a
// [queue.Publisher]: SQS, JetStream, RabbitMQ, another sqlqueue queue), at
// least once: it publishes a message and acks it in the outbox only once
// the target has confirmed the publish. A relay that dies between the two
// leaves the message in the outbox, and the next one publishes it again
// with the same dedup id.
//
// What is published:
//
//   - Body, Attributes and GroupID as they are in the outbox.
//   - DedupID: the outbox message's own DedupID when it has one (see
//     [PublishTx], which sets it to the operation key); otherwise one
//     derived from the outbox: the prefix ([WithDedupPrefix], default
//     "outbox:"), the outbox's message id and, when the outbox reports it,
//     its publish time in unix microseconds ("outbox:42:1733017681123456").
//     sqlqueue keeps a message's id and publish time across redeliveries
//     and redrives, so every publish of one outbox message carries one
//     dedup id; the publish time tells apart the messages of a database
//     whose ids started again (one restored or made anew).
//   - No delay: a delayed outbox message is handed to the relay when it
//     falls due, and is published for delivery at once.
//
// A publish the target accepts, or reports as a duplicate of one it holds
// ([queue.Published].Duplicate: an earlier publish of the same message
// whose ack was lost), is acked. A publish the target refuses for good (an
// error matching [queue.ErrRefused], as every adapter's refusals of a
// message do, or wrapping [idem.PermanentError], [queue.ErrUnsupported],
// [queue.ErrUndecodable], or one given to [WithPermanentErrors]) is
// dead-lettered in the outbox at once with the reason. Any other error
// (the broker down, a timeout, a publish whose outcome is unknown) retries
// the message through the outbox ([queue.Delivery.Retry]) after an
// exponential backoff with jitter ([WithBackoff]), so its receive count
// grows; past [WithMaxReceives], when set, it is dead-lettered instead. A
// panic in the publisher is recovered and counts as a transient error.
//
// FIFO: the messages of a group are published one at a time, in order,
// each only after the one before it is acked; once one is retried the rest
// of its group in the batch are handed back (Retry(0)) in order. A sqlqueue
// outbox hands out a group's next message only once its head is acked or
// dead-lettered, so a group reaches the target in the order it was written
// (a dead-lettered message is skipped). Other groups, and messages without
// a group, are published in parallel, up to [WithConcurrency].
//
// Every delivery the relay holds is extended every third of the outbox's
// visibility ([WithExtendEvery]), from receipt until it is settled, so that
// a slow publish, or a message waiting for a slot, is not handed to another
// relay meanwhile (which would publish it twice, harmlessly but needlessly).
// [NewRelay] refuses an outbox whose visibility is shorter than the publish
// timeout.
//
// Each relayed message is logged at debug ("outbox message relayed", with
// outbox_id, dedup_id, target_id, duplicate, receive_count and group_id);
// a failed publish, a dead letter and a failed settle at warn, with the
// error and what was done (action retry, with its delay, or dead-letter,
// with the reason).
type Relay struct {
	from queue.Source
	to   queue.Publisher
	cfg  config
	log  *slog.Logger
	loop *dispatch.Loop[queue.Delivery]
}

// NewRelay returns a relay from the outbox from to the target to. It
// returns an error wrapping [queue.ErrVisibilityTooShort] when from's
// visibility is shorter than the publish timeout ([WithPublishTimeout]).
func NewRelay(from queue.Source, to queue.Publisher, opts ...Option) (*Relay, error) {
	if from == nil || to == nil {
		return nil, errors.New("outbox: NewRelay needs a source (the outbox) and a publisher (the target)")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	log := cmp.Or(cfg.logger, slog.Default())
	r := &Relay{from: from, to: to, cfg: cfg, log: log}
	v := from.Visibility()
	if v > 0 && v < cfg.publishTimeout {
		return nil, fmt.Errorf("%w: the outbox's visibility %v is shorter than the publish timeout %v: raise the outbox's visibility or lower WithPublishTimeout",
			queue.ErrVisibilityTooShort, v, cfg.publishTimeout)
	}
	var extendBy time.Duration
	r.cfg.ExtendEvery, extendBy = dispatch.Extension(v, r.cfg.ExtendEvery)
	r.loop = &dispatch.Loop[queue.Delivery]{
		Settings: r.cfg.Settings,
		ExtendBy: extendBy,
		Log:      log,
		Lines: dispatch.Lines{
			ReceiveFailed:      "outbox: receiving from the outbox failed",
			ReceiveFailedLevel: slog.LevelWarn,
			ShutdownTimeout:    "outbox: shutdown timeout passed; cancelling the publishes still under way and handing their messages back",
			Abandoned:          "outbox: publishes still under way after their contexts were cancelled; returning without them",
			// Another relay that gets the message publishes it with the
			// same dedup id: the target drops the second copy.
			ExtendFailed: "outbox: extending the delivery failed",
		},
		Receive: from.Receive,
		Group:   func(d queue.Delivery) string { return d.Message().GroupID },
		Extend:  func(ctx context.Context, d queue.Delivery, by time.Duration) error { return d.Extend(ctx, by) },
		Process: func(ctx context.Context, d queue.Delivery, keep *dispatch.Keep[queue.Delivery]) bool {
			_, done := r.relay(ctx, d, keep)
			return done
		},
		HandBack: r.handBack,
		Attrs:    func(d queue.Delivery) []slog.Attr { return []slog.Attr{slog.String("outbox_id", d.Message().ID)} },
	}
	return r, nil
}

// DedupID returns the dedup id the relay publishes m with: m's own
// DedupID, or one derived from its id and publish time (see [Relay]).
func (r *Relay) DedupID(m queue.Message) string {
	if m.DedupID != "" {
		return m.DedupID
	}
	if m.ID == "" {
		return ""
	}
	id := r.cfg.dedupPrefix + m.ID
	if !m.Published.IsZero() {
		id += ":" + strconv.FormatInt(m.Published.UnixMicro(), 10)
	}
	return id
}

// settleTimeout bounds one Ack, Retry or DeadLetter of an outbox message.
// It runs under a context apart from the publish's: a message whose
// publish was cancelled must still be handed back.
const settleTimeout = 30 * time.Second

// Run relays messages until ctx is done. Then it stops receiving, hands
// back the messages not yet started, lets the publishes under way finish
// for the shutdown timeout ([WithShutdownTimeout]), cancels those still
// running, hands back every message not relayed (Retry(0)), and returns
// nil. A receive error is logged and retried with backoff. A publisher
// that ignores its cancelled context does not keep Run from returning (it
// waits 5 s more for it): its message comes back to the outbox when its
// visibility lapses.
func (r *Relay) Run(ctx context.Context) error {
	r.loop.Run(ctx)
	return nil
}

// publishTimeoutMargin is how long past its publish timeout a publish that
// ignores its context keeps its message extended.
const publishTimeoutMargin = time.Second

// drainIdle is how long a receive of [Relay.Drain] waits for a message
// before Drain decides the outbox holds no more that are due.
const drainIdle = 250 * time.Millisecond

// Drain relays the messages that are due in the outbox and returns when a
// receive has found none for a short while (250 ms), or when ctx is done.
// After a batch in which a publish failed (the target is failing), it
// returns: the messages it retried wait out their backoff, and the rest
// stay, for the next Drain; so Drain returns while the target is down. The
// 250 ms also bound each receive: a receive slower than that (an
// application transaction holding SQLite's write lock, a slow database)
// ends Drain as if the outbox were empty, and the next Drain relays what
// is due. It returns how many messages it relayed (acked after a
// confirmed publish, duplicates included). Messages that are delayed or
// held by another relay stay for the next Drain too. It
// returns ctx's error when ctx ended it (the publishes under way then
// stop, and their messages are handed back), and a receive error as it
// is. Use it in tests and from cron-like jobs; use [Relay.Run] in a
// long-lived process.
func (r *Relay) Drain(ctx context.Context) (int, error) {
	var relayed atomic.Int64
	var failed atomic.Bool // a publish (or an ack) failed: the target is failing
	for {
		rctx, cancel := context.WithTimeout(ctx, drainIdle)
		ds, err := r.from.Receive(rctx, r.cfg.BatchSize)
		idle := rctx.Err() != nil
		cancel()
		if len(ds) == 0 {
			switch {
			case ctx.Err() != nil:
				return int(relayed.Load()), ctx.Err()
			case err != nil && !idle:
				return int(relayed.Load()), fmt.Errorf("outbox: receiving from the outbox: %w", err)
			}
			return int(relayed.Load()), nil
		}
		loop := *r.loop // this batch's relayed messages are counted
		loop.Process = func(ctx context.Context, d queue.Delivery, keep *dispatch.Keep[queue.Delivery]) bool {
			ok, done := r.relay(ctx, d, keep)
			switch {
			case ok:
				relayed.Add(1)
			case !done:
				failed.Store(true)
			}
			return done
		}
		loop.HandleBatch(ctx, ds)
		if failed.Load() {
			// The target is failing: the messages retried wait out their
			// backoff, and the others are left, for the next Drain.
			return int(relayed.Load()), nil
		}
	}
}

// handBack returns a message to the outbox untouched (Retry(0)): the relay
// is stopping, or an earlier message of its group is not relayed.
func (r *Relay) handBack(ctx context.Context, d queue.Delivery, why dispatch.HandBackReason) {
	reason := "the relay is stopping"
	if why == dispatch.BehindNotDone {
		reason = "an earlier message of its group is not relayed"
	}
	m := d.Message()
	err := r.settle(d, actionRetry, 0, "")
	level := slog.LevelDebug
	attrs := []slog.Attr{slog.String("outbox_id", m.ID), slog.String("reason", reason)}
	if m.GroupID != "" {
		attrs = append(attrs, slog.String("group_id", m.GroupID))
	}
	if err != nil {
		level = slog.LevelWarn
		attrs = append(attrs, slog.String("settle_error", err.Error()))
	}
	r.log.LogAttrs(context.Background(), level, "outbox message handed back", attrs...)
}

type action string

const (
	actionAck        action = "ack"
	actionRetry      action = "retry"
	actionDeadLetter action = "dead-letter"
)

// outboxName is the outbox's name, for events, if it has one.
func (r *Relay) outboxName() string {
	if n, ok := r.from.(interface{ Name() string }); ok {
		return n.Name()
	}
	return ""
}

// relay publishes one outbox message and settles it. ok reports that it
// was relayed (published, or found a duplicate, and acked); done that it
// left the outbox (relayed or dead-lettered), so that its group may go on.
func (r *Relay) relay(ctx context.Context, d queue.Delivery, keep *dispatch.Keep[queue.Delivery]) (ok, done bool) {
	m := d.Message()
	out := queue.Outgoing{
		Body:       m.Body,
		Attributes: maps.Clone(m.Attributes),
		DedupID:    r.DedupID(m),
		GroupID:    m.GroupID,
	}
	if _, ok := out.Attributes[KeyAttribute]; !ok {
		// A message written without an operation key carries its
		// derived dedup id as its key, so that a consumer keyed by
		// MessageKey (the only line on a target without dedup) tells
		// the copies of one outbox message apart from others.
		if out.Attributes == nil {
			out.Attributes = map[string]string{}
		}
		out.Attributes[KeyAttribute] = out.DedupID
	}
	// A publisher that ignores its context must not hold the message for
	// good: once the publish timeout (and a little more) has passed, the
	// message is no longer extended, its visibility lapses, and another
	// relay publishes it with the same dedup id.
	keep.StopAfter(r.cfg.publishTimeout + publishTimeoutMargin)
	pctx, cancel := context.WithTimeout(ctx, r.cfg.publishTimeout)
	p, err := r.publish(pctx, out)
	cancel()
	keep.Stop()

	attrs := []slog.Attr{
		slog.String("outbox_id", m.ID),
		slog.String("dedup_id", out.DedupID),
		slog.Int("receive_count", m.ReceiveCount),
	}
	if m.GroupID != "" {
		attrs = append(attrs, slog.String("group_id", m.GroupID))
	}
	if err == nil {
		if obs := r.cfg.observer; obs != nil {
			e := idem.Event{Kind: idem.RelayPublished, MessageID: m.ID, Queue: r.outboxName(), Attributes: m.Attributes}
			if !m.Published.IsZero() {
				e.Started, e.Duration = m.Published, time.Since(m.Published)
			}
			obs.Observe(ctx, e)
		}
		attrs = append(attrs, slog.String("target_id", p.ID), slog.Bool("duplicate", p.Duplicate))
		if serr := r.settle(d, actionAck, 0, ""); serr != nil {
			r.log.LogAttrs(ctx, slog.LevelWarn, "outbox message relayed, but its ack failed: it will be published again with the same dedup id",
				append(attrs, slog.String("settle_error", serr.Error()))...)
			return false, false
		}
		r.log.LogAttrs(ctx, slog.LevelDebug, "outbox message relayed", attrs...)
		return true, true
	}

	attrs = append(attrs, slog.String("error", err.Error()))
	var (
		act    action
		delay  time.Duration
		reason string
		msg    string
		why    string // the RelayRefused reason; "": none (stopped)
	)
	switch {
	case ctx.Err() != nil:
		act, msg = actionRetry, "outbox publish stopped: handed back"
	case r.permanent(err):
		act, msg, why = actionDeadLetter, "outbox message dead-lettered: the target refused it", "refused"
		reason = "outbox: the target refused the message for good: " + err.Error()
	case r.cfg.maxReceives > 0 && m.ReceiveCount >= r.cfg.maxReceives:
		act, msg, why = actionDeadLetter, "outbox message dead-lettered: out of receives", "max-receives"
		reason = fmt.Sprintf("outbox: publish failed on receive %d of at most %d: %v", m.ReceiveCount, r.cfg.maxReceives, err)
	default:
		act, msg, why = actionRetry, "outbox publish failed: retried", "retried"
		delay = r.backoff(m.ReceiveCount)
	}
	if obs := r.cfg.observer; obs != nil && why != "" {
		obs.Observe(ctx, idem.Event{Kind: idem.RelayRefused, MessageID: m.ID, Queue: r.outboxName(), Attributes: m.Attributes,
			Receives: m.ReceiveCount, Reason: why, Err: err, Delay: delay})
	}
	attrs = append(attrs, slog.String("action", string(act)))
	if act == actionRetry {
		attrs = append(attrs, slog.Duration("delay", delay))
	} else {
		attrs = append(attrs, slog.String("reason", reason))
	}
	serr := r.settle(d, act, delay, reason)
	if serr != nil {
		attrs = append(attrs, slog.String("settle_error", serr.Error()))
	}
	r.log.LogAttrs(ctx, slog.LevelWarn, msg, attrs...)
	return false, act == actionDeadLetter && serr == nil
}

// publish calls the target, turning a panic into an error.
func (r *Relay) publish(ctx context.Context, m queue.Outgoing) (p queue.Published, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("outbox: the publisher panicked: %v", v)
		}
	}()
	return r.to.Publish(ctx, m)
}

// permanent reports whether err says the target refused the message for
// good (see [Relay]).
func (r *Relay) permanent(err error) bool {
	var perm *idem.PermanentError
	if errors.As(err, &perm) || errors.Is(err, queue.ErrRefused) || errors.Is(err, queue.ErrUnsupported) || errors.Is(err, queue.ErrUndecodable) {
		return true
	}
	for _, t := range r.cfg.permanent {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// settle acks, retries or dead-letters d, under a context of its own.
func (r *Relay) settle(d queue.Delivery, act action, delay time.Duration, reason string) error {
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	switch act {
	case actionAck:
		return d.Ack(ctx)
	case actionDeadLetter:
		return d.DeadLetter(ctx, reason)
	}
	return d.Retry(ctx, delay)
}

// backoff is the retry delay after the n-th failure: base·2^(n-1), capped,
// then jittered to between half and all of it.
func (r *Relay) backoff(n int) time.Duration {
	return r.cfg.Backoff.Delay(n)
}
