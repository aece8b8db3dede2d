package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
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
// error wrapping [idem.PermanentError], [queue.ErrUnsupported],
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
	from       queue.Source
	to         queue.Publisher
	cfg        config
	log        *slog.Logger
	visibility time.Duration
	extendBy   time.Duration
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
	log := cfg.logger
	if log == nil {
		log = slog.Default()
	}
	r := &Relay{from: from, to: to, cfg: cfg, log: log, visibility: from.Visibility()}
	if v := r.visibility; v > 0 {
		if v < cfg.publishTimeout {
			return nil, fmt.Errorf("%w: the outbox's visibility %v is shorter than the publish timeout %v: raise the outbox's visibility or lower WithPublishTimeout",
				queue.ErrVisibilityTooShort, v, cfg.publishTimeout)
		}
		if r.cfg.extendEvery == 0 {
			r.cfg.extendEvery = v / 3
		}
	}
	r.extendBy = r.visibility
	if r.extendBy == 0 {
		r.extendBy = 3 * r.cfg.extendEvery
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
// nil. A receive error is logged and retried with backoff.
func (r *Relay) Run(ctx context.Context) error {
	pctx, cancelPublishes := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelPublishes()
	slots := make(chan struct{}, r.cfg.concurrency)
	var wg sync.WaitGroup
	failures, empties := 0, 0
receive:
	for ctx.Err() == nil {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			break receive
		}
		n := 1
		for n < min(r.cfg.batchSize, r.cfg.concurrency) {
			select {
			case slots <- struct{}{}:
				n++
				continue
			default:
			}
			break
		}
		ds, err := r.from.Receive(ctx, n)
		if len(ds) == 0 {
			for range n {
				<-slots
			}
			if ctx.Err() != nil {
				break
			}
			if err != nil {
				failures++
				d := r.backoff(failures)
				r.log.LogAttrs(ctx, slog.LevelWarn, "outbox: receiving from the outbox failed", slog.Any("error", err), slog.Duration("retry_in", d))
				if !sleep(ctx, d) {
					break
				}
				continue
			}
			empties++ // a source that returns nothing without waiting
			if !sleep(ctx, emptyPause(empties)) {
				break
			}
			continue
		}
		failures, empties = 0, 0
		units := r.hold(pctx, ds)
		for ; n > len(units); n-- {
			<-slots
		}
		for i, u := range units {
			if i >= n { // more units than slots held: wait for one
				select {
				case slots <- struct{}{}:
				case <-ctx.Done():
					for _, u := range units[i:] {
						r.handBack(u, "the relay is stopping")
					}
					break receive
				}
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				r.runUnit(ctx, pctx, u, nil)
			}()
		}
	}

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	timer := time.NewTimer(r.cfg.shutdownTimeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		r.log.Warn("outbox: shutdown timeout passed; cancelling the publishes still under way and handing their messages back",
			slog.Duration("shutdown_timeout", r.cfg.shutdownTimeout))
		cancelPublishes()
		grace := time.NewTimer(shutdownGrace)
		defer grace.Stop()
		select {
		case <-done:
		case <-grace.C:
			// A publisher that ignores its cancelled context must not
			// keep Run from returning: its message comes back to the
			// outbox when its visibility lapses.
			r.log.Error("outbox: publishes still under way after their contexts were cancelled; returning without them",
				slog.Duration("grace", shutdownGrace))
		}
	}
	return nil
}

// shutdownGrace is how long Run waits, after cancelling the publishes
// still under way at the shutdown timeout, for them to return.
const shutdownGrace = 5 * time.Second

// drainIdle is how long a receive of [Relay.Drain] waits for a message
// before Drain decides the outbox holds no more that are due.
const drainIdle = 250 * time.Millisecond

// Drain relays the messages that are due in the outbox and returns when a
// receive has found none for a short while (250 ms), or when ctx is done.
// It returns how many messages it relayed (acked after a confirmed
// publish, duplicates included). Messages it retried with a delay, or
// that are delayed or held by another relay, stay for the next Drain. It
// returns ctx's error when ctx ended it (the publishes under way then
// stop, and their messages are handed back), and a receive error as it
// is. Use it in tests and from cron-like jobs; use [Relay.Run] in a
// long-lived process.
func (r *Relay) Drain(ctx context.Context) (int, error) {
	var relayed atomic.Int64
	for {
		rctx, cancel := context.WithTimeout(ctx, drainIdle)
		ds, err := r.from.Receive(rctx, r.cfg.batchSize)
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
		slots := make(chan struct{}, r.cfg.concurrency)
		var wg sync.WaitGroup
		for _, u := range r.hold(ctx, ds) {
			slots <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				r.runUnit(ctx, ctx, u, &relayed)
			}()
		}
		wg.Wait()
	}
}

// held is a delivery the relay holds, and the extension that keeps it
// invisible until it is settled.
type held struct {
	d    queue.Delivery
	keep *keeping // nil when the relay does not extend
}

// hold starts keeping every one of ds invisible under ctx, and splits them
// into units of work: each message without a group alone, and each FIFO
// group's messages together, in batch order.
func (r *Relay) hold(ctx context.Context, ds []queue.Delivery) [][]held {
	units := make([][]held, 0, len(ds))
	group := map[string]int{}
	for _, d := range ds {
		h := held{d: d, keep: r.keepVisible(ctx, d)}
		g := d.Message().GroupID
		if g == "" {
			units = append(units, []held{h})
			continue
		}
		if i, ok := group[g]; ok {
			units[i] = append(units[i], h)
			continue
		}
		group[g] = len(units)
		units = append(units, []held{h})
	}
	return units
}

// runUnit relays a unit's messages in order. Once one is not done (or the
// relay is stopping), the rest are handed back untouched. relayed, when
// not nil, counts the messages relayed.
func (r *Relay) runUnit(runCtx, pctx context.Context, unit []held, relayed *atomic.Int64) {
	defer func() {
		for _, h := range unit {
			h.keep.stop()
		}
	}()
	for i, h := range unit {
		if runCtx.Err() != nil || pctx.Err() != nil {
			r.handBack(unit[i:], "the relay is stopping")
			return
		}
		ok, done := r.relay(pctx, h)
		if ok && relayed != nil {
			relayed.Add(1)
		}
		if !done {
			r.handBack(unit[i+1:], "an earlier message of its group is not relayed")
			return
		}
	}
}

// handBack returns messages to the outbox untouched (Retry(0)), in order.
func (r *Relay) handBack(unit []held, why string) {
	for _, h := range unit {
		h.keep.stop()
		m := h.d.Message()
		err := r.settle(h.d, actionRetry, 0, "")
		level := slog.LevelDebug
		attrs := []slog.Attr{slog.String("outbox_id", m.ID), slog.String("reason", why)}
		if m.GroupID != "" {
			attrs = append(attrs, slog.String("group_id", m.GroupID))
		}
		if err != nil {
			level = slog.LevelWarn
			attrs = append(attrs, slog.String("settle_error", err.Error()))
		}
		r.log.LogAttrs(context.Background(), level, "outbox message handed back", attrs...)
	}
}

type action string

const (
	actionAck        action = "ack"
	actionRetry      action = "retry"
	actionDeadLetter action = "dead-letter"
)

// relay publishes one outbox message and settles it. ok reports that it
// was relayed (published, or found a duplicate, and acked); done that it
// left the outbox (relayed or dead-lettered), so that its group may go on.
func (r *Relay) relay(ctx context.Context, h held) (ok, done bool) {
	m := h.d.Message()
	out := queue.Outgoing{
		Body:       m.Body,
		Attributes: maps.Clone(m.Attributes),
		DedupID:    r.DedupID(m),
		GroupID:    m.GroupID,
	}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.publishTimeout)
	p, err := r.publish(pctx, out)
	cancel()
	h.keep.stop()

	attrs := []slog.Attr{
		slog.String("outbox_id", m.ID),
		slog.String("dedup_id", out.DedupID),
		slog.Int("receive_count", m.ReceiveCount),
	}
	if m.GroupID != "" {
		attrs = append(attrs, slog.String("group_id", m.GroupID))
	}
	if err == nil {
		attrs = append(attrs, slog.String("target_id", p.ID), slog.Bool("duplicate", p.Duplicate))
		if serr := r.settle(h.d, actionAck, 0, ""); serr != nil {
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
	)
	switch {
	case ctx.Err() != nil:
		act, msg = actionRetry, "outbox publish stopped: handed back"
	case r.permanent(err):
		act, msg = actionDeadLetter, "outbox message dead-lettered: the target refused it"
		reason = "outbox: the target refused the message for good: " + err.Error()
	case r.cfg.maxReceives > 0 && m.ReceiveCount >= r.cfg.maxReceives:
		act, msg = actionDeadLetter, "outbox message dead-lettered: out of receives"
		reason = fmt.Sprintf("outbox: publish failed on receive %d of at most %d: %v", m.ReceiveCount, r.cfg.maxReceives, err)
	default:
		act, msg = actionRetry, "outbox publish failed: retried"
		delay = r.backoff(m.ReceiveCount)
	}
	attrs = append(attrs, slog.String("action", string(act)))
	if act == actionRetry {
		attrs = append(attrs, slog.Duration("delay", delay))
	} else {
		attrs = append(attrs, slog.String("reason", reason))
	}
	serr := r.settle(h.d, act, delay, reason)
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
	if errors.As(err, &perm) || errors.Is(err, queue.ErrUnsupported) || errors.Is(err, queue.ErrUndecodable) {
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
	d := r.cfg.backoffBase
	for i := 1; i < n && d < r.cfg.backoffMax; i++ {
		if d > r.cfg.backoffMax/2 {
			d = r.cfg.backoffMax
			break
		}
		d *= 2
	}
	d = min(d, r.cfg.backoffMax)
	half := d / 2
	return half + rand.N(d-half+1)
}

// emptyPause is the wait after the n-th receive in a row that returned
// nothing without waiting: 5 ms doubled per receive, up to 250 ms.
func emptyPause(n int) time.Duration {
	if n > 10 {
		return 250 * time.Millisecond
	}
	return min((5*time.Millisecond)<<n, 250*time.Millisecond)
}

// sleep waits d or until ctx is done; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// keeping keeps one delivery invisible: it extends it every extendEvery
// until stopped. It is a timer, not a goroutine.
type keeping struct {
	r       *Relay
	d       queue.Delivery
	ctx     context.Context
	cancel  context.CancelFunc
	run     sync.Mutex // held by an extension; stop waits for it
	stopped atomic.Bool
	t       *time.Timer
}

// keepVisible extends d every extendEvery, by extendBy, until the returned
// keeping is stopped or ctx is done. It returns nil (whose methods do
// nothing) when the relay does not extend.
func (r *Relay) keepVisible(ctx context.Context, d queue.Delivery) *keeping {
	if r.cfg.extendEvery <= 0 {
		return nil
	}
	k := &keeping{r: r, d: d}
	k.ctx, k.cancel = context.WithCancel(ctx)
	k.run.Lock() // a first extension waits for t
	k.t = time.AfterFunc(r.cfg.extendEvery, k.extend)
	k.run.Unlock()
	return k
}

func (k *keeping) extend() {
	k.run.Lock()
	defer k.run.Unlock()
	if k.stopped.Load() || k.ctx.Err() != nil {
		return
	}
	r := k.r
	asked := time.Now()
	ectx, cancel := context.WithTimeout(k.ctx, r.cfg.extendEvery)
	err := k.d.Extend(ectx, r.extendBy)
	cancel()
	if err != nil && k.ctx.Err() == nil {
		// Another relay that gets the message publishes it with the same
		// dedup id: the target drops the second copy.
		r.log.LogAttrs(k.ctx, slog.LevelWarn, "outbox: extending the delivery failed",
			slog.String("outbox_id", k.d.Message().ID), slog.Any("error", err))
	}
	if !k.stopped.Load() {
		k.t.Reset(max(r.cfg.extendEvery-time.Since(asked), 0))
	}
}

// stop ends the extensions and waits for one under way (cancelled) to
// return. It may be called more than once.
func (k *keeping) stop() {
	if k == nil {
		return
	}
	k.stopped.Store(true)
	k.t.Stop()
	k.cancel()
	k.run.Lock()
	k.run.Unlock()
}
