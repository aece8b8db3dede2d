package amqpqueue

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/queuetest"
)

// settleOps are the calls on a delivery that must not report success for
// something the broker did not take.
var settleOps = queuetest.SettleOps(time.Millisecond)

// The connection is cut while a settle (or an extension) is on its way:
// the frames sent never reach the broker (the network went silent first)
// and then every socket closes. Each call returns an error, the message
// comes back whole on another connection (receive count 2), and no
// dead-lettered or delayed copy was made. Extend included: once the
// connection is gone the broker has put the message back, so an Extend
// that said nil would claim a hold that no longer exists.
func TestCutMidSettle(t *testing.T) {
	for _, op := range settleOps {
		t.Run(op.Name, func(t *testing.T) {
			f := newFixture(t, false)
			publish(t, f.publisher(t, f.conn), queue.Outgoing{Body: []byte("fragile")})
			px, purl := f.relay(t)
			pconn := dial(t, purl)
			d := receive(t, f.source(t, pconn), 1, 5*time.Second)[0]

			px.Blackhole()
			res := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				res <- op.Call(ctx, d)
			}()
			time.Sleep(50 * time.Millisecond)
			px.Cut()
			if err := <-res; err == nil {
				t.Fatalf("%s cut mid-call returned nil", op.Name)
			}
			waitClosed(t, pconn)
			if err := op.Call(context.Background(), d); err == nil {
				t.Fatalf("%s after the cut returned nil", op.Name)
			}

			src := f.source(t, f.conn)
			again := receive(t, src, 1, 10*time.Second)[0]
			if string(again.Message().Body) != "fragile" || again.Message().ReceiveCount != 2 {
				t.Fatalf("redelivery: %+v", again.Message())
			}
			if err := again.Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
			receiveNone(t, src, 300*time.Millisecond) // no delayed copy
			if dl := f.deadLetters(t); len(dl) != 0 {
				t.Fatalf("%d dead letters from a DeadLetter cut mid-call", len(dl))
			}
		})
	}
}

// The broker's answer to a settle's round trip is lost and the
// connection closes: the broker may have taken the settle, but the caller
// cannot know, so the call returns an error, never nil.
func TestSettleAnswerCut(t *testing.T) {
	for _, op := range settleOps {
		if op.Name == "Extend" {
			continue // no frame, no answer to lose: TestCutMidSettle covers it
		}
		t.Run(op.Name, func(t *testing.T) {
			f := newFixture(t, false)
			publish(t, f.publisher(t, f.conn), queue.Outgoing{Body: []byte("fragile")})
			px, purl := f.relay(t)
			pconn := dial(t, purl)
			d := receive(t, f.source(t, pconn), 1, 5*time.Second)[0]

			px.DropAnswers(1)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := op.Call(ctx, d)
			cancel()
			if err == nil {
				t.Fatalf("%s whose answer was cut returned nil", op.Name)
			}
		})
	}
}

// A publish cut before the broker saw it returns an error and stores
// nothing. (A publish whose confirm is lost: TestPublisherRedials.)
func TestCutMidPublish(t *testing.T) {
	f := newFixture(t, false)
	px, purl := f.relay(t)
	p := f.publisher(t, dial(t, purl))
	px.Blackhole()
	res := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := p.Publish(ctx, queue.Outgoing{Body: []byte("lost?")})
		res <- err
	}()
	time.Sleep(50 * time.Millisecond)
	px.Cut()
	if err := <-res; err == nil {
		t.Fatal("Publish cut mid-call returned nil")
	}
	receiveNone(t, f.source(t, f.conn), 300*time.Millisecond)
}
