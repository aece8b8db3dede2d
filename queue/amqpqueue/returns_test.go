package amqpqueue

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A basic.return belongs to the publish that caused it, not to any publish
// with the same message-id. Copies (DeadLetter, a delayed Retry) keep the
// original's message-id and a producer may reuse one (a business id), so
// here an unroutable message with message-id "order-1" is sent on the
// Source's publishing channel without waiting for its return, as a publish
// whose context ended would leave it. A routable publish with the same
// message-id must then succeed (matched by message-id, it took the stale
// return and failed as unroutable, though the broker stored it), and an
// unroutable one must still fail.
func TestReturnMatchedToItsPublish(t *testing.T) {
	f := newFixture(t, false)
	src := f.source(t, f.conn)
	p := src.pub
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch, _, err := p.channel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "amq.direct", "idemt-nowhere-"+uniq(), true, false,
		amqp.Publishing{MessageId: "order-1", Body: []byte("abandoned")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dc.WaitContext(ctx); err != nil { // its return came before this confirm
		t.Fatal(err)
	}

	dlq := f.cfg.Queue + ".dead-letter"
	if err := p.publish(ctx, "", dlq, amqp.Publishing{MessageId: "order-1", Body: []byte("routable")}); err != nil {
		t.Fatalf("routable publish with a message-id an abandoned unroutable publish had: %v, want nil", err)
	}
	err = p.publish(ctx, "amq.direct", "idemt-nowhere-"+uniq(), amqp.Publishing{MessageId: "order-1", Body: []byte("unroutable")})
	if !errors.Is(err, ErrUnroutable) {
		t.Fatalf("unroutable publish: %v, want ErrUnroutable", err)
	}
	if dl := f.deadLetters(t); len(dl) != 1 || string(dl[0].Body) != "routable" {
		t.Fatalf("dead-letter queue holds %d messages, want the routable one", len(dl))
	}
}

// The tracker hands a return to the publish whose token it carries, when
// two publishes in flight share a message-id (a DeadLetter copy and a
// delayed Retry copy of two deliveries of one business id): the routable
// one is not told it was returned, the unroutable one is. A return whose
// publish gave up is dropped, not kept for ever.
func TestReturnTrackerMatchesTokens(t *testing.T) {
	rt := startReturnTracker()
	defer func() { close(rt.in); <-rt.done }()
	returned := func(token string) amqp.Return {
		return amqp.Return{ReplyCode: amqp.NoRoute, ReplyText: "NO_ROUTE", MessageId: "order-1",
			Headers: amqp.Table{HeaderPublishToken: token}}
	}

	rt.expect("dead-letter")
	rt.expect("retry")
	rt.in <- returned("dead-letter")
	if _, ok := rt.take("retry"); ok {
		t.Error("the routable publish took the return of another publish with its message-id")
	}
	if r, ok := rt.take("dead-letter"); !ok || r.ReplyCode != amqp.NoRoute {
		t.Errorf("the unroutable publish got no return (%v, %+v): it would report success for a dropped message", ok, r)
	}

	rt.expect("gave-up")
	rt.forget("gave-up")
	rt.in <- returned("gave-up")
	rt.in <- amqp.Return{MessageId: "order-1"} // not sent by publish: no token
	rt.expect("later")
	if _, ok := rt.take("later"); ok {
		t.Error("a later publish took a return nobody waited for")
	}
	rt.mu.Lock()
	left := len(rt.waiting)
	rt.mu.Unlock()
	if left != 0 {
		t.Errorf("tracker still holds %d entries after every publish took or forgot its own", left)
	}
}
