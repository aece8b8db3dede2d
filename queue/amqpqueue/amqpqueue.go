package amqpqueue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/internal/reason"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Header names the adapter reads and writes.
const (
	// HeaderDeadLetterReason holds the reason given to DeadLetter.
	HeaderDeadLetterReason = "x-idem-dead-letter-reason"
	// HeaderDeadLetterQueue names the queue the message was dead-lettered
	// from.
	HeaderDeadLetterQueue = "x-idem-dead-letter-queue"
	// HeaderReceives counts the deliveries of earlier copies of a message
	// that Retry re-published with a delay.
	HeaderReceives = "x-idem-receives"
	// HeaderDedupID carries Outgoing.DedupID.
	HeaderDedupID = "x-idem-dedup-id"
	// HeaderPublishToken holds a random token, new for every publish
	// (Publish, Retry's delayed copy, DeadLetter's copy), by which a
	// basic.return is matched to the publish it answers. Copies keep the
	// original's message-id, and a producer may set one message-id on many
	// messages, so the message-id cannot tell two publishes apart.
	HeaderPublishToken = "x-idem-publish-token"
)

// ErrConfig is returned for a missing or unusable setting.
var ErrConfig = errors.New("amqpqueue: invalid configuration")

// ErrUnroutable is returned by a publish the broker could not route to any
// queue (returned with the mandatory flag): the message was not stored.
var ErrUnroutable = errors.New("amqpqueue: message unroutable")

// ErrNacked is returned by a publish the broker refused (basic.nack).
var ErrNacked = errors.New("amqpqueue: publish not confirmed by the broker")

// ErrDelayTooLong is returned for a delay over [MaxDelay].
var ErrDelayTooLong = queue.Refusal("amqpqueue: delay too long for a RabbitMQ message TTL")

const defaultTimeout = 10 * time.Second

// Config names a queue and its dead-letter destination.
type Config struct {
	// Queue is the queue to consume from and publish to. Required.
	Queue string
	// Quorum makes [Declare] declare quorum queues (exact receive counts
	// through x-delivery-count, replicated) instead of classic durable
	// ones. It must match how the queue was declared.
	Quorum bool
	// DeadLetterExchange and DeadLetterRoutingKey are where DeadLetter
	// publishes. The defaults are the default exchange ("") and
	// Queue+".dead-letter", a queue that [Declare] declares.
	DeadLetterExchange   string
	DeadLetterRoutingKey string
	// Prefetch is the consumer's basic.qos prefetch count (default 32): how
	// many unacked messages the broker hands the Source ahead of Receive.
	Prefetch int
}

func (c *Config) fill() error {
	if c.Queue == "" {
		return fmt.Errorf("%w: Queue is required", ErrConfig)
	}
	if c.DeadLetterRoutingKey == "" {
		if c.DeadLetterExchange != "" {
			return fmt.Errorf("%w: DeadLetterRoutingKey is required with DeadLetterExchange", ErrConfig)
		}
		c.DeadLetterRoutingKey = c.Queue + ".dead-letter"
	}
	if c.Prefetch <= 0 {
		c.Prefetch = 32
	}
	return nil
}

func (c *Config) queueArgs() amqp.Table {
	if c.Quorum {
		return amqp.Table{"x-queue-type": "quorum"}
	}
	return nil
}

// Declare declares cfg.Queue (durable; quorum when cfg.Quorum) and, when
// the dead-letter destination is the default exchange, the dead-letter
// queue. Declaring an existing queue with the same arguments is a no-op.
func Declare(ctx context.Context, conn *amqp.Connection, cfg Config) error {
	if err := cfg.fill(); err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("amqpqueue: open channel: %w", err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(cfg.Queue, true, false, false, false, cfg.queueArgs()); err != nil {
		return fmt.Errorf("amqpqueue: declare %s: %w", cfg.Queue, err)
	}
	if cfg.DeadLetterExchange == "" {
		if _, err := ch.QueueDeclare(cfg.DeadLetterRoutingKey, true, false, false, false, cfg.queueArgs()); err != nil {
			return fmt.Errorf("amqpqueue: declare %s: %w", cfg.DeadLetterRoutingKey, err)
		}
	}
	return ctx.Err()
}

// MaxDelay is the longest delay Retry and Outgoing.Delay take: RabbitMQ's
// largest message TTL, 2³²−1 ms (about 49.7 days).
const MaxDelay = (1<<32 - 1) * time.Millisecond

// delayQueue returns the delay queue for d and its TTL in milliseconds: d
// rounded up to a power of two milliseconds, or MaxDelay when that is
// above it. A d over MaxDelay is ErrDelayTooLong.
func delayQueue(queueName string, d time.Duration) (string, int64, error) {
	if d > MaxDelay {
		return "", 0, fmt.Errorf("%w: %v, at most %v", ErrDelayTooLong, d, MaxDelay)
	}
	ms := uint64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	if ms < 1 {
		ms = 1
	}
	if ms&(ms-1) != 0 {
		ms = min(1<<bits.Len64(ms), uint64(MaxDelay/time.Millisecond))
	}
	return queueName + ".delay." + strconv.FormatUint(ms, 10) + "ms", int64(ms), nil
}

// publisher publishes with confirms and the mandatory flag on one channel,
// opened (again) on demand. Shared by Publisher and Source.
type publisher struct {
	link *link
	cfg  Config

	guard   serial // guards ch, chConn, returns and opening them
	ch      *amqp.Channel
	chConn  *amqp.Connection // the connection ch was opened on
	returns *returnTracker
	delays  sync.Map // delay queue name -> struct{}: declared
}

// DialFunc opens a new connection to the broker, for [NewSourceDial] and
// [NewPublisherDial]. It is called with the context of the Receive or
// Publish that found the connection closed and should give up when that
// context ends; [DialURL] does.
type DialFunc func(ctx context.Context) (*amqp.Connection, error)

// DialURL returns a DialFunc that dials url as [amqp.Dial] does (10s
// heartbeats, PLAIN auth from the URL, TLS for amqps://) but gives up, TCP
// connect and AMQP handshake included, when the dial's context ends.
func DialURL(url string) DialFunc {
	return func(ctx context.Context) (*amqp.Connection, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var nc net.Conn
		var mu sync.Mutex
		dialer := func(network, addr string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// The library clears the deadline once the handshake is done.
			deadline, ok := ctx.Deadline()
			if !ok {
				deadline = time.Now().Add(30 * time.Second) // amqp.Dial's handshake bound
			}
			if err := c.SetDeadline(deadline); err != nil {
				c.Close()
				return nil, err
			}
			mu.Lock()
			nc = c
			mu.Unlock()
			return c, nil
		}
		// A cancelled ctx without a deadline ends the handshake too.
		stop := context.AfterFunc(ctx, func() {
			mu.Lock()
			defer mu.Unlock()
			if nc != nil {
				_ = nc.SetDeadline(time.Now())
			}
		})
		conn, err := amqp.DialConfig(url, amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US", Dial: dialer})
		if !stop() && err == nil {
			// ctx ended while the handshake finished: the deadline may have
			// been set after the library cleared it.
			_ = conn.Close()
			return nil, ctx.Err()
		}
		return conn, err
	}
}

// link is the connection a Source or a Publisher works on: either the
// caller's, fixed (dial is nil), or one the link dialed itself and dials
// again once it is closed.
type link struct {
	fixed *amqp.Connection
	dial  DialFunc

	cur    atomic.Pointer[amqp.Connection] // the dialed connection
	guard  serial                          // one dial at a time; guards closed
	closed bool
}

func fixedLink(conn *amqp.Connection) (*link, error) {
	if err := checkConn(conn); err != nil {
		return nil, err
	}
	return &link{fixed: conn, guard: newSerial()}, nil
}

// checkConn refuses a connection with amqp091-go's recovery enabled (see
// the package documentation).
func checkConn(conn *amqp.Connection) error {
	if conn == nil {
		return fmt.Errorf("%w: no connection", ErrConfig)
	}
	if conn.IsRecoveryEnabled() {
		return fmt.Errorf("%w: the connection has amqp091 recovery enabled; settling a delivery received before a recovery could ack another message (use a DialFunc)", ErrConfig)
	}
	return nil
}

func dialLink(dial DialFunc) *link { return &link{dial: dial, guard: newSerial()} }

// get returns the connection to open channels on. A dialing link whose
// connection is closed dials a new one, once per call, bounded by ctx (10s
// without a deadline). A failed Channel call reports amqp.ErrClosed only
// once the connection is marked closed, so the next get dials.
func (l *link) get(ctx context.Context) (*amqp.Connection, error) {
	if l.dial == nil {
		return l.fixed, nil
	}
	if c := l.cur.Load(); c != nil && !c.IsClosed() {
		return c, nil
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	var conn *amqp.Connection
	err := l.guard.do(ctx, func() error {
		if l.closed {
			return fmt.Errorf("amqpqueue: closed: %w", amqp.ErrClosed)
		}
		if c := l.cur.Load(); c != nil && !c.IsClosed() {
			conn = c
			return nil
		}
		c, err := l.dial(ctx)
		if err != nil {
			return fmt.Errorf("amqpqueue: dial: %w", err)
		}
		if err := checkConn(c); err != nil {
			if c != nil {
				_ = c.Close()
			}
			return err
		}
		l.cur.Store(c) // the one it replaces is closed: shut down, nothing to release
		conn = c
		return nil
	})
	if err != nil {
		return nil, err // conn may still be written if ctx ended first
	}
	return conn, nil
}

// close closes the connection the link dialed and stops it dialing again.
// It never closes the caller's connection.
func (l *link) close(ctx context.Context) error {
	if l.dial == nil {
		return nil
	}
	return l.guard.do(ctx, func() error {
		l.closed = true
		c := l.cur.Swap(nil)
		if c == nil || c.IsClosed() {
			return nil
		}
		if err := c.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
			return fmt.Errorf("amqpqueue: close connection: %w", err)
		}
		return nil
	})
}

// serial runs blocking calls that ignore contexts (amqp091's channel open
// and declare) one at a time, and lets each caller stop waiting when its
// context ends; the call then finishes in the background before the next
// starts.
type serial struct{ sem chan struct{} }

func newSerial() serial { return serial{sem: make(chan struct{}, 1)} }

func (s serial) do(ctx context.Context, fn func() error) error {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	done := make(chan error, 1)
	go func() {
		defer func() { <-s.sem }()
		done <- fn()
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *publisher) channel(ctx context.Context) (*amqp.Channel, *returnTracker, error) {
	conn, err := p.link.get(ctx)
	if err != nil {
		return nil, nil, err
	}
	var ch *amqp.Channel
	var rt *returnTracker
	err = p.guard.do(ctx, func() error {
		// A channel of an earlier connection is dead even if its close is
		// not through yet.
		if p.ch != nil && !p.ch.IsClosed() && p.chConn == conn {
			ch, rt = p.ch, p.returns
			return nil
		}
		c, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("amqpqueue: open channel: %w", err)
		}
		if err := c.Confirm(false); err != nil {
			c.Close()
			return fmt.Errorf("amqpqueue: confirm mode: %w", err)
		}
		p.ch, p.chConn, p.returns = c, conn, newReturnTracker(c)
		p.delays.Clear()
		ch, rt = p.ch, p.returns
		return nil
	})
	if err != nil {
		return nil, nil, err // ch and rt may still be written if ctx ended first
	}
	return ch, rt, nil
}

func (p *publisher) close() {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTimeout)
	defer cancel()
	_ = p.guard.do(ctx, func() error {
		if p.ch != nil {
			_ = p.ch.Close()
		}
		return nil
	})
}

// publish sends msg and waits for the broker's confirm. It sends msg with
// a new token in [HeaderPublishToken] (on a copy of msg.Headers), by which
// the basic.return of this publish, if any, is told from that of any other.
func (p *publisher) publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	ch, rt, err := p.channel(ctx)
	if err != nil {
		return err
	}
	token := newID()
	h := make(amqp.Table, len(msg.Headers)+1)
	maps.Copy(h, msg.Headers)
	h[HeaderPublishToken] = token
	msg.Headers = h
	rt.expect(token)
	defer rt.forget(token) // a publish that stops waiting leaves nothing behind
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, msg)
	if err != nil {
		return fmt.Errorf("amqpqueue: publish to %q/%q: %w", exchange, key, err)
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("amqpqueue: publish to %q/%q: no confirm (the message may or may not be stored): %w", exchange, key, err)
	}
	if ret, returned := rt.take(token); returned {
		return fmt.Errorf("%w: exchange %q, routing key %q: %d %s", ErrUnroutable, exchange, key, ret.ReplyCode, ret.ReplyText)
	}
	if !acked {
		if ch.IsClosed() {
			return fmt.Errorf("amqpqueue: publish to %q/%q: channel closed before the confirm (the message may or may not be stored): %w", exchange, key, amqp.ErrClosed)
		}
		return fmt.Errorf("%w: exchange %q, routing key %q", ErrNacked, exchange, key)
	}
	return nil
}

// publishDelayed publishes msg to the delay queue for d, declaring it on
// first use.
func (p *publisher) publishDelayed(ctx context.Context, d time.Duration, msg amqp.Publishing) error {
	name, ttl, err := delayQueue(p.cfg.Queue, d)
	if err != nil {
		return err
	}
	if _, ok := p.delays.Load(name); !ok {
		conn, err := p.link.get(ctx)
		if err != nil {
			return err
		}
		args := amqp.Table{
			"x-message-ttl":             ttl,
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": p.cfg.Queue,
		}
		if p.cfg.Quorum {
			args["x-queue-type"] = "quorum"
			args["x-dead-letter-strategy"] = "at-least-once"
			args["x-overflow"] = "reject-publish"
		}
		// On a channel of its own, never the publishing one: amqp091 sends
		// a declare without the lock its publishes hold, so a declare there
		// can land between the frames of a concurrent publish, and the
		// broker closes the whole connection (unexpected_frame). A refused
		// declare then also closes only this channel.
		err = p.guard.do(ctx, func() error {
			ch, err := conn.Channel()
			if err != nil {
				return fmt.Errorf("amqpqueue: open channel: %w", err)
			}
			defer ch.Close()
			if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
				return fmt.Errorf("amqpqueue: declare delay queue %s: %w", name, err)
			}
			p.delays.Store(name, struct{}{})
			return nil
		})
		if err != nil {
			return err
		}
	}
	return p.publish(ctx, "", name, msg)
}

// returnTracker matches basic.return frames to the publishes waiting for
// them, by the token each publish carries in [HeaderPublishToken]. A return
// whose token no publish waits for (its publish gave up, or it was not sent
// by publish) is dropped. The broker sends a return before the confirm of
// the same publish and the client hands it to the tracker before
// dispatching the confirm, so after a confirm take's barrier (a round
// through the tracker's loop) sees any return of it. Each channel has its
// own tracker: a channel's returns, and its publishes' tokens, end with it.
type returnTracker struct {
	in      chan amqp.Return
	barrier chan chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	waiting map[string]*amqp.Return // token -> its return once it came
}

func newReturnTracker(ch *amqp.Channel) *returnTracker {
	rt := startReturnTracker()
	ch.NotifyReturn(rt.in)
	return rt
}

// startReturnTracker starts a tracker whose loop runs until rt.in is
// closed (amqp091 closes it with the channel).
func startReturnTracker() *returnTracker {
	rt := &returnTracker{in: make(chan amqp.Return), barrier: make(chan chan struct{}),
		done: make(chan struct{}), waiting: map[string]*amqp.Return{}}
	go rt.loop()
	return rt
}

func (rt *returnTracker) loop() {
	defer close(rt.done)
	for {
		select {
		case r, ok := <-rt.in:
			if !ok {
				return
			}
			token, _ := r.Headers[HeaderPublishToken].(string)
			rt.mu.Lock()
			if _, ok := rt.waiting[token]; ok {
				rt.waiting[token] = &r
			}
			rt.mu.Unlock()
		case b := <-rt.barrier:
			close(b)
		}
	}
}

// expect registers a publish's token before the publish is sent, so that
// its return is kept.
func (rt *returnTracker) expect(token string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.waiting[token] = nil
}

// forget drops token and its return, if one came.
func (rt *returnTracker) forget(token string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	delete(rt.waiting, token)
}

// take is called after the confirm of the publish with token: it reports
// the publish's return, if the broker sent one, and forgets token.
func (rt *returnTracker) take(token string) (amqp.Return, bool) {
	b := make(chan struct{})
	select {
	case rt.barrier <- b:
		<-b
	case <-rt.done:
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	r := rt.waiting[token]
	delete(rt.waiting, token)
	if r == nil {
		return amqp.Return{}, false
	}
	return *r, true
}

// Publisher publishes to the configured queue through the default
// exchange. It is safe for concurrent use.
type Publisher struct {
	p *publisher
}

var _ queue.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher of cfg.Queue on conn. It opens its
// channel on the first Publish, and a new one after a channel error. Once
// conn is closed, Publish returns errors wrapping [amqp.ErrClosed]; see
// [NewPublisherDial] for a Publisher that dials again.
func NewPublisher(conn *amqp.Connection, cfg Config) (*Publisher, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	l, err := fixedLink(conn)
	if err != nil {
		return nil, err
	}
	return &Publisher{p: &publisher{link: l, cfg: cfg, guard: newSerial()}}, nil
}

// NewPublisherDial returns a Publisher of cfg.Queue on connections it dials
// with dial: the first Publish dials, and a Publish that finds the
// connection closed dials a new one (one attempt per Publish; a failed dial
// is the Publish's error). A publish in flight when the connection dies
// returns an error, never a false success. Close closes the connection.
func NewPublisherDial(dial DialFunc, cfg Config) (*Publisher, error) {
	if dial == nil {
		return nil, fmt.Errorf("%w: dial is nil", ErrConfig)
	}
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	return &Publisher{p: &publisher{link: dialLink(dial), cfg: cfg, guard: newSerial()}}, nil
}

// Close closes the Publisher's channel and the connection it dialed, if
// any (never a connection passed to [NewPublisher]). A Publisher made by
// NewPublisherDial refuses to Publish after Close.
func (p *Publisher) Close() error {
	p.p.close()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTimeout)
	defer cancel()
	return p.p.link.close(ctx)
}

// Publish sends m as a persistent message and waits for the broker's
// confirm. Attributes become string headers. DedupID is only carried (see
// the package documentation); Published.ID is the message-id it sets.
// Delay > 0 publishes to a delay queue. GroupID is ignored. Without a deadline on ctx, Publish waits
// at most 10s for the confirm.
func (p *Publisher) Publish(ctx context.Context, m queue.Outgoing) (queue.Published, error) {
	msg := amqp.Publishing{
		Headers:      amqp.Table{},
		DeliveryMode: amqp.Persistent,
		MessageId:    newID(),
		Timestamp:    time.Now(),
		Body:         m.Body,
	}
	for k, v := range m.Attributes {
		msg.Headers[k] = v
	}
	if m.DedupID != "" {
		msg.Headers[HeaderDedupID] = m.DedupID
	}
	var err error
	if m.Delay > 0 {
		err = p.p.publishDelayed(ctx, m.Delay, msg)
	} else {
		err = p.p.publish(ctx, "", p.p.cfg.Queue, msg)
	}
	if err != nil {
		return queue.Published{}, err
	}
	return queue.Published{ID: msg.MessageId}, nil
}

// Source consumes the configured queue with manual acks. It is safe for
// concurrent use. Close it to cancel the consumer: unacked deliveries go
// back to the queue.
type Source struct {
	link *link
	cfg  Config
	pub  *publisher // shares link

	guard    serial // guards consumer and closed, and opening the channel
	consumer *consumerChannel
	closed   bool
}

// consumerChannel is one channel's consumption and its settle barrier.
type consumerChannel struct {
	ch       *amqp.Channel
	conn     *amqp.Connection // the connection ch was opened on
	prefetch int

	dmu        sync.Mutex
	deliveries <-chan amqp.Delivery
	cancelled  bool // deliveries closed while ch is open: the broker cancelled the consumer

	issued  atomic.Uint64 // tickets taken by settles whose frame is sent
	sem     chan struct{} // one barrier round trip at a time; guards covered
	covered uint64        // every ticket ≤ covered is confirmed processed
}

var _ queue.Source = (*Source)(nil)

// NewSource starts consuming cfg.Queue on conn with the configured
// prefetch. The queue must exist (see [Declare]). After a channel error the
// next Receive opens a new channel; once conn is closed, Receive returns
// errors wrapping [amqp.ErrClosed]. See [NewSourceDial] for a Source that
// dials again.
func NewSource(ctx context.Context, conn *amqp.Connection, cfg Config) (*Source, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	l, err := fixedLink(conn)
	if err != nil {
		return nil, err
	}
	return newSource(ctx, l, cfg)
}

// NewSourceDial dials with dial and starts consuming cfg.Queue as
// [NewSource] does. When the connection is lost, the Receive that finds it
// closed returns an error (the consumer's receive backoff paces the
// attempts), and the next Receive dials a new connection (one attempt per
// Receive, bounded by its context, 10s without a deadline) and consumes
// again. Deliveries received on the lost connection cannot be settled: the
// broker has put them back in the queue, and their Ack, Retry and
// DeadLetter return errors. Close closes the connection the Source dialed.
func NewSourceDial(ctx context.Context, dial DialFunc, cfg Config) (*Source, error) {
	if dial == nil {
		return nil, fmt.Errorf("%w: dial is nil", ErrConfig)
	}
	return newSource(ctx, dialLink(dial), cfg)
}

func newSource(ctx context.Context, l *link, cfg Config) (*Source, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	s := &Source{link: l, cfg: cfg, pub: &publisher{link: l, cfg: cfg, guard: newSerial()}, guard: newSerial()}
	if _, err := s.channel(ctx); err != nil {
		cctx, cancel := context.WithTimeout(context.Background(), defaultTimeout)
		defer cancel()
		_ = l.close(cctx) // a connection it dialed
		return nil, err
	}
	return s, nil
}

func (s *Source) channel(ctx context.Context) (*consumerChannel, error) {
	conn, err := s.link.get(ctx)
	if err != nil {
		return nil, err
	}
	var c *consumerChannel
	err = s.guard.do(ctx, func() error {
		if s.closed {
			return fmt.Errorf("amqpqueue: source closed: %w", amqp.ErrClosed)
		}
		if s.consumer != nil && !s.consumer.ch.IsClosed() && s.consumer.conn == conn {
			if err := s.consumer.reconsume(ctx, s.cfg.Queue); err != nil {
				return err
			}
			c = s.consumer
			return nil
		}
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("amqpqueue: open channel: %w", err)
		}
		if err := ch.Qos(s.cfg.Prefetch, 0, false); err != nil {
			ch.Close()
			return fmt.Errorf("amqpqueue: qos: %w", err)
		}
		ds, err := ch.Consume(s.cfg.Queue, "", false, false, false, false, nil)
		if err != nil {
			ch.Close()
			return fmt.Errorf("amqpqueue: consume %s: %w", s.cfg.Queue, err)
		}
		s.consumer = &consumerChannel{ch: ch, conn: conn, deliveries: ds, prefetch: s.cfg.Prefetch, sem: make(chan struct{}, 1)}
		c = s.consumer
		return nil
	})
	if err != nil {
		return nil, err // c may still be written if ctx ended first
	}
	return c, nil
}

// Close cancels the consumer and closes the Source's channels. Unacked
// deliveries return to the queue. It closes the connection the Source
// dialed (see [NewSourceDial]), never one passed to [NewSource].
func (s *Source) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTimeout)
	defer cancel()
	s.pub.close()
	err := s.guard.do(ctx, func() error {
		s.closed = true
		if s.consumer == nil {
			return nil
		}
		if s.link.dial != nil && s.consumer.conn.IsClosed() {
			return nil // lost with its connection; a new one is not dialed
		}
		return s.consumer.ch.Close()
	})
	return errors.Join(err, s.link.close(ctx))
}

// Visibility returns 0: AMQP has no visibility timeout (see the package
// documentation).
func (s *Source) Visibility() time.Duration { return 0 }

// Receive waits for the first delivery (or ctx) and returns it with up to
// max-1 more that are already prefetched. It returns an error wrapping
// [amqp.ErrClosed] when the consumer stops with its channel or connection;
// on a Source made by [NewSourceDial], the next Receive dials again.
func (s *Source) Receive(ctx context.Context, max int) ([]queue.Delivery, error) {
	if max <= 0 {
		max = 1
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := s.channel(ctx)
	if err != nil {
		return nil, err
	}
	var out []queue.Delivery
	ds := c.stream()
	select {
	case d, ok := <-ds:
		if !ok {
			if c.stopped(ds) {
				return nil, fmt.Errorf("amqpqueue: consumer of %s cancelled by the broker (the next Receive consumes again): %w", s.cfg.Queue, amqp.ErrClosed)
			}
			return nil, fmt.Errorf("amqpqueue: consumer of %s stopped (channel closed): %w", s.cfg.Queue, amqp.ErrClosed)
		}
		out = append(out, s.delivery(c, d))
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	for len(out) < max {
		select {
		case d, ok := <-ds:
			if !ok {
				return out, nil
			}
			out = append(out, s.delivery(c, d))
		default:
			return out, nil
		}
	}
	return out, nil
}

func (s *Source) delivery(c *consumerChannel, d amqp.Delivery) *Delivery {
	m := queue.Message{ID: d.MessageId, Body: d.Body, Published: d.Timestamp}
	if m.ID == "" {
		m.ID = "tag:" + strconv.FormatUint(d.DeliveryTag, 10)
	}
	prior := 0
	this := 1
	if d.Redelivered {
		this = 2
	}
	for k, v := range d.Headers {
		switch {
		case k == HeaderReceives:
			prior = int(toInt(v))
		case k == "x-delivery-count":
			this = int(toInt(v)) + 1
		case k == HeaderDedupID:
			m.DedupID = headerString(v)
		case strings.HasPrefix(k, "x-idem-") || k == "x-death" || strings.HasPrefix(k, "x-first-death-") ||
			strings.HasPrefix(k, "x-last-death-"):
		default:
			if m.Attributes == nil {
				m.Attributes = map[string]string{}
			}
			m.Attributes[k] = headerString(v)
		}
	}
	m.ReceiveCount = prior + this
	return &Delivery{src: s, c: c, d: d, m: m}
}

// headerString is a header value as an attribute string: a string or a
// byte array (the 'x' field other clients, such as Java's for a byte[],
// send) as its bytes, anything else (numbers, booleans, timestamps,
// tables) as fmt.Sprint writes it.
func headerString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return fmt.Sprint(v)
}

func toInt(v any) int64 {
	switch n := v.(type) {
	case int:
		return int64(n)
	case int8:
		return int64(n)
	case int16:
		return int64(n)
	case int32:
		return int64(n)
	case int64:
		return n
	case uint8:
		return int64(n)
	case uint16:
		return int64(n)
	case uint32:
		return int64(n)
	case uint64:
		return int64(n)
	case string:
		i, _ := strconv.ParseInt(n, 10, 64)
		return i
	}
	return 0
}

// Delivery is one received AMQP message.
type Delivery struct {
	src     *Source
	c       *consumerChannel
	d       amqp.Delivery
	m       queue.Message
	mu      sync.Mutex
	settled bool
}

var _ queue.Delivery = (*Delivery)(nil)

// Message returns the delivered message.
func (d *Delivery) Message() queue.Message { return d.m }

// Raw returns the underlying AMQP delivery.
func (d *Delivery) Raw() amqp.Delivery { return d.d }

// Ack acks the message and waits until the broker has processed the ack.
// An error means the ack may not have been processed; the broker then
// delivers the message again.
func (d *Delivery) Ack(ctx context.Context) error {
	return d.settle(ctx, func() error { return d.c.ch.Ack(d.d.DeliveryTag, false) }, "ack")
}

// Retry with delay 0 requeues the message at once (basic.nack, requeue).
// With a delay it publishes a copy to the delay queue for that delay
// (rounded up to a power of two milliseconds; see the package
// documentation), recording the receive count so far, and then acks the
// original. If that publish fails the original is left unacked; if the ack
// fails after the publish, the message comes back twice (the ledger makes
// the second a replay). A delay over [MaxDelay] waits MaxDelay.
func (d *Delivery) Retry(ctx context.Context, delay time.Duration) error {
	delay = min(delay, MaxDelay)
	if delay <= 0 {
		return d.settle(ctx, func() error { return d.c.ch.Nack(d.d.DeliveryTag, false, true) }, "nack")
	}
	return d.settle(ctx, func() error {
		if err := d.c.open(); err != nil {
			return err
		}
		msg := d.copy()
		msg.Headers[HeaderReceives] = int64(d.m.ReceiveCount)
		if err := d.src.pub.publishDelayed(ctx, delay, msg); err != nil {
			return err
		}
		return d.c.ch.Ack(d.d.DeliveryTag, false)
	}, "retry")
}

// Extend extends nothing (AMQP has no visibility timeout): the message
// stays with this receiver as long as its channel is open. So Extend
// checks that it is, with one round trip on the channel (the barrier the
// settles use), and returns an error when the channel or connection is
// closed or the round trip fails: the broker has then put the message back
// in the queue (or will), and a nil would claim a hold that is gone. It
// returns ErrSettled once settled.
func (d *Delivery) Extend(ctx context.Context, _ time.Duration) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.settled {
		return queue.ErrSettled
	}
	if err := d.c.open(); err != nil {
		return fmt.Errorf("amqpqueue: extend of message %s: %w", d.m.ID, err)
	}
	if err := d.c.barrier(ctx); err != nil {
		return fmt.Errorf("amqpqueue: extend of message %s: the channel did not answer (the message may be back in the queue): %w", d.m.ID, err)
	}
	return nil
}

// DeadLetter publishes a copy (body, properties, headers, plus the reason
// in x-idem-dead-letter-reason, valid UTF-8 and at most its first 4,096
// bytes, and the queue in x-idem-dead-letter-queue)
// to the dead-letter exchange with confirms and the mandatory flag, and
// then acks the original.
func (d *Delivery) DeadLetter(ctx context.Context, why string) error {
	return d.settle(ctx, func() error {
		if err := d.c.open(); err != nil {
			return err
		}
		msg := d.copy()
		msg.Headers[HeaderDeadLetterReason] = reason.Bound(why)
		msg.Headers[HeaderDeadLetterQueue] = d.src.cfg.Queue
		msg.Headers[HeaderReceives] = int64(d.m.ReceiveCount)
		cfg := d.src.cfg
		if err := d.src.pub.publish(ctx, cfg.DeadLetterExchange, cfg.DeadLetterRoutingKey, msg); err != nil {
			return fmt.Errorf("amqpqueue: dead-letter: %w", err)
		}
		return d.c.ch.Ack(d.d.DeliveryTag, false)
	}, "dead-letter")
}

// copy returns the delivery as a persistent Publishing with its message
// id, timestamp and headers (less the broker's delivery bookkeeping, and
// less the CC and BCC headers of sender-selected distribution, which would
// route the copy to the original's other queues as well).
func (d *Delivery) copy() amqp.Publishing {
	h := amqp.Table{}
	for k, v := range d.d.Headers {
		switch {
		case k == "x-delivery-count" || k == "x-death" || strings.HasPrefix(k, "x-first-death-") ||
			strings.HasPrefix(k, "x-last-death-") || k == "CC" || k == "BCC":
		default:
			h[k] = v
		}
	}
	id := d.d.MessageId
	if id == "" {
		id = newID()
	}
	return amqp.Publishing{
		Headers: h, ContentType: d.d.ContentType, ContentEncoding: d.d.ContentEncoding,
		DeliveryMode: amqp.Persistent, Priority: d.d.Priority, CorrelationId: d.d.CorrelationId,
		ReplyTo: d.d.ReplyTo, MessageId: id, Timestamp: d.d.Timestamp, Type: d.d.Type,
		AppId: d.d.AppId, Body: d.d.Body,
	}
}

// settle runs send (which writes the ack or nack frame) and then waits for
// the channel's barrier. It marks the delivery settled only on success.
func (d *Delivery) settle(ctx context.Context, send func() error, what string) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.settled {
		return queue.ErrSettled
	}
	if err := send(); err != nil {
		return fmt.Errorf("amqpqueue: %s of message %s: %w", what, d.m.ID, err)
	}
	if err := d.c.barrier(ctx); err != nil {
		return fmt.Errorf("amqpqueue: %s of message %s not confirmed (it may be delivered again): %w", what, d.m.ID, err)
	}
	d.settled = true
	return nil
}

// stream returns the consumer's current deliveries.
func (c *consumerChannel) stream() <-chan amqp.Delivery {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	return c.deliveries
}

// stopped is called when ds, a stream of c, is closed. It reports whether
// the broker cancelled the consumer (basic.cancel) while the channel stays
// open, and then marks c to consume again.
func (c *consumerChannel) stopped(ds <-chan amqp.Delivery) bool {
	if c.ch.IsClosed() {
		return false
	}
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if c.deliveries == ds {
		c.cancelled = true
	}
	return true
}

// reconsume consumes queueName again on the same channel when the broker
// cancelled the consumer: the channel, and the delivery tags of the
// messages received before, stay valid. It holds the barrier's semaphore,
// so that basic.consume and a barrier's basic.qos are never in flight
// together (amqp091 would hand one the other's reply).
func (c *consumerChannel) reconsume(ctx context.Context, queueName string) error {
	c.dmu.Lock()
	cancelled := c.cancelled
	c.dmu.Unlock()
	if !cancelled {
		return nil
	}
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.sem }()
	ds, err := c.ch.Consume(queueName, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("amqpqueue: consume %s again after the broker cancelled the consumer: %w", queueName, err)
	}
	c.dmu.Lock()
	c.deliveries, c.cancelled = ds, false
	c.dmu.Unlock()
	return nil
}

// open returns an error wrapping [amqp.ErrClosed] when the channel is
// closed. Retry and DeadLetter check it before publishing a copy: the
// broker has put the message back in the queue, and the ack after the copy
// would fail.
func (c *consumerChannel) open() error {
	if c.ch.IsClosed() || c.conn.IsClosed() {
		return fmt.Errorf("channel closed, the message is back in the queue: %w", amqp.ErrClosed)
	}
	return nil
}

// barrier returns once the broker has processed every frame this channel
// sent before the call: one synchronous basic.qos round trip, shared by the
// settles waiting at the same time. It returns ctx's error if ctx ends
// first (the round trip goes on, holding off the next one, so that a reply
// is never taken for a later request's).
func (c *consumerChannel) barrier(ctx context.Context) error {
	ticket := c.issued.Add(1)
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	if c.covered >= ticket {
		<-c.sem
		return nil
	}
	upto := c.issued.Load()
	res := make(chan error, 1)
	go func() {
		err := c.ch.Qos(c.prefetch, 0, false)
		if err == nil {
			c.covered = upto
		}
		<-c.sem
		res <- err
	}()
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, defaultTimeout)
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
