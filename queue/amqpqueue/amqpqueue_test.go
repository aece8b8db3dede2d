package amqpqueue

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemkit/idem/internal/tcprelay"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/queue"
	amqp "github.com/rabbitmq/amqp091-go"
)

// bothKinds runs f on a classic and on a quorum queue (skipping t at once
// when RabbitMQ is not configured).
func bothKinds(t *testing.T, f func(t *testing.T, quorum bool)) {
	amqpURL(t)
	t.Run("classic", func(t *testing.T) { f(t, false) })
	t.Run("quorum", func(t *testing.T) { f(t, true) })
}

// A published message arrives with its body, attributes, dedup id,
// message id and publish time and receive count 1; once acked it is gone.
func TestPublishReceiveAck(t *testing.T) {
	bothKinds(t, func(t *testing.T, quorum bool) {
		f := newFixture(t, quorum)
		p, src := f.publisher(t, f.conn), f.source(t, f.conn)
		before := time.Now().Add(-2 * time.Second)
		var ids []string
		for i := range 3 {
			res := publish(t, p, queue.Outgoing{Body: []byte(fmt.Sprint("m", i)),
				Attributes: map[string]string{"order": strconv.Itoa(i)}, DedupID: fmt.Sprint("d", i)})
			if res.Duplicate || res.ID == "" {
				t.Fatalf("publish %d: %+v", i, res)
			}
			ids = append(ids, res.ID)
		}
		var got []queue.Delivery
		for len(got) < 3 {
			got = append(got, receive(t, src, 3-len(got), 5*time.Second)...)
		}
		for i, d := range got {
			m := d.Message()
			if string(m.Body) != fmt.Sprint("m", i) || m.Attributes["order"] != strconv.Itoa(i) || len(m.Attributes) != 1 ||
				m.DedupID != fmt.Sprint("d", i) || m.ID != ids[i] || m.ReceiveCount != 1 ||
				m.Published.Before(before) || m.Published.After(time.Now().Add(2*time.Second)) {
				t.Fatalf("delivery %d: %+v (ids %v)", i, m, ids)
			}
			if err := d.Ack(context.Background()); err != nil {
				t.Fatalf("ack %d: %v", i, err)
			}
		}
		if err := got[0].Ack(context.Background()); !errors.Is(err, queue.ErrSettled) {
			t.Fatalf("second ack: %v, want ErrSettled", err)
		}
		if err := src.Close(); err != nil {
			t.Fatal(err)
		}
		if n := f.count(t, f.cfg.Queue); n != 0 {
			t.Fatalf("queue holds %d messages after acking all and closing the source", n)
		}
		if src.Visibility() != 0 {
			t.Fatalf("Visibility %v, want 0", src.Visibility())
		}
	})
}

// Retry(0) requeues at once; a closed channel hands unacked messages back;
// Retry(delay) goes through the delay queue and comes back no sooner than
// the delay. The receive count grows with every delivery where the broker
// counts (quorum queues, and the delay path on both kinds); a classic
// queue's requeue only says "redelivered" (2).
func TestRetryAndReceiveCounts(t *testing.T) {
	bothKinds(t, func(t *testing.T, quorum bool) {
		f := newFixture(t, quorum)
		p, src := f.publisher(t, f.conn), f.source(t, f.conn)
		res := publish(t, p, queue.Outgoing{Body: []byte("again")})
		want := func(d queue.Delivery, exact, classic int) {
			t.Helper()
			n := exact
			if !quorum {
				n = classic
			}
			if m := d.Message(); m.ReceiveCount != n || m.ID != res.ID || string(m.Body) != "again" {
				t.Fatalf("delivery: %+v, want receive count %d", m, n)
			}
		}
		d := receive(t, src, 1, 5*time.Second)[0]
		want(d, 1, 1)
		if err := d.Retry(context.Background(), 0); err != nil {
			t.Fatal(err)
		}
		d = receive(t, src, 1, 5*time.Second)[0]
		want(d, 2, 2)

		// An unacked delivery returns when its channel closes.
		if err := src.Close(); err != nil {
			t.Fatal(err)
		}
		if err := d.Ack(context.Background()); err == nil {
			t.Fatal("Ack on a closed channel returned nil")
		}
		src = f.source(t, f.conn)
		d = receive(t, src, 1, 5*time.Second)[0]
		want(d, 3, 2)

		start := time.Now()
		if err := d.Retry(context.Background(), 700*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		d = receive(t, src, 1, 10*time.Second)[0]
		if waited := time.Since(start); waited < 650*time.Millisecond {
			t.Fatalf("delayed retry came back after %v, want at least 700ms", waited)
		}
		want(d, 4, 3)
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
		receiveNone(t, src, 300*time.Millisecond)
	})
}

// Outgoing.Delay holds the first delivery back for at least the delay.
func TestPublishDelay(t *testing.T) {
	f := newFixture(t, false)
	p, src := f.publisher(t, f.conn), f.source(t, f.conn)
	start := time.Now()
	publish(t, p, queue.Outgoing{Body: []byte("later"), Delay: 500 * time.Millisecond})
	d := receive(t, src, 1, 10*time.Second)[0]
	if waited := time.Since(start); waited < 450*time.Millisecond {
		t.Fatalf("delivered after %v, want at least 500ms", waited)
	}
	if d.Message().ReceiveCount != 1 || string(d.Message().Body) != "later" {
		t.Fatalf("delivery %+v", d.Message())
	}
	if err := d.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// DeadLetter puts a copy with the reason in the dead-letter queue and the
// original is gone from the queue.
func TestDeadLetterKeepsTheReason(t *testing.T) {
	bothKinds(t, func(t *testing.T, quorum bool) {
		f := newFixture(t, quorum)
		p, src := f.publisher(t, f.conn), f.source(t, f.conn)
		res := publish(t, p, queue.Outgoing{Body: []byte("poison"), Attributes: map[string]string{"tenant": "7"}})
		d := receive(t, src, 1, 5*time.Second)[0]
		if err := d.DeadLetter(context.Background(), "cannot parse order: unexpected EOF"); err != nil {
			t.Fatal(err)
		}
		if err := d.Retry(context.Background(), 0); !errors.Is(err, queue.ErrSettled) {
			t.Fatalf("retry after dead-letter: %v, want ErrSettled", err)
		}
		dl := f.deadLetters(t)
		if len(dl) != 1 {
			t.Fatalf("dead-letter queue holds %d messages, want 1", len(dl))
		}
		h := dl[0].Headers
		if string(dl[0].Body) != "poison" || h[HeaderDeadLetterReason] != "cannot parse order: unexpected EOF" ||
			h["tenant"] != "7" || h[HeaderDeadLetterQueue] != f.cfg.Queue || dl[0].MessageId != res.ID {
			t.Fatalf("dead letter: %q %v id %q", dl[0].Body, h, dl[0].MessageId)
		}
		if err := src.Close(); err != nil {
			t.Fatal(err)
		}
		if n := f.count(t, f.cfg.Queue); n != 0 {
			t.Fatalf("queue still holds %d messages", n)
		}
	})
}

// A reason as long as an error quoting a whole response (here larger than
// RabbitMQ's frame, which closed the channel) is cut to its first 4,096
// bytes: the message is dead-lettered, not left to come back for ever.
func TestDeadLetterHugeReason(t *testing.T) {
	f := newFixture(t, false)
	p, src := f.publisher(t, f.conn), f.source(t, f.conn)
	publish(t, p, queue.Outgoing{Body: []byte("poison")})
	d := receive(t, src, 1, 5*time.Second)[0]
	why := strings.Repeat("é", 300<<10)
	if err := d.DeadLetter(context.Background(), why); err != nil {
		t.Fatal(err)
	}
	dl := f.deadLetters(t)
	if len(dl) != 1 || dl[0].Headers[HeaderDeadLetterReason] != why[:4096] {
		t.Fatalf("dead letters %d; want one, with the reason's first 4,096 bytes", len(dl))
	}
}

// A dead-letter destination that routes nowhere is an error, and the
// message stays in the queue: nothing is lost. Publishing to a queue that
// does not exist is an error too, not a silent drop.
func TestUnroutableIsAnError(t *testing.T) {
	f := newFixture(t, false)
	p := f.publisher(t, f.conn)
	publish(t, p, queue.Outgoing{Body: []byte("keep me")})

	bad := f.cfg
	bad.DeadLetterRoutingKey = "idemt-no-such-queue-" + uniq()
	bsrc, err := NewSource(context.Background(), f.conn, bad)
	if err != nil {
		t.Fatal(err)
	}
	defer bsrc.Close()
	d := receive(t, bsrc, 1, 5*time.Second)[0]
	if err := d.DeadLetter(context.Background(), "x"); !errors.Is(err, ErrUnroutable) {
		t.Fatalf("dead-letter to nowhere: %v, want ErrUnroutable", err)
	}
	if err := bsrc.Close(); err != nil {
		t.Fatal(err)
	}
	src := f.source(t, f.conn)
	again := receive(t, src, 1, 5*time.Second)[0]
	if string(again.Message().Body) != "keep me" || again.Message().ReceiveCount != 2 {
		t.Fatalf("after a failed dead-letter: %+v", again.Message())
	}
	if err := again.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}

	nowhere, err := NewPublisher(f.conn, Config{Queue: "idemt-no-such-queue-" + uniq()})
	if err != nil {
		t.Fatal(err)
	}
	defer nowhere.Close()
	if _, err := nowhere.Publish(context.Background(), queue.Outgoing{Body: []byte("x")}); !errors.Is(err, ErrUnroutable) {
		t.Fatalf("publish to a missing queue: %v, want ErrUnroutable", err)
	}
	// The publisher's channel survives a return.
	publish(t, p, queue.Outgoing{Body: []byte("still fine")})
}

// RabbitMQ does not dedup: two publishes with one DedupID are two
// deliveries, both carrying the id. (The ledger is the only line; see
// TestConsumerLedgerIsTheOnlyLine.)
func TestNoBrokerDedup(t *testing.T) {
	f := newFixture(t, false)
	p, src := f.publisher(t, f.conn), f.source(t, f.conn)
	a := publish(t, p, queue.Outgoing{Body: []byte("order 42"), DedupID: "order-42"})
	b := publish(t, p, queue.Outgoing{Body: []byte("order 42"), DedupID: "order-42"})
	if a.Duplicate || b.Duplicate || a.ID == b.ID {
		t.Fatalf("publishes: %+v %+v", a, b)
	}
	var got []queue.Delivery
	for len(got) < 2 {
		got = append(got, receive(t, src, 2, 5*time.Second)...)
	}
	for _, d := range got {
		if d.Message().DedupID != "order-42" {
			t.Fatalf("delivery %+v", d.Message())
		}
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// GroupID is ignored (RabbitMQ has no groups); a missing queue name is
// refused with ErrConfig.
func TestGroupIgnoredAndConfig(t *testing.T) {
	f := newFixture(t, false)
	p := f.publisher(t, f.conn)
	publish(t, p, queue.Outgoing{Body: []byte("grouped"), GroupID: "g"})
	if d := receive(t, f.source(t, f.conn), 1, 5*time.Second)[0]; d.Message().GroupID != "" || string(d.Message().Body) != "grouped" {
		t.Fatalf("grouped message: %+v, want the body and no group", d.Message())
	}
	if _, err := NewPublisher(f.conn, Config{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("no queue: %v", err)
	}
	if _, err := NewSource(context.Background(), f.conn, Config{Queue: "q", DeadLetterExchange: "dlx"}); !errors.Is(err, ErrConfig) {
		t.Fatalf("exchange without routing key: %v", err)
	}
}

// A connection that goes silent while an ack (or a retry, a dead-letter) is
// on its way gives an error, not a false settle; when it dies the broker redelivers the message. Closing
// the connection under a received delivery does the same. A publish over a
// dead connection fails. Nothing is lost.
func TestConnectionLost(t *testing.T) {
	f := newFixture(t, false)
	p := f.publisher(t, f.conn)
	publish(t, p, queue.Outgoing{Body: []byte("fragile")})

	u, err := url.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	px := tcprelay.New(t, u.Host)
	pu := *u
	pu.Host = px.Addr()
	pconn := dial(t, pu.String())
	psrc := f.source(t, pconn)
	ppub := f.publisher(t, pconn)
	d := receive(t, psrc, 1, 5*time.Second)[0]

	px.Blackhole()
	for name, settle := range map[string]func(context.Context) error{
		"Ack":        d.Ack,
		"Retry(0)":   func(ctx context.Context) error { return d.Retry(ctx, 0) },
		"Retry(1s)":  func(ctx context.Context) error { return d.Retry(ctx, time.Second) },
		"DeadLetter": func(ctx context.Context) error { return d.DeadLetter(ctx, "x") },
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err := settle(ctx)
		cancel()
		if err == nil {
			t.Fatalf("%s over a silent connection returned nil", name)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, err = ppub.Publish(ctx, queue.Outgoing{Body: []byte("lost?")})
	cancel()
	if err == nil {
		t.Fatal("Publish over a silent connection returned nil")
	}
	px.Close() // the broker sees the connection die and requeues

	src := f.source(t, f.conn)
	again := receive(t, src, 1, 10*time.Second)[0]
	if string(again.Message().Body) != "fragile" || again.Message().ReceiveCount != 2 {
		t.Fatalf("redelivery: %+v", again.Message())
	}
	if err := again.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	receiveNone(t, src, 300*time.Millisecond) // the publish over the silent connection stored nothing
	if dl := f.deadLetters(t); len(dl) != 0 {
		t.Fatalf("%d dead letters from a DeadLetter over a silent connection", len(dl))
	}

	// Closing the amqp.Connection itself.
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	publish(t, p, queue.Outgoing{Body: []byte("fragile 2")})
	conn2 := dial(t, f.url)
	src2 := f.source(t, conn2)
	d = receive(t, src2, 1, 5*time.Second)[0]
	if err := conn2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Ack(context.Background()); err == nil {
		t.Fatal("Ack after the connection closed returned nil")
	}
	if _, err := src2.Receive(context.Background(), 1); !errors.Is(err, amqp.ErrClosed) {
		t.Fatalf("Receive on a closed connection: %v, want amqp.ErrClosed", err)
	}
	src = f.source(t, f.conn)
	again = receive(t, src, 1, 10*time.Second)[0]
	if string(again.Message().Body) != "fragile 2" || again.Message().ReceiveCount != 2 {
		t.Fatalf("redelivery: %+v", again.Message())
	}
	if err := again.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Receive returns ctx's error, and no deliveries, when ctx ends first.
func TestReceiveHonoursContext(t *testing.T) {
	f := newFixture(t, false)
	src := f.source(t, f.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	ds, err := src.Receive(ctx, 5)
	if !errors.Is(err, context.DeadlineExceeded) || len(ds) != 0 {
		t.Fatalf("Receive on an empty queue: %d deliveries, err %v", len(ds), err)
	}
}

func TestDelayQueueRounding(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		name string
		ttl  int64
	}{
		{time.Nanosecond, "q.delay.1ms", 1},
		{time.Millisecond, "q.delay.1ms", 1},
		{3 * time.Millisecond, "q.delay.4ms", 4},
		{time.Second, "q.delay.1024ms", 1024},
		{1024 * time.Millisecond, "q.delay.1024ms", 1024},
		{1025 * time.Millisecond, "q.delay.2048ms", 2048},
		// Past 2³¹ ms the next power of two is over RabbitMQ's largest
		// TTL (2³²−1 ms): the delay queue takes that largest one.
		{1<<31*time.Millisecond + 1, "q.delay.4294967295ms", 1<<32 - 1},
		{MaxDelay, "q.delay.4294967295ms", 1<<32 - 1},
	} {
		name, ttl, err := delayQueue("q", c.d)
		if err != nil || name != c.name || ttl != c.ttl || time.Duration(ttl)*time.Millisecond < c.d {
			t.Errorf("delayQueue(%v) = %s, %d, %v; want %s, %d", c.d, name, ttl, err, c.name, c.ttl)
		}
	}
	if _, _, err := delayQueue("q", MaxDelay+time.Millisecond); !errors.Is(err, ErrDelayTooLong) {
		t.Errorf("a delay over MaxDelay: %v, want ErrDelayTooLong", err)
	}
}

// A producer may route one publish to several queues with RabbitMQ's
// sender-selected distribution (a CC header, kept on the delivered
// message). The copies Retry(delay) and DeadLetter publish must go to the
// delay queue and the dead-letter queue only: carrying CC, they were routed
// again to the CC'd queues, which received the message once more per retry
// and dead-letter.
func TestCopiesDoNotFollowCC(t *testing.T) {
	bothKinds(t, func(t *testing.T, quorum bool) {
		f := newFixture(t, quorum)
		audit := f.cfg.Queue + ".audit"
		ch, err := f.conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		if _, err := ch.QueueDeclare(audit, false, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.cleanupQueue(t, audit) })
		if err := ch.PublishWithContext(context.Background(), "", f.cfg.Queue, false, false, amqp.Publishing{
			MessageId: "m1", Body: []byte("order"), Headers: amqp.Table{"CC": []any{audit}},
		}); err != nil {
			t.Fatal(err)
		}
		src := f.source(t, f.conn)
		d := receive(t, src, 1, 5*time.Second)[0]
		waitCount(t, f, audit, 1) // the producer's own copy
		if err := d.Retry(context.Background(), 20*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		d = receive(t, src, 1, 5*time.Second)[0]
		if err := d.DeadLetter(context.Background(), "permanent"); err != nil {
			t.Fatal(err)
		}
		if dl := f.deadLetters(t); len(dl) != 1 {
			t.Fatalf("dead-letter queue holds %d messages, want 1", len(dl))
		}
		time.Sleep(200 * time.Millisecond)
		if n := f.count(t, audit); n != 1 {
			t.Fatalf("the CC'd queue holds %d messages, want only the producer's 1", n)
		}
	})
}

// Headers another client sent as AMQP byte arrays (the 'x' field type;
// the Java client's byte[] headers) reach Attributes and DedupID as their
// bytes, not as Go's fmt.Sprint of a []byte ("[116 45 55]"). Other values
// keep their printed form.
func TestByteArrayHeaders(t *testing.T) {
	f := newFixture(t, false)
	src := f.source(t, f.conn)
	ch, err := f.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.PublishWithContext(context.Background(), "", f.cfg.Queue, false, false, amqp.Publishing{
		MessageId: "m1", Body: []byte("x"), Headers: amqp.Table{
			"tenant": []byte("t-7"), HeaderDedupID: []byte("order-8891"), "n": int32(42),
		},
	}); err != nil {
		t.Fatal(err)
	}
	d := receive(t, src, 1, 5*time.Second)[0]
	m := d.Message()
	if got := m.Attributes["tenant"]; got != "t-7" {
		t.Errorf("attribute tenant = %q, want %q (sent as a byte array)", got, "t-7")
	}
	if got := m.Attributes["n"]; got != "42" {
		t.Errorf("attribute n = %q, want %q (sent as an int32)", got, "42")
	}
	if m.DedupID != "order-8891" {
		t.Errorf("DedupID = %q, want %q (sent as a byte array)", m.DedupID, "order-8891")
	}
	if err := d.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func waitCount(t *testing.T, f *fixture, name string, want int) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); f.count(t, name) != want; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("queue %s holds %d messages, want %d", name, f.count(t, name), want)
		}
	}
}

func (f *fixture) cleanupQueue(t *testing.T, name string) {
	ch, err := f.conn.Channel()
	if err != nil {
		return
	}
	defer ch.Close()
	_, _ = ch.QueueDelete(name, false, false, false)
}

// When the broker cancels the consumer (basic.cancel: its queue was deleted,
// or a queue's leader went away) the channel stays open. The Receive that
// finds the consumer stopped returns an error; the next ones must consume
// again, not find the same stopped consumer forever. Deliveries received
// before stay settleable (their channel is the same).
func TestConsumerCancelledByBroker(t *testing.T) {
	f := newFixture(t, false)
	src := f.source(t, f.conn)
	p := f.publisher(t, f.conn)
	publish(t, p, queue.Outgoing{Body: []byte("before")})
	before := receive(t, src, 1, 5*time.Second)[0]
	if _, err := before.(*Delivery).c.ch.QueueDelete(f.cfg.Queue, false, false, false); err != nil {
		t.Fatal(err) // on the consumer's own channel, as an operator's delete elsewhere would do
	}
	if err := Declare(context.Background(), f.conn, f.cfg); err != nil {
		t.Fatal(err)
	}
	publish(t, p, queue.Outgoing{Body: []byte("after")})
	var errs []error
	for range 5 {
		// A receive that finds the stopped consumer fails at once; the
		// one that consumes again has 5 s to get the message (1 s was
		// short for a loaded broker).
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ds, err := src.Receive(ctx, 1)
		cancel()
		if len(ds) > 0 {
			if string(ds[0].Message().Body) != "after" {
				t.Fatalf("received %q, want after", ds[0].Message().Body)
			}
			if err := ds[0].Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := before.Ack(context.Background()); err != nil {
				t.Fatalf("ack of a delivery received before the cancel: %v", err)
			}
			return
		}
		errs = append(errs, err)
	}
	t.Fatalf("never received after the broker cancelled the consumer: %v", errs)
}

// Delay queues are declared while other goroutines publish through the
// same publisher. A declare on the publishing channel could land between
// the frames of a concurrent publish, and RabbitMQ then closed the whole
// connection ("unexpected_frame: expected content header"): a publish
// failed with "channel closed before the confirm" in CI's load check.
func TestDeclareDelayQueuesWhilePublishing(t *testing.T) {
	f := newFixture(t, false)
	p := f.publisher(t, f.conn)
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var published atomic.Int64
	errs := make(chan error, 16)
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := p.Publish(ctx, queue.Outgoing{Body: []byte("plain")}); err != nil {
					errs <- err
					return
				}
				published.Add(1)
			}
		})
	}
	// Each delay a new power of two milliseconds: a new delay queue each.
	for i := range 24 {
		if _, err := p.Publish(ctx, queue.Outgoing{Body: []byte("later"), Delay: time.Duration(1<<i) * time.Millisecond}); err != nil {
			t.Errorf("delayed publish %d: %v", i, err)
			break
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("publish beside the declares: %v", err)
	}
	if published.Load() == 0 {
		t.Fatal("no publish ran beside the declares")
	}
	t.Logf("%d publishes beside 24 delay queue declares", published.Load())
}
