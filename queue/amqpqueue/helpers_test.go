package amqpqueue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/queue"
	amqp "github.com/rabbitmq/amqp091-go"
)

func amqpURL(tb testing.TB) string {
	tb.Helper()
	return testenv.Require(tb, testenv.AMQP, "the RabbitMQ suite")
}

func dial(tb testing.TB, url string) *amqp.Connection {
	tb.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		tb.Fatalf("dial %s: %v", url, err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	return conn
}

func uniq() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// fixture is one test's queue, its dead-letter queue and the delay queues
// its sources and publishers declared, all deleted at cleanup.
type fixture struct {
	url  string
	conn *amqp.Connection
	cfg  Config
	mu   sync.Mutex
	pubs []*publisher
}

func newFixture(tb testing.TB, quorum bool) *fixture {
	tb.Helper()
	url := amqpURL(tb)
	f := &fixture{url: url, conn: dial(tb, url), cfg: Config{Queue: "idemt-" + uniq(), Quorum: quorum}}
	if err := Declare(context.Background(), f.conn, f.cfg); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.cleanup(tb) })
	return f
}

func (f *fixture) cleanup(tb testing.TB) {
	conn, err := amqp.Dial(f.url)
	if err != nil {
		tb.Logf("cleanup: %v", err)
		return
	}
	defer conn.Close()
	names := []string{f.cfg.Queue, f.cfg.Queue + ".dead-letter"}
	f.mu.Lock()
	for _, p := range f.pubs {
		p.delays.Range(func(k, _ any) bool { names = append(names, k.(string)); return true })
	}
	f.mu.Unlock()
	for _, n := range names {
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		_, _ = ch.QueueDelete(n, false, false, false)
		_ = ch.Close()
	}
}

func (f *fixture) source(tb testing.TB, conn *amqp.Connection) *Source {
	tb.Helper()
	s, err := NewSource(context.Background(), conn, f.cfg)
	f.adopt(tb, err, func() *publisher { return s.pub }, func() error { return s.Close() })
	return s
}

func (f *fixture) publisher(tb testing.TB, conn *amqp.Connection) *Publisher {
	tb.Helper()
	p, err := NewPublisher(conn, f.cfg)
	f.adopt(tb, err, func() *publisher { return p.p }, func() error { return p.Close() })
	return p
}

// adopt fails tb on err (the making of a Source or Publisher); otherwise
// it keeps the publisher it holds, for the fixture's cleanup, and closes
// it when tb ends.
func (f *fixture) adopt(tb testing.TB, err error, pub func() *publisher, closeFn func() error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
	f.mu.Lock()
	f.pubs = append(f.pubs, pub())
	f.mu.Unlock()
	tb.Cleanup(func() { _ = closeFn() })
}

// count is how many ready messages a queue holds.
func (f *fixture) count(tb testing.TB, name string) int {
	tb.Helper()
	ch, err := f.conn.Channel()
	if err != nil {
		tb.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, f.cfg.queueArgs())
	if err != nil {
		tb.Fatal(err)
	}
	return q.Messages
}

// deadLetters takes (and acks) everything in the dead-letter queue.
func (f *fixture) deadLetters(tb testing.TB) []amqp.Delivery {
	tb.Helper()
	ch, err := f.conn.Channel()
	if err != nil {
		tb.Fatal(err)
	}
	defer ch.Close()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(f.cfg.Queue+".dead-letter", true)
		if err != nil {
			tb.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

func publish(tb testing.TB, p queue.Publisher, m queue.Outgoing) queue.Published {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := p.Publish(ctx, m)
	if err != nil {
		tb.Fatalf("publish: %v", err)
	}
	return res
}

func receive(tb testing.TB, s queue.Source, max int, d time.Duration) []queue.Delivery {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	ds, err := s.Receive(ctx, max)
	if err != nil {
		tb.Fatalf("receive: %v", err)
	}
	return ds
}

func receiveNone(tb testing.TB, s queue.Source, d time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	ds, err := s.Receive(ctx, 10)
	if len(ds) > 0 {
		tb.Fatalf("received %d deliveries (first %q, count %d), want none", len(ds), ds[0].Message().Body, ds[0].Message().ReceiveCount)
	}
	if err == nil {
		tb.Fatal("Receive returned no deliveries and no error")
	}
}
