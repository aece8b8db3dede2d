package amqpqueue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/tcprelay"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store/memstore"
	amqp "github.com/rabbitmq/amqp091-go"
)

// relay starts a tcprelay to the fixture's broker and returns it with the
// URL that goes through it.
func (f *fixture) relay(tb testing.TB) (*tcprelay.Relay, string) {
	tb.Helper()
	u, err := url.Parse(f.url)
	if err != nil {
		tb.Fatal(err)
	}
	px := tcprelay.New(tb, u.Host)
	pu := *u
	pu.Host = px.Addr()
	return px, pu.String()
}

// dialer is a DialFunc (DialURL) that records the connections it made.
type dialer struct {
	url   string
	mu    sync.Mutex
	conns []*amqp.Connection
}

func (d *dialer) dial(ctx context.Context) (*amqp.Connection, error) {
	c, err := DialURL(d.url)(ctx)
	if err == nil {
		d.mu.Lock()
		d.conns = append(d.conns, c)
		d.mu.Unlock()
	}
	return c, err
}

func (d *dialer) dialed() []*amqp.Connection {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*amqp.Connection(nil), d.conns...)
}

// last is the newest connection dialed.
func (d *dialer) last(tb testing.TB) *amqp.Connection {
	tb.Helper()
	cs := d.dialed()
	if len(cs) == 0 {
		tb.Fatal("nothing dialed")
	}
	return cs[len(cs)-1]
}

func (f *fixture) sourceDial(tb testing.TB, dial DialFunc) *Source {
	tb.Helper()
	s, err := NewSourceDial(context.Background(), dial, f.cfg)
	f.adopt(tb, err, func() *publisher { return s.pub }, func() error { return s.Close() })
	return s
}

func (f *fixture) publisherDial(tb testing.TB, dial DialFunc) *Publisher {
	tb.Helper()
	p, err := NewPublisherDial(dial, f.cfg)
	f.adopt(tb, err, func() *publisher { return p.p }, func() error { return p.Close() })
	return p
}

// waitClosed waits until the client has noticed that conn is gone (its
// reader saw the socket close).
func waitClosed(tb testing.TB, conn *amqp.Connection) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !conn.IsClosed() {
		if time.Now().After(deadline) {
			tb.Fatal("the client did not notice the closed connection in 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// receiveAfterLoss receives n deliveries from a Source whose connection
// was lost, as a Consumer would: a Receive that fails with amqp.ErrClosed
// (the consumer stopped with its connection) is tried again.
func receiveAfterLoss(tb testing.TB, s queue.Source, n int) []queue.Delivery {
	tb.Helper()
	var out []queue.Delivery
	failures := 0
	for len(out) < n {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ds, err := s.Receive(ctx, n-len(out))
		cancel()
		if err != nil {
			failures++
			if !errors.Is(err, amqp.ErrClosed) || failures > 3 {
				tb.Fatalf("receive after %d failures: %v", failures, err)
			}
			continue
		}
		out = append(out, ds...)
	}
	return out
}

// A Consumer on a dialing Source keeps going when every connection drops
// in the middle of the run: the Receive that finds the consumer stopped
// fails, the next one dials again. A message handled but not acked before
// the drop (its Ack fails) comes back and is a replay: every message's
// effect happens exactly once, every message is acked, nothing is left.
func TestConsumerSurvivesDroppedConnection(t *testing.T) {
	bothKinds(t, func(t *testing.T, quorum bool) {
		f := newFixture(t, quorum)
		px, purl := f.relay(t)
		dl := &dialer{url: purl}
		src := &countingSource{Source: f.sourceDial(t, dl.dial)}
		p := f.publisher(t, f.conn)
		const n = 200
		for i := range n {
			publish(t, p, queue.Outgoing{Body: fmt.Appendf(nil, "k%03d", i)})
		}

		store := memstore.New()
		t.Cleanup(func() { store.Close() })
		var mu sync.Mutex
		effects := map[string]int{}
		// From the n/3-th effect on, handlers block until the drop is
		// noticed. Once every slot is blocked in a handler no settle is in
		// flight, so each ack either completed before the drop or fails
		// after it without being sent: a message is acked without error
		// exactly when the broker has removed it, and the test can wait for
		// all n.
		const slots = 4
		var blocked atomic.Int32
		dropped := make(chan struct{}) // closed by the test once the drop is noticed
		quiet := slog.New(slog.DiscardHandler)
		c, err := queue.NewConsumer(src, idem.New(store, idem.WithLogger(quiet)),
			func(m queue.Message) (idem.OperationKey, error) { return idem.Key("effect", string(m.Body)), nil },
			func(ctx context.Context, m queue.Message) ([]byte, error) {
				mu.Lock()
				effects[string(m.Body)]++
				hold := len(effects) >= n/3
				mu.Unlock()
				if hold {
					select {
					case <-dropped:
					default:
						blocked.Add(1)
						<-dropped
					}
				}
				return []byte("done"), nil
			}, queue.WithConcurrency(slots), queue.WithBackoff(20*time.Millisecond, 200*time.Millisecond),
			queue.WithBusyDelay(50*time.Millisecond), queue.WithLogger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()

		deadline := time.Now().Add(30 * time.Second)
		for blocked.Load() < slots {
			if time.Now().After(deadline) {
				t.Fatalf("after 30s: %d received, %d acked, %d handlers blocked", src.received.Load(), src.acked.Load(), blocked.Load())
			}
			time.Sleep(5 * time.Millisecond)
		}
		first := dl.last(t)
		px.Cut()
		waitClosed(t, first)
		close(dropped)

		deadline = time.Now().Add(60 * time.Second)
		for src.ackedDistinct() < n {
			if time.Now().After(deadline) {
				t.Fatalf("after 60s: %d of %d messages acked (%d acks, %d failed, %d dials)",
					src.ackedDistinct(), n, src.acked.Load(), src.ackFailed.Load(), len(dl.dialed()))
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		if f := src.ackFailed.Load(); f != slots {
			t.Fatalf("%d acks failed, want %d (the blocked handlers')", f, slots)
		}
		if len(dl.dialed()) < 2 {
			t.Fatalf("%d dials, want a redial", len(dl.dialed()))
		}
		mu.Lock()
		for i := range n {
			if k := fmt.Sprintf("k%03d", i); effects[k] != 1 {
				t.Errorf("effect %s ran %d times, want 1", k, effects[k])
			}
		}
		if len(effects) != n {
			t.Errorf("%d effects, want %d", len(effects), n)
		}
		mu.Unlock()
		if err := src.Source.(*Source).Close(); err != nil {
			t.Fatal(err)
		}
		if !dl.last(t).IsClosed() {
			t.Fatal("Close left the dialed connection open")
		}
		if n := f.count(t, f.cfg.Queue); n != 0 {
			t.Fatalf("%d messages left in the queue", n)
		}
	})
}

// A dialing Publisher publishes on a new connection after a drop. A
// publish whose confirm is lost returns an error (the message may or may
// not be stored), and the next publish dials again. After Close, the
// connection is closed and Publish refuses.
func TestPublisherRedials(t *testing.T) {
	f := newFixture(t, false)
	px, purl := f.relay(t)
	dl := &dialer{url: purl}
	p := f.publisherDial(t, dl.dial)
	src := f.source(t, f.conn)

	publish(t, p, queue.Outgoing{Body: []byte("a")})
	px.Cut()
	waitClosed(t, dl.last(t))
	publish(t, p, queue.Outgoing{Body: []byte("b")})
	if n := len(dl.dialed()); n != 2 {
		t.Fatalf("%d dials after a drop, want 2", n)
	}

	px.DropAnswers(1) // the confirm
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err := p.Publish(ctx, queue.Outgoing{Body: []byte("c")})
	cancel()
	if err == nil {
		t.Fatal("a publish whose confirm was lost returned nil")
	}
	waitClosed(t, dl.last(t))
	publish(t, p, queue.Outgoing{Body: []byte("d")})
	if n := len(dl.dialed()); n != 3 {
		t.Fatalf("%d dials after a lost confirm, want 3", n)
	}

	got := map[string]int{}
	for got["a"]+got["b"]+got["d"] < 3 {
		for _, d := range receive(t, src, 4, 5*time.Second) {
			got[string(d.Message().Body)]++
			if err := d.Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	receiveNone(t, src, 300*time.Millisecond)
	if got["a"] != 1 || got["b"] != 1 || got["d"] != 1 || got["c"] > 1 {
		t.Fatalf("received %v, want a, b and d once (c at most once: its confirm was lost, not its publish)", got)
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if !dl.last(t).IsClosed() {
		t.Fatal("Close left the dialed connection open")
	}
	if _, err := p.Publish(context.Background(), queue.Outgoing{Body: []byte("e")}); !errors.Is(err, amqp.ErrClosed) {
		t.Fatalf("Publish after Close: %v, want amqp.ErrClosed", err)
	}
	if n := len(dl.dialed()); n != 3 {
		t.Fatalf("%d dials after Close, want 3", n)
	}
}

// Deliveries received on a connection that dropped cannot be settled:
// Ack, Retry (with or without a delay) and DeadLetter return errors, and
// Retry and DeadLetter publish no copy. The broker delivers each again on
// the new connection, where they settle.
func TestDeliveryFromLostConnection(t *testing.T) {
	bothKinds(t, func(t *testing.T, quorum bool) {
		f := newFixture(t, quorum)
		px, purl := f.relay(t)
		dl := &dialer{url: purl}
		src := f.sourceDial(t, dl.dial)
		p := f.publisher(t, f.conn)
		for _, b := range []string{"ack", "retry", "retry later", "dead-letter"} {
			publish(t, p, queue.Outgoing{Body: []byte(b)})
		}
		byBody := map[string]queue.Delivery{}
		for _, d := range receiveAfterLoss(t, src, 4) {
			byBody[string(d.Message().Body)] = d
		}
		px.Cut()
		waitClosed(t, dl.last(t))

		ctx := context.Background()
		for name, err := range map[string]error{
			"Ack":        byBody["ack"].Ack(ctx),
			"Retry(0)":   byBody["retry"].Retry(ctx, 0),
			"Retry(1ms)": byBody["retry later"].Retry(ctx, time.Millisecond),
			"DeadLetter": byBody["dead-letter"].DeadLetter(ctx, "x"),
		} {
			if !errors.Is(err, amqp.ErrClosed) {
				t.Errorf("%s of a delivery from the lost connection: %v, want amqp.ErrClosed", name, err)
			}
		}

		again := receiveAfterLoss(t, src, 4)
		if n := len(dl.dialed()); n != 2 {
			t.Fatalf("%d dials, want 2", n)
		}
		for _, d := range again {
			m := d.Message()
			if byBody[string(m.Body)] == nil || m.ReceiveCount != 2 || m.ID != byBody[string(m.Body)].Message().ID {
				t.Fatalf("redelivery %+v, want one of the four, receive count 2", m)
			}
			delete(byBody, string(m.Body))
			if err := d.Ack(ctx); err != nil {
				t.Fatalf("ack of the redelivery: %v", err)
			}
		}
		receiveNone(t, src, 300*time.Millisecond) // no delayed copy from Retry(1ms)
		if dls := f.deadLetters(t); len(dls) != 0 {
			t.Fatalf("%d dead letters from a DeadLetter on the lost connection", len(dls))
		}
	})
}

// Without a dial function nothing redials: once the connection is gone,
// Receive and Publish keep failing with amqp.ErrClosed. Close never
// closes the caller's connection, and a connection with amqp091's own
// recovery is refused.
func TestNoDialKeepsConnection(t *testing.T) {
	f := newFixture(t, false)
	px, purl := f.relay(t)
	conn := dial(t, purl)
	src := f.source(t, conn)
	p := f.publisher(t, conn)
	publish(t, p, queue.Outgoing{Body: []byte("x")})
	px.Cut()
	waitClosed(t, conn)
	// "x" may have been prefetched before the cut: a Receive may hand it
	// out (it cannot be acked), then Receive fails.
	for i := 0; ; i++ {
		ds, err := src.Receive(context.Background(), 1)
		if errors.Is(err, amqp.ErrClosed) {
			break
		}
		if err != nil || i > 0 || len(ds) != 1 {
			t.Fatalf("Receive %d on a closed connection: %d deliveries, %v; want amqp.ErrClosed (after at most the prefetched message)", i+1, len(ds), err)
		}
		if err := ds[0].Ack(context.Background()); !errors.Is(err, amqp.ErrClosed) {
			t.Fatalf("Ack of a delivery prefetched before the cut: %v, want amqp.ErrClosed", err)
		}
	}
	for range 2 {
		if _, err := src.Receive(context.Background(), 1); !errors.Is(err, amqp.ErrClosed) {
			t.Fatalf("Receive on a closed connection: %v, want amqp.ErrClosed", err)
		}
		if _, err := p.Publish(context.Background(), queue.Outgoing{Body: []byte("y")}); !errors.Is(err, amqp.ErrClosed) {
			t.Fatalf("Publish on a closed connection: %v, want amqp.ErrClosed", err)
		}
	}

	mine := dial(t, f.url)
	s, err := NewSource(context.Background(), mine, f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	q, err := NewPublisher(mine, f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if mine.IsClosed() {
		t.Fatal("Close closed the caller's connection")
	}

	rec, err := amqp.DialConfig(f.url, amqp.Config{Recovery: &amqp.Recovery{
		ReconnectionConfig: &amqp.ReconnectionConfig{MaxRetryCount: 1, RetryInterval: time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	if _, err := NewSource(context.Background(), rec, f.cfg); !errors.Is(err, ErrConfig) {
		t.Fatalf("NewSource on a recovering connection: %v, want ErrConfig", err)
	}
	if _, err := NewPublisher(rec, f.cfg); !errors.Is(err, ErrConfig) {
		t.Fatalf("NewPublisher on a recovering connection: %v, want ErrConfig", err)
	}
	if _, err := NewSourceDial(context.Background(), func(context.Context) (*amqp.Connection, error) { return rec, nil }, f.cfg); !errors.Is(err, ErrConfig) {
		t.Fatalf("NewSourceDial dialing a recovering connection: %v, want ErrConfig", err)
	}
}

// A dial gives up when its context ends, even when the network is silent
// (the TCP connect succeeds, the AMQP handshake gets no answer), and so
// does the Receive that dials.
func TestDialBoundedByContext(t *testing.T) {
	f := newFixture(t, false)
	px, purl := f.relay(t)
	dl := &dialer{url: purl}
	src := f.sourceDial(t, dl.dial)
	px.Blackhole()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if c, err := DialURL(purl)(ctx); err == nil {
		c.Close()
		t.Fatal("a dial over a silent network succeeded")
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := DialURL(f.url)(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("dial with a cancelled context: %v", err)
	}

	px.Cut() // the silent network's sockets close too: the source's connection is lost
	waitClosed(t, dl.last(t))
	for range 2 { // each dials again and gives up with its context
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		_, err := src.Receive(ctx, 1)
		cancel()
		if err == nil {
			t.Fatal("Receive over a silent network returned no error")
		}
	}
	if n := len(dl.dialed()); n != 1 {
		t.Fatalf("%d dials succeeded over a silent network", n)
	}
}
