package queuetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/queue"
)

// lapse is the visibility the suite sets where it waits for one to pass.
const lapse = 2 * time.Second

// testBroker checks the semantics of Source, Delivery and Publisher that the
// Consumer relies on.
func testBroker(t *testing.T, h Harness) {
	t.Run("publish_receive_ack", func(t *testing.T) {
		t.Parallel()
		src, pub := h.New(t, 30*time.Second)
		want := []string{"m1", "m2", "m3"}
		for _, b := range want {
			p := publish(t, pub, queue.Outgoing{Body: []byte(b), Attributes: map[string]string{"kind": "receipt", "n": b}})
			if p.ID == "" || p.Duplicate {
				t.Fatalf("Publish(%s) = %+v, want an id and no duplicate", b, p)
			}
		}
		ds := receiveAll(t, src, 3, 10*time.Second)
		var got []string
		for _, d := range ds {
			m := d.Message()
			got = append(got, string(m.Body))
			if m.ID == "" || m.ReceiveCount != 1 {
				t.Errorf("message %q: ID %q, ReceiveCount %d; want an id and 1", m.Body, m.ID, m.ReceiveCount)
			}
			if m.Attributes["kind"] != "receipt" || m.Attributes["n"] != string(m.Body) {
				t.Errorf("message %q: attributes %v, want kind=receipt n=%s", m.Body, m.Attributes, m.Body)
			}
			settle(t, "Ack", d.Ack(context.Background()))
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("received %q, want %q", got, want)
		}
		receiveNone(t, src, 500*time.Millisecond, "after acking every message")
	})

	t.Run("in_flight_is_invisible", func(t *testing.T) {
		t.Parallel()
		src, pub := h.New(t, 30*time.Second)
		publish(t, pub, queue.Outgoing{Body: []byte("once")})
		d := receiveOne(t, src, 10*time.Second)
		receiveNone(t, src, 500*time.Millisecond, "while the only message is in flight")
		settle(t, "Ack", d.Ack(context.Background()))
	})

	t.Run("retry_redelivers", func(t *testing.T) {
		t.Parallel()
		src, pub := h.New(t, 30*time.Second)
		publish(t, pub, queue.Outgoing{Body: []byte("again")})
		d := receiveOne(t, src, 10*time.Second)
		settle(t, "Retry(0)", d.Retry(context.Background(), 0))
		d2 := receiveOne(t, src, 10*time.Second)
		m := d2.Message()
		if string(m.Body) != "again" || m.ReceiveCount < 2 {
			t.Fatalf("redelivery: body %q, ReceiveCount %d; want again, at least 2", m.Body, m.ReceiveCount)
		}
		if m.ID != d.Message().ID {
			t.Errorf("redelivery has id %q, want the first delivery's %q", m.ID, d.Message().ID)
		}
		settle(t, "Ack", d2.Ack(context.Background()))
		receiveNone(t, src, 500*time.Millisecond, "after acking the redelivery")
	})

	t.Run("settled_delivery_refuses", func(t *testing.T) {
		// A delivery is settled once: after Ack, Retry or DeadLetter it
		// holds nothing, and any later call on it is refused with an
		// error wrapping queue.ErrSettled. An Ack that went through after
		// a Retry would drop a message the consumer handed back; an Extend
		// would hide it from the receiver it was handed back to.
		t.Parallel()
		src, pub := h.New(t, 30*time.Second)
		publish(t, pub, queue.Outgoing{Body: []byte("once")})
		d := receiveOne(t, src, 10*time.Second)
		settle(t, "Retry(0)", d.Retry(context.Background(), 0))
		refused(t, h, d, "Retry(0)")
		d2 := receiveOne(t, src, 10*time.Second)
		if m := d2.Message(); string(m.Body) != "once" || m.ReceiveCount < 2 {
			t.Fatalf("redelivery after the refused calls: body %q, ReceiveCount %d; want once, at least 2", m.Body, m.ReceiveCount)
		}
		settle(t, "Ack of the redelivery", d2.Ack(context.Background()))
		refused(t, h, d2, "Ack")
		receiveNone(t, src, 500*time.Millisecond, "after acking the redelivery and refusing the calls after it")
	})

	t.Run("visibility_lapse_redelivers", func(t *testing.T) {
		t.Parallel()
		src, pub := h.New(t, lapse)
		if src.Visibility() == 0 {
			t.Skip("the broker has no visibility timeout: a held message returns only when its channel closes")
		}
		publish(t, pub, queue.Outgoing{Body: []byte("slow")})
		d := receiveOne(t, src, 10*time.Second)
		d2 := receiveOne(t, src, src.Visibility()+10*time.Second)
		// At least 2: ReceiveCount counts what the broker handed out, and
		// a broker may hand the message to a receive that has given up
		// meanwhile (a JetStream pull request that expired as the ack wait
		// lapsed, an SQS long poll whose caller left), which the receiver
		// never sees.
		if m := d2.Message(); string(m.Body) != "slow" || m.ReceiveCount < 2 {
			t.Fatalf("after the visibility lapsed: body %q ReceiveCount %d, want slow, at least 2", m.Body, m.ReceiveCount)
		}
		settle(t, "Ack of the redelivery", d2.Ack(context.Background()))
		_ = d.Ack(context.Background()) // the stale holder's ack: refused or harmless, never a redelivery
		receiveNone(t, src, 500*time.Millisecond, "after acking the redelivery")
	})

	t.Run("extend_keeps_invisible", func(t *testing.T) {
		t.Parallel()
		src, pub := h.New(t, lapse)
		if src.Visibility() == 0 {
			t.Skip("the broker has no visibility timeout to extend")
		}
		publish(t, pub, queue.Outgoing{Body: []byte("long")})
		d := receiveOne(t, src, 10*time.Second)
		end := time.Now().Add(2 * src.Visibility())
		for time.Now().Before(end) {
			settle(t, "Extend", d.Extend(context.Background(), src.Visibility()))
			receiveNone(t, src, src.Visibility()/3, "while the holder extends its delivery")
		}
		settle(t, "Ack after extending", d.Ack(context.Background()))
		receiveNone(t, src, 500*time.Millisecond, "after acking")
	})

	t.Run("dead_letter", func(t *testing.T) {
		t.Parallel()
		dl := deadLetterPoison(t, h, "cannot parse: bad json")
		if dl.Reason != "" && dl.Reason != "cannot parse: bad json" {
			t.Errorf("dead letter reason %q, want the one given", dl.Reason)
		}
	})

	t.Run("dead_letter_long_reason", func(t *testing.T) {
		// A reason is often an error's text, which may quote a whole
		// response: longer than a broker takes in a header. The message
		// must still be dead-lettered, not come back for ever.
		t.Parallel()
		why := strings.Repeat("é", 1<<20) // 2 MiB
		if dl := deadLetterPoison(t, h, why); !strings.HasPrefix(why, dl.Reason) {
			t.Fatalf("dead letter reason %.40q..., want a prefix of the one given", dl.Reason)
		}
	})

	t.Run("dedup_window", func(t *testing.T) {
		t.Parallel()
		if !h.Features.DedupWindow {
			t.Skip("the broker has no publish-side dedup: the ledger is the only line against duplicates")
		}
		src, pub := h.New(t, 30*time.Second)
		first := publish(t, pub, queue.Outgoing{Body: []byte("order-1"), DedupID: "order-1", GroupID: "g"})
		second := publish(t, pub, queue.Outgoing{Body: []byte("order-1"), DedupID: "order-1", GroupID: "g"})
		if first.Duplicate || !second.Duplicate {
			t.Fatalf("publishes with one DedupID: Duplicate %v then %v, want false then true", first.Duplicate, second.Duplicate)
		}
		publish(t, pub, queue.Outgoing{Body: []byte("order-2"), DedupID: "order-2", GroupID: "g"})
		var got []string
		for range 2 {
			d := receiveOne(t, src, 10*time.Second)
			got = append(got, string(d.Message().Body))
			settle(t, "Ack", d.Ack(context.Background()))
		}
		receiveNone(t, src, 500*time.Millisecond, "after the two distinct messages")
		slices.Sort(got)
		if !slices.Equal(got, []string{"order-1", "order-2"}) {
			t.Fatalf("received %q, want order-1 and order-2 once each", got)
		}
	})

	t.Run("delay", func(t *testing.T) {
		t.Parallel()
		if !h.Features.Delay {
			t.Skip("the broker has no delayed delivery")
		}
		src, pub := h.New(t, 30*time.Second)
		start := time.Now()
		publish(t, pub, queue.Outgoing{Body: []byte("later"), Delay: 2 * time.Second})
		receiveNone(t, src, time.Second, "before the delay passed")
		d := receiveOne(t, src, 15*time.Second)
		if took := time.Since(start); took < 2*time.Second {
			t.Fatalf("delayed message delivered after %v, want at least 2s", took)
		}
		settle(t, "Ack", d.Ack(context.Background()))
	})

	t.Run("retry_delay", func(t *testing.T) {
		t.Parallel()
		if !h.Features.RetryDelay {
			t.Skip("the broker ignores Retry's delay")
		}
		src, pub := h.New(t, 30*time.Second)
		publish(t, pub, queue.Outgoing{Body: []byte("backoff")})
		d := receiveOne(t, src, 10*time.Second)
		start := time.Now()
		settle(t, "Retry(2s)", d.Retry(context.Background(), 2*time.Second))
		receiveNone(t, src, time.Second, "before the retry delay passed")
		d2 := receiveOne(t, src, 15*time.Second)
		if took := time.Since(start); took < 2*time.Second {
			t.Fatalf("retried message delivered after %v, want at least 2s", took)
		}
		settle(t, "Ack", d2.Ack(context.Background()))
	})

	t.Run("fifo_groups", func(t *testing.T) {
		t.Parallel()
		if !h.Features.FIFO {
			t.Skip("the broker has no FIFO groups")
		}
		src, pub := h.New(t, 30*time.Second)
		for i := range 3 {
			publish(t, pub, queue.Outgoing{Body: fmt.Appendf(nil, "a%d", i), GroupID: "a", DedupID: fmt.Sprintf("a%d", i)})
			publish(t, pub, queue.Outgoing{Body: fmt.Appendf(nil, "b%d", i), GroupID: "b", DedupID: fmt.Sprintf("b%d", i)})
		}
		// Hold a0: group a is blocked, group b goes on in order. One message
		// per receive: a broker may hand out a group's messages together in
		// one batch (SQS FIFO does), in order.
		var a0 queue.Delivery
		var bs []string
		deadline := time.Now().Add(15 * time.Second)
		for len(bs) < 3 && time.Now().Before(deadline) {
			for _, d := range receive(t, src, 1, time.Until(deadline)) {
				m := d.Message()
				switch {
				case string(m.Body) == "a0" && a0 == nil:
					a0 = d
				case m.GroupID == "a":
					t.Fatalf("received %s while a0 is in flight: a FIFO group must wait for its earlier message", m.Body)
				default:
					bs = append(bs, string(m.Body))
					settle(t, "Ack "+string(m.Body), d.Ack(context.Background()))
				}
			}
		}
		if a0 == nil || !slices.Equal(bs, []string{"b0", "b1", "b2"}) {
			t.Fatalf("with a0 held: got a0 %v and group b %q; want a0 and b0 b1 b2 in order", a0 != nil, bs)
		}
		// a0 fails and is retried: it comes back before a1.
		settle(t, "Retry a0", a0.Retry(context.Background(), 0))
		var as []string
		deadline = time.Now().Add(15 * time.Second)
		for len(as) < 3 && time.Now().Before(deadline) {
			for _, d := range receive(t, src, 1, time.Until(deadline)) {
				as = append(as, string(d.Message().Body))
				settle(t, "Ack", d.Ack(context.Background()))
			}
		}
		if !slices.Equal(as, []string{"a0", "a1", "a2"}) {
			t.Fatalf("group a after a0's retry: %q, want a0 a1 a2", as)
		}
	})
}

// deadLetterPoison dead-letters the only message of a fresh queue with
// reason why and returns it as the dead letters show it (it skips t when
// the adapter declares no dead-letter destination).
func deadLetterPoison(t *testing.T, h Harness, why string) DeadLetter {
	t.Helper()
	if !h.Features.DeadLetter {
		t.Skip("the adapter declares no dead-letter destination")
	}
	src, pub := h.New(t, 30*time.Second)
	publish(t, pub, queue.Outgoing{Body: []byte("poison")})
	d := receiveOne(t, src, 10*time.Second)
	settle(t, fmt.Sprintf("DeadLetter with a reason of %d bytes", len(why)), d.DeadLetter(context.Background(), why))
	receiveNone(t, src, 500*time.Millisecond, "after dead-lettering the only message")
	var dl []DeadLetter
	eventually(t, 10*time.Second, "the dead-lettered message never reached the dead letters", func() bool {
		dl = h.DeadLetters(t, src)
		return len(dl) > 0
	})
	if len(dl) != 1 || string(dl[0].Message.Body) != "poison" {
		t.Fatalf("%d dead letters (the first's body %q), want the one poison message", len(dl), dl[0].Message.Body)
	}
	return dl[0]
}

// refused checks that every settle of d, and Extend, is refused with an
// error wrapping queue.ErrSettled now that d was settled by how (DeadLetter
// only where the adapter declares a dead-letter destination).
func refused(t *testing.T, h Harness, d queue.Delivery, how string) {
	t.Helper()
	for _, op := range SettleOps(time.Hour) {
		if op.Name == "DeadLetter" && !h.Features.DeadLetter {
			continue
		}
		if err := op.Call(context.Background(), d); !errors.Is(err, queue.ErrSettled) {
			t.Errorf("%s after %s: %v, want an error wrapping queue.ErrSettled", op.Name, how, err)
		}
	}
}
