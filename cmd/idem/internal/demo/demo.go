// Package demo runs the receipts worker of "Preventing Duplicate Sends"
// (seed 000) against an idem store: a queue of receipt jobs with
// redeliveries, two concurrent consumers calling Ledger.Do with a "send the
// email" function that records sends in an in-memory outbox (a simulated
// mail provider), and a crash injected between "sent" and "recorded" on one
// key under AtLeastOnce and one under AtMostOnce.
//
// A crashed attempt is made the way a dying worker makes it: the attempt
// claims the key through a Ledger, the email is sent, and then the process
// is gone: its store refuses every further write (no completion, no
// heartbeat, no release). The record stays in_progress with a lease that
// lapses, exactly what a killed process leaves.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
)

// Config is one run of the demo.
type Config struct {
	Store idem.Store
	// Orders is how many receipt jobs (at least 7; default 20).
	Orders int
	// Seed makes the queue's duplicates (default 1): the same seed gives
	// the same messages.
	Seed uint64
	// Lease is the ledger's lease (default 300 ms), short so that the
	// crashed attempts lapse quickly.
	Lease time.Duration
	// SendTime is the mail provider's latency (default 20 ms).
	SendTime time.Duration
	// Visibility is how long the queue waits for an ack before it
	// redelivers a message (default 5/3 of Lease: more than the lease, as
	// it must be).
	Visibility time.Duration
	// Consumers is how many concurrent consumers (default 2).
	Consumers int
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
	Consumer   string
	Takeover   bool
}

// Summary is what happened in a run.
type Summary struct {
	Orders int
	// Keys are the operation keys, in order.
	Keys []string
	// Messages is how many messages the queue held at the start; SameID of
	// them are redeliveries of an earlier message (same message id), NewID
	// jobs re-enqueued upstream under a new message id.
	Messages, SameID, NewID int
	// Deliveries is how many deliveries the consumers handled: the
	// messages, the redeliveries after busy keys and after the crashes, and
	// the re-enqueues of the crashed jobs.
	Deliveries int
	// BusyRetries: deliveries that found another attempt holding the key
	// (ErrInProgress) and were put back with its Retry-After.
	BusyRetries int
	// AfterCrash: deliveries caused by the crashes (a redelivery of the
	// unacked message, and the upstream's re-enqueue of the job).
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
	// lapsed (ErrIndeterminate); they are acked and left for an operator.
	Indeterminate int
	// Crashes describes each injected crash, in order.
	Crashes []string
	// CrashedAtLeastOnce and CrashedAtMostOnce are the crashed keys.
	CrashedAtLeastOnce, CrashedAtMostOnce string
	// Errors are unexpected errors (none in a correct run).
	Errors []string
	Took   time.Duration
}

type order struct{ ID, User int }

type message struct {
	id     string
	order  order
	policy idem.Policy
	crash  bool // the consumer that takes this delivery dies after sending
	body   []byte
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
	base, err := freeOrderBase(ctx, cfg.Store, users)
	if err != nil {
		return nil, err
	}

	sum := &Summary{Orders: cfg.Orders, Sends: map[string]int{}, Outbox: map[string][]Mail{}}
	var msgs []message
	for i := range cfg.Orders {
		o := order{ID: base + i, User: users[i]}
		m := message{id: fmt.Sprintf("m-%d", o.ID), order: o, policy: idem.AtLeastOnce}
		m.body, _ = json.Marshal(map[string]any{"orderId": o.ID, "userId": o.User, "to": fmt.Sprintf("user%d@example.com", o.User)})
		key := idem.Key("receipt", o.ID, o.User).String()
		sum.Keys = append(sum.Keys, key)
		switch i {
		case crashAtLeastOnce:
			m.crash = true
			sum.CrashedAtLeastOnce = key
		case crashAtMostOnce:
			m.crash, m.policy = true, idem.AtMostOnce
			sum.CrashedAtMostOnce = key
		}
		msgs = append(msgs, m)
	}
	// Duplicates of the other jobs: 0 to 2 more copies each, a few places
	// behind the original (close enough that two consumers sometimes hold
	// both at once); half are the broker redelivering the same message,
	// half the upstream enqueueing the job again under a new message id.
	type dup struct {
		m   message
		pos int
	}
	var dups []dup
	for i := range cfg.Orders {
		if msgs[i].crash {
			continue // their duplicates come from the crash itself
		}
		for k := range r.IntN(3) {
			d := msgs[i]
			if r.IntN(2) == 0 {
				sum.SameID++
			} else {
				d.id = fmt.Sprintf("%s-r%d", d.id, k+1)
				sum.NewID++
			}
			dups = append(dups, dup{d, i + 1 + r.IntN(6)})
		}
	}
	queueOrder := slices.Clone(msgs)
	for k := len(dups) - 1; k >= 0; k-- {
		d := dups[k]
		queueOrder = slices.Insert(queueOrder, min(d.pos, len(queueOrder)), d.m)
	}
	sum.Messages = len(queueOrder)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	q := newQueue(len(queueOrder), runCtx.Done())
	for _, m := range queueOrder {
		q.put(m)
	}
	w := &world{cfg: cfg, q: q, sum: sum, provider: &provider{outbox: sum.Outbox}}
	var wg sync.WaitGroup
	for c := range cfg.Consumers {
		name := fmt.Sprintf("consumer-%d", c+1)
		l := idem.New(cfg.Store, idem.WithOwner(name), idem.WithLease(cfg.Lease), idem.WithLogger(discard))
		wg.Go(func() { w.consume(runCtx, name, l) })
	}
	select {
	case <-q.drained:
	case <-ctx.Done():
	}
	cancel()
	wg.Wait()
	sum.Took = time.Since(start)
	sum.Deliveries = int(w.deliveries.Load())
	sum.BusyRetries = int(w.busy.Load())
	sum.Replayed = int(w.replayed.Load())
	sum.Indeterminate = int(w.indeterminate.Load())
	for k, mails := range sum.Outbox {
		sum.Sends[k] = len(mails)
		sum.Sent += len(mails)
	}
	slices.Sort(sum.TakeoverKeys)
	if err := ctx.Err(); err != nil {
		return sum, err
	}
	return sum, nil
}

var discard = slog.New(slog.DiscardHandler)

// freeOrderBase picks the first order id so that none of the run's keys
// exists in the store yet (a store given with --store may hold an earlier
// run's records).
func freeOrderBase(ctx context.Context, s idem.Store, users []int) (int, error) {
	for base := 1001; base < 1001+100*1000; base += 100 {
		free := true
		for i, u := range users {
			_, err := s.Get(ctx, idem.Key("receipt", base+i, u).String())
			if err == nil {
				free = false
				break
			}
			if !errors.Is(err, idem.ErrNotFound) {
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
	q        *queue
	provider *provider

	deliveries, busy, replayed, indeterminate atomic.Int64

	mu  sync.Mutex
	sum *Summary
}

func (w *world) note(f func(s *Summary)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f(w.sum)
}

func (w *world) consume(ctx context.Context, name string, l *idem.Ledger) {
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-w.q.ch:
			w.deliveries.Add(1)
			w.handle(ctx, name, l, m)
		}
	}
}

// handle is the worker of seed 000, with idem: the key names the outcome
// ("order N's receipt to user U"), never the message id.
func (w *world) handle(ctx context.Context, name string, l *idem.Ledger, m message) {
	key := idem.Key("receipt", m.order.ID, m.order.User)
	opts := []idem.CallOption{idem.WithCorrelationID(m.id), idem.WithPolicy(m.policy), idem.Fingerprint(m.body)}
	if m.crash {
		w.crash(ctx, name, m, key, opts)
		return
	}
	res, err := l.Do(ctx, key, w.send(key.String(), m.id, name), opts...)
	var busy *idem.InProgressError
	switch {
	case err == nil:
		if res.Replayed {
			w.replayed.Add(1)
		}
		if res.Takeover {
			w.note(func(s *Summary) { s.Takeovers++; s.TakeoverKeys = append(s.TakeoverKeys, key.String()) })
		}
		w.q.ack()
	case errors.As(err, &busy):
		// Another consumer holds the key: nack with its Retry-After.
		w.busy.Add(1)
		w.q.nack(m, min(busy.RetryAfter, time.Second))
	case errors.Is(err, idem.ErrIndeterminate):
		// Not run again: ack, and leave it for an operator (idem ls --stuck).
		w.indeterminate.Add(1)
		w.q.ack()
	case ctx.Err() != nil:
		w.q.ack()
	default:
		w.note(func(s *Summary) { s.Errors = append(s.Errors, fmt.Sprintf("%s: %s: %v", name, key, err)) })
		w.q.ack()
	}
}

// send is the operation: send the receipt (through the simulated provider)
// and return the provider's message id as the result.
func (w *world) send(key, msgID, consumer string) func(context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		t := time.NewTimer(w.cfg.SendTime)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, idem.NotDone(ctx.Err())
		}
		return []byte(w.provider.send(key, Mail{MessageID: msgID, Consumer: consumer})), nil
	}
}

// crash runs m's attempt in a process that dies right after the send: the
// claim and the send happen, then every write to the store is lost.
func (w *world) crash(ctx context.Context, name string, m message, key idem.OperationKey, opts []idem.CallOption) {
	cs := &dyingStore{Store: w.cfg.Store}
	l := idem.New(cs, idem.WithOwner(name), idem.WithLease(w.cfg.Lease), idem.WithLogger(discard))
	var providerID string
	res, err := l.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
		v, err := w.send(key.String(), m.id, name)(ctx)
		providerID = string(v)
		cs.die()
		return v, err
	}, opts...)
	if !cs.dead.Load() {
		w.note(func(s *Summary) {
			s.Errors = append(s.Errors, fmt.Sprintf("%s: the crash on %s did not happen: %v (replayed=%v)", name, key, err, res.Replayed))
		})
		w.q.ack()
		return
	}
	w.note(func(s *Summary) {
		s.Crashes = append(s.Crashes, fmt.Sprintf("%s sent %s (%s), then its process died before recording it (%s)", name, key, providerID, m.policy))
	})
	// The broker redelivers the unacked message when its visibility
	// timeout passes; the upstream, which never saw a confirmation, enqueues
	// the job again under a new message id sooner than that.
	again := m
	again.crash = false
	reenq := again
	reenq.id += "-r1"
	w.note(func(s *Summary) { s.AfterCrash += 2 })
	w.q.later(reenq, w.cfg.Lease*2/5)
	w.q.nack(again, w.cfg.Visibility)
}

// dyingStore is a store seen from a process that dies: once dead, no write
// reaches the store (reads too fail: the process is gone).
type dyingStore struct {
	idem.Store
	dead atomic.Bool
}

var errDied = errors.New("demo: the process died")

func (d *dyingStore) die() { d.dead.Store(true) }

func (d *dyingStore) Complete(ctx context.Context, key string, fence int64, result []byte, retention time.Duration) error {
	if d.dead.Load() {
		return errDied
	}
	return d.Store.Complete(ctx, key, fence, result, retention)
}

func (d *dyingStore) Fail(ctx context.Context, key string, fence int64, reason string, retention time.Duration) error {
	if d.dead.Load() {
		return errDied
	}
	return d.Store.Fail(ctx, key, fence, reason, retention)
}

func (d *dyingStore) Release(ctx context.Context, key string, fence int64, reason string) error {
	if d.dead.Load() {
		return errDied
	}
	return d.Store.Release(ctx, key, fence, reason)
}

func (d *dyingStore) Abandon(ctx context.Context, key string, fence int64, reason string) error {
	if d.dead.Load() {
		return errDied
	}
	return d.Store.Abandon(ctx, key, fence, reason)
}

func (d *dyingStore) Extend(ctx context.Context, key string, fence int64, lease time.Duration) (time.Time, error) {
	if d.dead.Load() {
		return time.Time{}, errDied
	}
	return d.Store.Extend(ctx, key, fence, lease)
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

// queue is an at-least-once queue: a message stays outstanding until it is
// acked; a nacked one comes back after a delay.
type queue struct {
	ch      chan message
	pending atomic.Int64
	drained chan struct{}
	once    sync.Once
	stop    <-chan struct{}
}

func newQueue(n int, stop <-chan struct{}) *queue {
	return &queue{ch: make(chan message, n), drained: make(chan struct{}), stop: stop}
}

func (q *queue) put(m message) {
	q.pending.Add(1)
	q.ch <- m
}

// later enqueues m after d.
func (q *queue) later(m message, d time.Duration) {
	q.pending.Add(1)
	time.AfterFunc(d, func() {
		select {
		case q.ch <- m:
		case <-q.stop:
		}
	})
}

// ack settles one delivery.
func (q *queue) ack() {
	if q.pending.Add(-1) == 0 {
		q.once.Do(func() { close(q.drained) })
	}
}

// nack settles one delivery and redelivers its message after d.
func (q *queue) nack(m message, d time.Duration) {
	q.later(m, d)
	q.ack()
}

// Check verifies what the demo shows: every key sent once, except the key
// that crashed under AtLeastOnce, sent twice (taken over after its lease
// lapsed); the key that crashed under AtMostOnce sent once and refused as
// indeterminate afterwards; no unexpected error.
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
	if len(s.Crashes) != 2 {
		errs = append(errs, fmt.Errorf("%d crashes happened, want 2", len(s.Crashes)))
	}
	if want := s.Messages + s.AfterCrash + s.BusyRetries; s.Deliveries != want {
		errs = append(errs, fmt.Errorf("%d deliveries handled, want %d messages + %d after the crashes + %d busy retries", s.Deliveries, s.Messages, s.AfterCrash, s.BusyRetries))
	}
	return errors.Join(errs...)
}
