package jetstream

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/tcprelay"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/queuetest"
	"github.com/nats-io/nats.go"
)

var settleOps = queuetest.SettleOps(time.Second)

// cutFixture is a stream with one message received through a relay, on a
// connection with the client's default reconnects.
func cutFixture(t *testing.T) (*fixture, *tcprelay.Relay, queue.Delivery, *Publisher) {
	t.Helper()
	url := natsURL(t)
	_, js := connect(t, url)
	f := newFixture(t, js, fixtureOpts{ackWait: 2 * time.Second})
	publish(t, f.publisher(t, js), queue.Outgoing{Body: []byte("fragile")})
	px := tcprelay.New(t, url[len("nats://"):])
	_, pjs := connect(t, "nats://"+px.Addr(), nats.ReconnectWait(50*time.Millisecond))
	d := receive(t, f.source(t, pjs), 1, 5*time.Second)[0]
	return f, px, d, f.publisher(t, pjs)
}

// The connection is cut while a settle (or an extension) is on its way,
// before the server saw it, and the client reconnects (through a relay
// that stays silent): the call returns an error, and the message is
// delivered again with nothing dead-lettered.
func TestCutMidSettle(t *testing.T) {
	for _, op := range settleOps {
		t.Run(op.Name, func(t *testing.T) {
			f, px, d, _ := cutFixture(t)
			px.Blackhole()
			res := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				res <- op.Call(ctx, d)
			}()
			time.Sleep(50 * time.Millisecond)
			px.Cut()
			if err := <-res; err == nil {
				t.Fatalf("%s cut mid-call returned nil", op.Name)
			}
			px.Close()

			src := f.source(t, f.js)
			again := receive(t, src, 1, 10*time.Second)[0]
			if string(again.Message().Body) != "fragile" || again.Message().ReceiveCount < 2 { // at least: nats-server 2.9 may count an expired pull's delivery
				t.Fatalf("redelivery: %+v", again.Message())
			}
			if err := again.Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
			if dl := f.deadLetters(t); len(dl) != 0 {
				t.Fatalf("%d dead letters from a DeadLetter cut mid-call", len(dl))
			}
		})
	}
}

// The server's answer to a settle is cut with its connection, and the
// client reconnects at once: the server may have acted, but no answer
// came, so the call returns an error, never nil.
func TestSettleAnswerCut(t *testing.T) {
	for _, op := range settleOps {
		t.Run(op.Name, func(t *testing.T) {
			_, px, d, _ := cutFixture(t)
			px.DropAnswers(1)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if err := op.Call(ctx, d); err == nil {
				t.Fatalf("%s whose answer was cut returned nil", op.Name)
			}
		})
	}
}

// A publish cut before the server saw it returns an error and stores
// nothing; one whose PubAck is cut returns an error too.
func TestCutMidPublish(t *testing.T) {
	t.Run("before", func(t *testing.T) {
		f, px, _, p := cutFixture(t)
		px.Blackhole()
		res := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := p.Publish(ctx, queue.Outgoing{Body: []byte("lost?")})
			res <- err
		}()
		time.Sleep(50 * time.Millisecond)
		px.Cut()
		if err := <-res; err == nil {
			t.Fatal("Publish cut mid-call returned nil")
		}
		px.Close()
		time.Sleep(100 * time.Millisecond)
		if n := f.streamMsgs(t); n != 1 {
			t.Fatalf("stream holds %d messages, want 1 (the publish cut before the server saw it stored nothing)", n)
		}
	})
	t.Run("answer", func(t *testing.T) {
		_, px, _, p := cutFixture(t)
		px.DropAnswers(1)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := p.Publish(ctx, queue.Outgoing{Body: []byte("maybe")}); err == nil {
			t.Fatal("Publish whose PubAck was cut returned nil")
		}
	})
}
