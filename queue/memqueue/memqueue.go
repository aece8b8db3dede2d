// Package memqueue is an in-process queue with the semantics of a real
// broker: visibility timeouts, receive counts, delays, FIFO groups, a
// publish-side dedup window and a dead-letter list. It keeps nothing across
// restarts: use it in tests and examples, and queue/sqlqueue for a durable
// queue on the same machine.
package memqueue

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/idemkit/idem/queue"
)

// Defaults of a [Queue]. A queue.Consumer without queue.WithHandlerTimeout
// gives its handler a sixth of the visibility (5 s), so nothing warns.
const (
	DefaultVisibility  = 30 * time.Second
	DefaultDedupWindow = 5 * time.Minute
)

// ErrReceiptExpired is returned when a delivery is settled or extended
// after its message was handed to another receiver (its visibility lapsed)
// or settled through another delivery. A delivery settled already (acked,
// retried or dead-lettered) returns an error wrapping [queue.ErrSettled]
// instead.
var ErrReceiptExpired = errors.New("memqueue: delivery no longer holds its message")

// DeadLetter is a dead-lettered message and the reason it was given.
type DeadLetter struct {
	Message queue.Message
	Reason  string
	At      time.Time
}

// Queue is an in-process queue. It implements [queue.Source] and
// [queue.Publisher]; it is safe for concurrent use.
type Queue struct {
	visibility  time.Duration
	dedupWindow time.Duration

	mu     sync.Mutex
	nextID int64
	msgs   []*entry // in publish order, settled ones included until compacted
	head   int      // msgs[:head] are all settled
	gone   int      // settled entries in msgs[head:]
	dedup  map[string]dedupEntry
	dead   []DeadLetter
	wake   chan struct{} // closed when a message may have become receivable
}

type entry struct {
	m         queue.Message
	seq       int64
	visibleAt time.Time
	receipt   int64 // grows with every receive; a delivery holds the one it got
	gone      bool  // acked or dead-lettered
}

type dedupEntry struct {
	id    string
	until time.Time
}

// Option configures a [Queue].
type Option func(*Queue)

// WithVisibility sets how long a received message stays invisible unless
// extended (default [DefaultVisibility]).
func WithVisibility(d time.Duration) Option {
	return func(q *Queue) {
		if d > 0 {
			q.visibility = d
		}
	}
}

// WithDedupWindow sets how long a publish's DedupID suppresses another
// publish with the same id (default [DefaultDedupWindow]).
func WithDedupWindow(d time.Duration) Option {
	return func(q *Queue) {
		if d > 0 {
			q.dedupWindow = d
		}
	}
}

// New returns an empty queue.
func New(opts ...Option) *Queue {
	q := &Queue{visibility: DefaultVisibility, dedupWindow: DefaultDedupWindow,
		dedup: make(map[string]dedupEntry), wake: make(chan struct{})}
	for _, o := range opts {
		o(q)
	}
	return q
}

// Visibility implements [queue.Source].
func (q *Queue) Visibility() time.Duration { return q.visibility }

// Publish implements [queue.Publisher]. A DedupID seen inside the dedup
// window returns the first message's id with Duplicate set.
func (q *Queue) Publish(ctx context.Context, o queue.Outgoing) (queue.Published, error) {
	if err := ctx.Err(); err != nil {
		return queue.Published{}, err
	}
	now := time.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	if o.DedupID != "" {
		if d, ok := q.dedup[o.DedupID]; ok && now.Before(d.until) {
			return queue.Published{ID: d.id, Duplicate: true}, nil
		}
	}
	q.nextID++
	id := strconv.FormatInt(q.nextID, 10)
	e := &entry{seq: q.nextID, visibleAt: now.Add(o.Delay), m: queue.Message{
		ID: id, Body: append([]byte(nil), o.Body...), Attributes: maps.Clone(o.Attributes),
		GroupID: o.GroupID, DedupID: o.DedupID, Published: now,
	}}
	q.msgs = append(q.msgs, e)
	if o.DedupID != "" {
		q.dedup[o.DedupID] = dedupEntry{id: id, until: now.Add(q.dedupWindow)}
	}
	q.signal()
	return queue.Published{ID: id}, nil
}

// signal wakes receivers; q.mu must be held.
func (q *Queue) signal() {
	close(q.wake)
	q.wake = make(chan struct{})
}

// Receive implements [queue.Source]. Of a FIFO group only the oldest
// unsettled message is handed out, and only when it is visible.
func (q *Queue) Receive(ctx context.Context, max int) ([]queue.Delivery, error) {
	if max < 1 {
		max = 1
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		now := time.Now()
		q.mu.Lock()
		var out []queue.Delivery
		var next time.Time
		blocked := map[string]bool{}
		for _, e := range q.msgs[q.head:] {
			if len(out) == max {
				break
			}
			if e.gone {
				continue
			}
			g := e.m.GroupID
			if g != "" && blocked[g] {
				continue
			}
			if g != "" {
				blocked[g] = true // later messages of the group wait for this one
			}
			if e.visibleAt.After(now) {
				if next.IsZero() || e.visibleAt.Before(next) {
					next = e.visibleAt
				}
				continue
			}
			e.receipt++
			e.m.ReceiveCount++
			if e.m.FirstReceived.IsZero() {
				e.m.FirstReceived = now
			}
			e.visibleAt = now.Add(q.visibility)
			m := e.m
			m.Attributes = maps.Clone(e.m.Attributes)
			out = append(out, &delivery{q: q, e: e, receipt: e.receipt, m: m})
		}
		wake := q.wake
		q.mu.Unlock()
		if len(out) > 0 {
			return out, nil
		}
		var (
			t     *time.Timer
			timer <-chan time.Time
		)
		if !next.IsZero() {
			t = time.NewTimer(time.Until(next))
			timer = t.C
		}
		select {
		case <-ctx.Done():
		case <-wake:
		case <-timer:
		}
		if t != nil {
			t.Stop()
		}
	}
}

// DeadLetters returns the messages dead-lettered so far, oldest first.
func (q *Queue) DeadLetters() []DeadLetter {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]DeadLetter(nil), q.dead...)
}

// Len returns how many messages the queue holds: ready to receive, and
// received but not settled (in flight or delayed).
func (q *Queue) Len() (ready, held int) {
	now := time.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, e := range q.msgs[q.head:] {
		if e.gone {
			continue
		}
		if e.visibleAt.After(now) {
			held++
		} else {
			ready++
		}
	}
	return ready, held
}

type delivery struct {
	q       *Queue
	e       *entry
	receipt int64
	m       queue.Message
	settled bool // Ack, Retry or DeadLetter succeeded; guarded by q.mu
}

func (d *delivery) Message() queue.Message { return d.m }

func (d *delivery) Ack(ctx context.Context) error {
	return d.with("ack", true, d.q.remove)
}

// Retry makes the message receivable again delay from now. It ends the
// delivery's hold, as Ack does: a later Ack, Retry, DeadLetter or Extend
// of this delivery is refused.
func (d *delivery) Retry(ctx context.Context, delay time.Duration) error {
	return d.with("retry", true, func(e *entry) { e.visibleAt = time.Now().Add(max(delay, 0)) })
}

func (d *delivery) Extend(ctx context.Context, by time.Duration) error {
	return d.with("extend", false, func(e *entry) { e.visibleAt = time.Now().Add(by) })
}

func (d *delivery) DeadLetter(ctx context.Context, reason string) error {
	return d.with("dead-letter", true, func(e *entry) {
		d.q.dead = append(d.q.dead, DeadLetter{Message: e.m, Reason: reason, At: time.Now()})
		d.q.remove(e)
	})
}

// remove marks e settled and drops settled entries from the front of msgs
// (compacting once they are half of it), so a receive scans only what may
// still be handed out; q.mu must be held.
func (q *Queue) remove(e *entry) {
	e.gone = true
	q.gone++
	for q.head < len(q.msgs) && q.msgs[q.head].gone {
		q.msgs[q.head] = nil
		q.head++
		q.gone--
	}
	if q.head > 64 && q.head > len(q.msgs)/2 {
		n := copy(q.msgs, q.msgs[q.head:])
		clear(q.msgs[n:])
		q.msgs, q.head = q.msgs[:n], 0
	}
}

// with applies f (op, in errors) to d's message if d still holds it: d is
// not settled, no later receive took the message and no other delivery
// settled it. settles says that f settles d, which then holds nothing.
func (d *delivery) with(op string, settles bool, f func(e *entry)) error {
	d.q.mu.Lock()
	defer d.q.mu.Unlock()
	if d.settled {
		return fmt.Errorf("memqueue: %s of message %s: %w", op, d.m.ID, queue.ErrSettled)
	}
	if d.e.gone || d.e.receipt != d.receipt {
		return fmt.Errorf("memqueue: %s of message %s: %w", op, d.m.ID, ErrReceiptExpired)
	}
	f(d.e)
	d.settled = settles
	d.q.signal()
	return nil
}
