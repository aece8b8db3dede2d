// Package demo runs the receipts worker of "Preventing Duplicate Sends"
// on idem's own parts: receipt jobs published to a queue
// (sqlqueue in the store's own SQLite file when the store is sqlitestore,
// memqueue otherwise), two queue.Consumer workers that key each job
// idem.Key("receipt", orderID, userID) and send the email through a
// simulated mail provider, and two workers that die between "sent" and
// "recorded", one job under AtLeastOnce and one under AtMostOnce.
//
// A dying worker is made the way a killed process leaves things: it
// receives its job from the queue, claims the key through a Ledger, sends
// the email, and then nothing more reaches the store or the broker (no
// completion, no heartbeat, no release, no ack). The record stays
// in_progress until its lease lapses and the broker hands the message out
// again when its visibility timeout ends.
//
// What happened is read off the consumers' own log lines ("queue message
// <outcome>", one per delivery, with key, outcome, fence, attempt and
// message id): the demo counts them, as an operator would.
package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/memqueue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/sqlitestore"
)

// Config is one run of the demo.
type Config struct {
	Store store.Store
	// Orders is how many receipt jobs (at least 7; default 20).
	Orders int
	// Seed makes the upstream's re-enqueues (default 1): the same seed
	// gives the same messages.
	Seed uint64
	// Lease is the ledger's lease (default 300 ms), short so that the
	// crashed attempts lapse quickly.
	Lease time.Duration
	// SendTime is the mail provider's latency (default 20 ms).
	SendTime time.Duration
	// Visibility is how long the queue waits for an ack before it hands a
	// message out again (default 5/3 of Lease: more than the lease, as it
	// must be).
	Visibility time.Duration
	// Consumers is how many concurrent queue.Consumer workers (default 2).
	Consumers int
	// MaxReceives is how many times a message is received before the
	// consumers dead-letter it (default 3): the AtMostOnce key that
	// crashed is refused as indeterminate that many times, then left for
	// an operator.
	MaxReceives int
	// Timeout is how long the run may go without progress (a store read,
	// a publish, a crash, a consumer's delivery) before it gives up
	// (default 60 s; at least twice Visibility, the longest a crashed
	// message waits to come back). It does not bound a long run that
	// progresses: many orders take as long as they take.
	Timeout time.Duration
}

func (c *Config) defaults() {
	if c.Orders == 0 {
		c.Orders = 20
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Lease == 0 {
		c.Lease = 300 * time.Millisecond
	}
	if c.SendTime == 0 {
		c.SendTime = 20 * time.Millisecond
	}
	if c.Visibility == 0 {
		c.Visibility = c.Lease * 5 / 3
	}
	if c.Consumers == 0 {
		c.Consumers = 2
	}
	if c.MaxReceives == 0 {
		c.MaxReceives = 3
	}
	if c.Timeout == 0 {
		c.Timeout = time.Minute
	}
	c.Timeout = max(c.Timeout, 2*c.Visibility)
}

// Indexes of the orders whose first delivery crashes.
const (
	crashAtLeastOnce = 2
	crashAtMostOnce  = 6
)

// Mail is one email the simulated provider accepted.
type Mail struct {
	ProviderID string // the provider's message id, the attempt's result
	MessageID  string // the queue message that caused it
}

// Line is one of the consumers' log lines: one per delivery handled.
type Line struct {
	Outcome, Action, Key, MessageID string
	Cause                           string // of a dead letter: indeterminate, max-receives, ...
	Fence                           int64
	Attempt, ReceiveCount           int
	Text                            string // the line as slog's text handler writes it, without the time
}

// Summary is what happened in a run.
type Summary struct {
	Orders int
	// Keys are the operation keys, in order.
	Keys []string
	// Queue names the broker.
	Queue string
	// Published is how many messages were published: Orders jobs,
	// Reenqueued copies of jobs the upstream enqueued again under a new
	// message id, and CrashReenqueued: the crashed jobs, enqueued again
	// by the upstream that saw no confirmation.
	Published, Reenqueued, CrashReenqueued int
	// Deliveries is how many deliveries were handled: by the consumers
	// (one log line each) and by the two workers that died.
	Deliveries int
	// Redelivered: deliveries of a message received before (the broker
	// handing it out again after a visibility timeout or a retry).
	Redelivered int
	// Executed: deliveries whose handler sent the email for the first
	// time on its key and recorded it (outcome "executed").
	Executed int
	// BusyRetries: deliveries that found another attempt holding the key
	// and were put back with its Retry-After; Retries the others put back
	// (the AtMostOnce key refused as indeterminate).
	BusyRetries, Retries int
	// AfterCrash: messages caused by the crashes: each crashed message
	// handed out again, and the upstream's re-enqueue of each crashed job.
	AfterCrash int
	// Sent is how many emails went out; Sends per key; Outbox every mail.
	Sent   int
	Sends  map[string]int
	Outbox map[string][]Mail
	// Replayed: duplicates suppressed (skipped, already done).
	Replayed int
	// Takeovers: attempts that took over a lapsed attempt.
	Takeovers    int
	TakeoverKeys []string
	// Indeterminate: deliveries refused because an AtMostOnce attempt had
	// lapsed (ErrIndeterminate), retried and then dead-lettered;
	// IndeterminateDeadLettered the dead-lettered ones among them.
	Indeterminate, IndeterminateDeadLettered int
	// Other counts the consumers' deliveries of any other outcome (none in
	// a correct run), by outcome ("dead-lettered (cause)" for a dead letter).
	Other map[string]int
	// DeadLettered: the keys of the dead-lettered messages.
	DeadLettered []string
	// Crashes describes each injected crash, in order.
	Crashes []string
	// CrashedAtLeastOnce and CrashedAtMostOnce are the crashed keys.
	CrashedAtLeastOnce, CrashedAtMostOnce string
	// Lines are the consumers' log lines, in order.
	Lines []Line
	// Errors are unexpected errors (none in a correct run).
	Errors []string
	Took   time.Duration
}

// Queue is what the demo needs of a broker.
type Queue interface {
	queue.Source
	queue.Publisher
}

type order struct{ ID, User int }

type job struct {
	order  order
	policy idem.Policy
	body   []byte
}

// attrPolicy carries a job's policy in its message.
const attrPolicy = "policy"

// policyOf is the policy a message names (AtLeastOnce if none).
func policyOf(m queue.Message) idem.Policy {
	p, err := idem.ParsePolicy(m.Attributes[attrPolicy])
	if err != nil {
		return idem.AtLeastOnce
	}
	return p
}

// Run runs the demo and reports what happened.
func Run(ctx context.Context, cfg Config) (*Summary, error) {
	cfg.defaults()
	if cfg.Store == nil {
		return nil, errors.New("demo: no store")
	}
	if cfg.Orders < 7 {
		return nil, fmt.Errorf("demo: need at least 7 orders, got %d", cfg.Orders)
	}
	start := time.Now()
	r := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	users := make([]int, cfg.Orders)
	for i := range users {
		users[i] = 1 + r.IntN(99)
	}
	base, err := freeOrderBase(ctx, cfg.Store, users, cfg.Timeout)
	if err != nil {
		return nil, err
	}
	q, name, closeQueue, err := openQueue(ctx, cfg, "receipts-"+strconv.Itoa(base))
	if err != nil {
		return nil, err
	}
	defer closeQueue()

	sum := &Summary{Orders: cfg.Orders, Queue: name, Sends: map[string]int{}, Outbox: map[string][]Mail{}, Other: map[string]int{}}
	var jobs []job
	for i := range cfg.Orders {
		o := order{ID: base + i, User: users[i]}
		j := job{order: o, policy: idem.AtLeastOnce}
		j.body, _ = json.Marshal(map[string]any{"orderId": o.ID, "userId": o.User, "to": fmt.Sprintf("user%d@example.com", o.User)})
		key := idem.Key("receipt", o.ID, o.User).String()
		sum.Keys = append(sum.Keys, key)
		switch i {
		case crashAtLeastOnce:
			sum.CrashedAtLeastOnce = key
		case crashAtMostOnce:
			j.policy = idem.AtMostOnce
			sum.CrashedAtMostOnce = key
		}
		jobs = append(jobs, j)
	}
	// The other jobs' duplicates: 0 to 2 more copies each, the upstream
	// enqueueing the job again under a new message id, a few places
	// behind the original (close enough that two consumers sometimes hold
	// both at once).
	type dup struct {
		j   job
		pos int
	}
	var dups []dup
	for i, j := range jobs {
		if i == crashAtLeastOnce || i == crashAtMostOnce {
			continue // their duplicates come from the crash itself
		}
		for range r.IntN(3) {
			dups = append(dups, dup{j, i + 1 + r.IntN(6)})
		}
	}
	order := slices.Clone(jobs)
	for k := len(dups) - 1; k >= 0; k-- {
		order = slices.Insert(order, min(dups[k].pos, len(order)), dups[k].j)
	}
	order = slices.DeleteFunc(order, func(j job) bool {
		return j.order == jobs[crashAtLeastOnce].order || j.order == jobs[crashAtMostOnce].order
	})
	sum.Reenqueued = len(dups)

	w := &world{cfg: cfg, q: q, sum: sum, provider: &provider{outbox: sum.Outbox}}
	w.tally = newTally()

	// The two workers that die take the crashed jobs first.
	if err := w.crashes(ctx, jobs[crashAtLeastOnce], jobs[crashAtMostOnce]); err != nil {
		return sum, err
	}
	for _, j := range order {
		if err := w.publish(ctx, j, 0); err != nil {
			return sum, err
		}
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for c := range cfg.Consumers {
		name := fmt.Sprintf("consumer-%d", c+1)
		l := idem.New(cfg.Store, idem.WithOwner(name), idem.WithLease(cfg.Lease), idem.WithLogger(discard))
		cons, err := queue.NewConsumer(q, l, receiptKey, w.send,
			queue.WithHandlerTimeout(cfg.Visibility),
			queue.WithBusyDelay(cfg.Lease/2),
			queue.WithBackoff(cfg.Lease/10, cfg.Lease/2),
			queue.WithMaxReceives(cfg.MaxReceives),
			queue.WithCallOptions(func(m queue.Message) []idem.CallOption {
				return []idem.CallOption{idem.WithPolicy(policyOf(m)), idem.Fingerprint(m.Body)}
			}),
			queue.WithLogger(slog.New(w.tally)))
		if err != nil {
			return sum, err
		}
		wg.Go(func() {
			if err := cons.Run(runCtx); err != nil && runCtx.Err() == nil {
				w.note(func(s *Summary) { s.Errors = append(s.Errors, fmt.Sprintf("%s: %v", name, err)) })
			}
		})
	}
	// Done when every published message is settled: acked or
	// dead-lettered.
	err = w.tally.waitSettled(ctx, func() int { return w.published() }, cfg.Timeout)
	stop()
	wg.Wait()
	sum.Took = time.Since(start)
	w.tally.summarize(sum)
	sum.Published = w.published()
	sum.Deliveries = len(sum.Lines) + len(sum.Crashes)
	for k, mails := range sum.Outbox {
		sum.Sends[k] = len(mails)
		sum.Sent += len(mails)
	}
	if err != nil {
		return sum, fmt.Errorf("demo: the queue did not drain: %w", err)
	}
	return sum, nil
}

var discard = slog.New(slog.DiscardHandler)

// openQueue opens the demo's queue: sqlqueue in the store's database file
// when the store is sqlitestore (sharing its writer), memqueue otherwise.
func openQueue(ctx context.Context, cfg Config, name string) (Queue, string, func(), error) {
	if s, ok := cfg.Store.(*sqlitestore.Store); ok {
		h, err := sqlqueue.NewSQLite(ctx, s.DB(), sqlqueue.WithGroupCommit(s), sqlqueue.WithLogger(discard))
		if err != nil {
			return nil, "", nil, fmt.Errorf("demo: opening the queue: %w", err)
		}
		q, err := h.Queue(name, sqlqueue.WithVisibility(cfg.Visibility))
		if err != nil {
			h.Close()
			return nil, "", nil, fmt.Errorf("demo: opening the queue: %w", err)
		}
		return q, fmt.Sprintf("sqlqueue %q in the store's SQLite file", name), func() { h.Close() }, nil
	}
	return memqueue.New(memqueue.WithVisibility(cfg.Visibility)), "memqueue (in process)", func() {}, nil
}

// receiptKey is the consumers' KeyFunc: the key names the outcome ("order
// N's receipt to user U"), never the message id.
func receiptKey(m queue.Message) (idem.OperationKey, error) {
	var j struct{ OrderID, UserID int }
	if err := json.Unmarshal(m.Body, &j); err != nil || j.OrderID == 0 || j.UserID == 0 {
		return idem.OperationKey{}, queue.Undecodable(fmt.Errorf("not a receipt job: %q", m.Body))
	}
	return idem.Key("receipt", j.OrderID, j.UserID), nil
}

// freeOrderBase picks the first order id so that none of the run's keys
// exists in the store yet (a store given with --store may hold an earlier
// run's records).
func freeOrderBase(ctx context.Context, s store.Store, users []int, timeout time.Duration) (int, error) {
	for base := 1001; base < 1001+100*1000; base += 100 {
		free := true
		for i, u := range users {
			gctx, cancel := context.WithTimeout(ctx, timeout)
			_, err := s.Get(gctx, idem.Key("receipt", base+i, u).String())
			cancel()
			if err == nil {
				free = false
				break
			}
			if !errors.Is(err, store.ErrNotFound) {
				return 0, fmt.Errorf("demo: reading the store: %w", err)
			}
		}
		if free {
			return base, nil
		}
	}
	return 0, errors.New("demo: the store is full of earlier demo runs")
}

// world is the shared state of one run.
type world struct {
	cfg      Config
	q        Queue
	provider *provider
	tally    *tally

	mu         sync.Mutex
	sum        *Summary
	nPublished int
}

func (w *world) note(f func(s *Summary)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f(w.sum)
}

func (w *world) published() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.nPublished
}

func (w *world) publish(ctx context.Context, j job, delay time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	_, err := w.q.Publish(ctx, queue.Outgoing{Body: j.body, Attributes: map[string]string{attrPolicy: j.policy.String()}, Delay: delay})
	if err != nil {
		return fmt.Errorf("demo: publishing: %w", err)
	}
	w.mu.Lock()
	w.nPublished++
	w.mu.Unlock()
	return nil
}

// send is the consumers' handler. A queue.Handler is given the message
// only, so it keys it as the consumer did (receiptKey) and sends.
func (w *world) send(ctx context.Context, m queue.Message) ([]byte, error) {
	k, err := receiptKey(m)
	if err != nil {
		return nil, err
	}
	return w.sendReceipt(ctx, k, m)
}

// sendReceipt sends the receipt keyed k, for m, through the simulated
// provider and returns the provider's message id as the result.
func (w *world) sendReceipt(ctx context.Context, k idem.OperationKey, m queue.Message) ([]byte, error) {
	t := time.NewTimer(w.cfg.SendTime)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return nil, idem.NotDone(ctx.Err())
	}
	return []byte(w.provider.send(k.String(), Mail{MessageID: m.ID})), nil
}

// crashes publishes the two crashed jobs and hands each to a worker that
// dies after sending: it receives the message, claims the key, sends, and
// is gone before it records the send or settles the message.
func (w *world) crashes(ctx context.Context, jobs ...job) error {
	for _, j := range jobs {
		if err := w.publish(ctx, j, 0); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	for i, j := range jobs {
		ds, err := w.q.Receive(ctx, 1)
		if err != nil {
			return fmt.Errorf("demo: receiving: %w", err)
		}
		if len(ds) != 1 {
			return fmt.Errorf("demo: received %d messages, want 1", len(ds))
		}
		m := ds[0].Message()
		name := fmt.Sprintf("consumer-%d", w.cfg.Consumers+1+i)
		cs := &dyingStore{Store: w.cfg.Store}
		l := idem.New(cs, idem.WithOwner(name), idem.WithLease(w.cfg.Lease), idem.WithLogger(discard))
		key, err := receiptKey(m)
		if err != nil {
			return err
		}
		var providerID string
		_, err = l.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
			v, err := w.sendReceipt(ctx, key, m)
			providerID = string(v)
			cs.die()
			return v, err
		}, idem.WithCorrelationID(m.ID), idem.WithPolicy(policyOf(m)), idem.Fingerprint(m.Body))
		if !cs.dead.Load() {
			return fmt.Errorf("demo: the crash on %s did not happen: %v", key, err)
		}
		w.note(func(s *Summary) {
			s.Crashes = append(s.Crashes, fmt.Sprintf("%s took message %s (%s, %s), sent email %s, then died before recording it",
				name, m.ID, key, m.Attributes[attrPolicy], providerID))
		})
		// The message is neither acked nor extended: the broker hands it
		// out again when its visibility timeout ends. The upstream, which
		// never saw a confirmation, enqueues the job again under a new
		// message id sooner than that, while the dead attempt's lease
		// still holds the key.
		if err := w.publish(ctx, j, w.cfg.Lease*2/5); err != nil {
			return err
		}
		w.note(func(s *Summary) { s.AfterCrash += 2; s.CrashReenqueued++ })
	}
	return nil
}

// dyingStore is a store seen from a process that dies: once dead, no write
// reaches the store.
type dyingStore struct {
	store.Store
	dead atomic.Bool
}

// errDied is what the dead process's store calls return: the store is
// closed to it (store.ErrClosed), so its Ledger does not retry them.
var errDied = fmt.Errorf("demo: the process died: %w", store.ErrClosed)

func (d *dyingStore) die() { d.dead.Store(true) }

func (d *dyingStore) Finish(ctx context.Context, r store.FinishRequest) error {
	if d.dead.Load() {
		return errDied
	}
	return d.Store.Finish(ctx, r)
}

func (d *dyingStore) Extend(ctx context.Context, r store.ExtendRequest) (time.Time, error) {
	if d.dead.Load() {
		return time.Time{}, errDied
	}
	return d.Store.Extend(ctx, r)
}

// provider is the simulated mail provider: it accepts every send and gives
// it a new message id, like SES; it does not notice duplicates.
type provider struct {
	mu     sync.Mutex
	n      int
	outbox map[string][]Mail
}

func (p *provider) send(key string, m Mail) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	m.ProviderID = fmt.Sprintf("ses-%04d", p.n)
	p.outbox[key] = append(p.outbox[key], m)
	return m.ProviderID
}

// tally is the slog.Handler the consumers log to. It keeps each delivery's
// line ("queue message <outcome>") and counts the settled messages.
type tally struct {
	mu      sync.Mutex
	lines   []Line
	errs    []string
	settled int
	changed chan struct{} // closed and replaced on every line
	// steps are the WithAttrs and WithGroup calls this handler was derived
	// with, in order; attributes under a group are not the delivery's.
	steps  []step
	shared *tally // the handler this one was derived from
}

// step is one WithAttrs (group == "") or WithGroup call.
type step struct {
	group string
	attrs []slog.Attr
}

// grouped reports whether t's record attributes are under a group.
func (t *tally) grouped() bool {
	return slices.ContainsFunc(t.steps, func(s step) bool { return s.group != "" })
}

func newTally() *tally {
	t := &tally{changed: make(chan struct{})}
	t.shared = t
	return t
}

func (t *tally) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelDebug } // a delivery's line is DEBUG when all went well

func (t *tally) WithAttrs(as []slog.Attr) slog.Handler {
	if len(as) == 0 {
		return t
	}
	return &tally{steps: append(slices.Clip(t.steps), step{attrs: as}), shared: t.shared}
}

func (t *tally) WithGroup(name string) slog.Handler {
	if name == "" {
		return t
	}
	return &tally{steps: append(slices.Clip(t.steps), step{group: name}), shared: t.shared}
}

func (t *tally) Handle(ctx context.Context, r slog.Record) error {
	var (
		ln          Line
		settleError bool
		read        func(a slog.Attr) bool
	)
	read = func(a slog.Attr) bool {
		if a.Value.Kind() == slog.KindGroup && a.Key == "" {
			for _, a := range a.Value.Group() { // inlined
				read(a)
			}
			return true
		}
		switch a.Key {
		case "settle_error":
			settleError = true
		case "outcome":
			ln.Outcome = a.Value.String()
		case "action":
			ln.Action = a.Value.String()
		case "cause":
			ln.Cause = a.Value.String()
		case "key", "key_hash":
			ln.Key = a.Value.String()
		case "message_id":
			ln.MessageID = a.Value.String()
		case "fence":
			ln.Fence = a.Value.Int64()
		case "attempt":
			ln.Attempt = int(a.Value.Int64())
		case "receive_count":
			ln.ReceiveCount = int(a.Value.Int64())
		}
		return true
	}
	for _, st := range t.steps {
		if st.group != "" {
			break
		}
		for _, a := range st.attrs {
			read(a)
		}
	}
	if !t.grouped() {
		r.Attrs(read)
	}
	var buf bytes.Buffer
	th := slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})
	var h slog.Handler = th
	for _, st := range t.steps {
		if st.group != "" {
			h = h.WithGroup(st.group)
		} else {
			h = h.WithAttrs(st.attrs)
		}
	}
	h.Handle(ctx, r)
	ln.Text = string(bytes.TrimSpace(buf.Bytes()))

	s := t.shared
	s.mu.Lock()
	defer s.mu.Unlock()
	if ln.Outcome == "" {
		// Not a delivery's line: an error of the consumer itself.
		if r.Level >= slog.LevelError {
			s.errs = append(s.errs, ln.Text)
		}
		return nil
	}
	s.lines = append(s.lines, ln)
	// A settlement the broker refused (settle_error) leaves the message
	// queued: it comes back and is counted when it settles.
	if (ln.Action == "ack" || ln.Action == "dead-letter") && !settleError {
		s.settled++
	}
	if r.Level >= slog.LevelError {
		s.errs = append(s.errs, ln.Text)
	}
	close(s.changed)
	s.changed = make(chan struct{})
	return nil
}

// errStalled is waitSettled's error when no delivery was handled for its
// stall time.
var errStalled = errors.New("no delivery handled")

// waitSettled waits until as many messages are settled as want says were
// published, or until no delivery was handled for stall.
func (t *tally) waitSettled(ctx context.Context, want func() int, stall time.Duration) error {
	timer := time.NewTimer(stall)
	defer timer.Stop()
	for {
		t.mu.Lock()
		n, ch := t.settled, t.changed
		t.mu.Unlock()
		if n >= want() {
			return nil
		}
		select {
		case <-ch:
			timer.Reset(stall)
		case <-timer.C:
			return fmt.Errorf("%d of %d messages settled: %w for %s", n, want(), errStalled, stall)
		case <-ctx.Done():
			return fmt.Errorf("%d of %d messages settled: %w", n, want(), ctx.Err())
		}
	}
}

// summarize counts the lines into sum.
func (t *tally) summarize(sum *Summary) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sum.Lines = slices.Clone(t.lines)
	if sum.Other == nil {
		sum.Other = map[string]int{}
	}
	sum.Errors = append(sum.Errors, t.errs...)
	for _, ln := range t.lines {
		if ln.ReceiveCount > 1 {
			sum.Redelivered++
		}
		switch ln.Outcome {
		case "executed":
			sum.Executed++
		case "replayed":
			sum.Replayed++
		case "takeover":
			sum.Takeovers++
			sum.TakeoverKeys = append(sum.TakeoverKeys, ln.Key)
		case "busy":
			sum.BusyRetries++
		case "indeterminate":
			sum.Indeterminate++
			sum.Retries++
		case "retried", "handed-back", "held-back":
			sum.Retries++
			sum.Other[ln.Outcome]++
		case "dead-lettered":
			sum.DeadLettered = append(sum.DeadLettered, ln.Key)
			if ln.Cause == "indeterminate" {
				sum.Indeterminate++ // its last receive, refused and dead-lettered
				sum.IndeterminateDeadLettered++
			} else {
				sum.Other["dead-lettered ("+ln.Cause+")"]++
			}
		default:
			sum.Other[ln.Outcome]++
		}
	}
	slices.Sort(sum.TakeoverKeys)
}

// Check verifies what the demo shows: every key sent once, except the key
// that crashed under AtLeastOnce, sent twice (taken over after its lease
// lapsed); the key that crashed under AtMostOnce sent once, refused as
// indeterminate afterwards and dead-lettered for an operator; every
// delivery accounted for; no unexpected error.
func (s *Summary) Check() error {
	var errs []error
	for _, e := range s.Errors {
		errs = append(errs, errors.New(e))
	}
	for _, k := range s.Keys {
		want := 1
		if k == s.CrashedAtLeastOnce {
			want = 2
		}
		if got := s.Sends[k]; got != want {
			errs = append(errs, fmt.Errorf("%s sent %d times, want %d", k, got, want))
		}
	}
	if s.Sent != s.Orders+1 {
		errs = append(errs, fmt.Errorf("%d emails sent for %d orders, want %d", s.Sent, s.Orders, s.Orders+1))
	}
	if !slices.Equal(s.TakeoverKeys, []string{s.CrashedAtLeastOnce}) {
		errs = append(errs, fmt.Errorf("takeovers on %v, want just %s", s.TakeoverKeys, s.CrashedAtLeastOnce))
	}
	if s.Indeterminate < 1 {
		errs = append(errs, fmt.Errorf("no delivery of %s was refused as indeterminate", s.CrashedAtMostOnce))
	}
	for _, k := range s.DeadLettered {
		if k != s.CrashedAtMostOnce {
			errs = append(errs, fmt.Errorf("%s was dead-lettered; only %s should be", k, s.CrashedAtMostOnce))
		}
	}
	if len(s.Crashes) != 2 {
		errs = append(errs, fmt.Errorf("%d crashes happened, want 2", len(s.Crashes)))
	}
	// Every message's deliveries end in one settlement, and every retry
	// makes one more delivery: the consumers' lines are the messages plus
	// the retries (a crashed message's first delivery went to the worker
	// that died).
	if want := s.Published + s.BusyRetries + s.Retries; len(s.Lines) != want {
		errs = append(errs, fmt.Errorf("%d deliveries handled by the consumers, want %d messages + %d busy retries + %d other retries",
			len(s.Lines), s.Published, s.BusyRetries, s.Retries))
	}
	// The counts the demo prints add up.
	if want := s.Orders + s.Reenqueued + s.CrashReenqueued; s.Published != want {
		errs = append(errs, fmt.Errorf("%d messages published, want %d jobs + %d enqueued again + %d enqueued again after a crash",
			s.Published, s.Orders, s.Reenqueued, s.CrashReenqueued))
	}
	if want := len(s.Crashes) + s.BusyRetries + s.Retries; s.Redelivered != want {
		errs = append(errs, fmt.Errorf("%d deliveries of a message received before, want %d crashed + %d busy retries + %d other retries",
			s.Redelivered, len(s.Crashes), s.BusyRetries, s.Retries))
	}
	if want := s.Published + s.Redelivered; s.Deliveries != want {
		errs = append(errs, fmt.Errorf("%d deliveries, want %d messages + %d delivered again", s.Deliveries, s.Published, s.Redelivered))
	}
	other := 0
	for _, n := range s.Other {
		other += n
	}
	if want := len(s.Crashes) + s.Executed + s.Takeovers + s.Replayed + s.BusyRetries + s.Indeterminate + other; s.Deliveries != want {
		errs = append(errs, fmt.Errorf("%d deliveries, want %d to the crashed workers + %d sent + %d sent again + %d skipped + %d busy + %d refused + %d other",
			s.Deliveries, len(s.Crashes), s.Executed, s.Takeovers, s.Replayed, s.BusyRetries, s.Indeterminate, other))
	}
	if want := len(s.Crashes) + s.Executed + s.Takeovers; s.Sent != want {
		errs = append(errs, fmt.Errorf("%d emails sent, want %d by the crashed workers + %d sent + %d sent again", s.Sent, len(s.Crashes), s.Executed, s.Takeovers))
	}
	return errors.Join(errs...)
}
