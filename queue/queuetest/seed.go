package queuetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store"
)

var policies = []idem.Policy{idem.AtLeastOnce, idem.AtMostOnce}

// errAfterSend is the receipts scenario's "throw after the send on purpose".
// seedLease is the ledger lease of the tests where two consumers meet one
// key: short, so that a busy copy's retry comes soon, but long enough that
// the holder's heartbeats keep it on a loaded machine (1 s lapsed behind
// dynalite's late answers in CI, and the message ran twice).
const seedLease = 3 * time.Second

var errAfterSend = errors.New("smtp: connection reset after DATA (the mail was sent)")

// testSeed runs the receipts scenario's three checks under each policy.
func testSeed(t *testing.T, h Harness) {
	for _, p := range policies {
		t.Run("duplicate_payload/"+p.String(), func(t *testing.T) {
			t.Parallel()
			src, pub := h.New(t, 30*time.Second)
			var fx effects
			var lg logs
			obs := observe(src)
			c := newConsumer(t, obs, idem.New(h.store(t), idem.WithPolicy(p), idem.WithLogger(lg.logger())), func(_ context.Context, m queue.Message) ([]byte, error) {
				fx.do("receipt:order-1")
				return []byte("sent"), nil
			}, fast(&lg)...)
			publish(t, pub, queue.Outgoing{Body: []byte("order-1 alice@example.com")})
			publish(t, pub, queue.Outgoing{Body: []byte("order-1 alice@example.com")})
			stop := runConsumer(t, c)
			eventually(t, 30*time.Second, "both copies were not acked", func() bool { return obs.count("ack") == 2 })
			stop()
			if n := fx.of("receipt:order-1"); n != 1 {
				t.Fatalf("handler called twice with the same payload: %d effects, want 1", n)
			}
		})

		t.Run("throw_after_send/"+p.String(), func(t *testing.T) {
			t.Parallel()
			src, pub := h.New(t, 30*time.Second)
			st := h.store(t)
			var fx effects
			var lg logs
			obs := observe(src)
			l := idem.New(st, idem.WithPolicy(p), idem.WithLogger(lg.logger()))
			c := newConsumer(t, obs, l, func(_ context.Context, m queue.Message) ([]byte, error) {
				fx.do("receipt:order-1")
				if fx.of("receipt:order-1") == 1 {
					return nil, errAfterSend
				}
				return []byte("sent"), nil
			}, append(fast(&lg), queue.WithMaxReceives(3))...)
			publish(t, pub, queue.Outgoing{Body: []byte("order-1 alice@example.com")})
			stop := runConsumer(t, c)
			if p == idem.AtMostOnce {
				eventually(t, 30*time.Second, "the message was not redelivered after the failure", func() bool {
					return len(lg.find(map[string]string{"msg": "queue message indeterminate"})) > 0
				})
				stop()
				if n := fx.of("receipt:order-1"); n != 1 {
					t.Fatalf("AtMostOnce: the redelivery repeated the effect: %d effects, want 1", n)
				}
				if n := obs.count("ack"); n != 0 {
					t.Fatalf("AtMostOnce: %d acks of a message whose effect is unknown, want 0", n)
				}
				stuck, err := st.List(context.Background(), store.ListQuery{Stuck: true})
				if err != nil {
					t.Fatalf("List(stuck): %v", err)
				}
				if len(stuck) != 1 || stuck[0].Key != idem.Key("receipt", "order-1").String() {
					t.Fatalf("idem ls --stuck lists %d records, want the one key receipt:order-1", len(stuck))
				}
				return
			}
			eventually(t, 30*time.Second, "the message was not acked after the retry", func() bool { return obs.count("ack") == 1 })
			stop()
			if n := fx.of("receipt:order-1"); n != 2 {
				t.Fatalf("AtLeastOnce without a Reconcile hook: %d effects, want 2 (the effect repeats)", n)
			}
			if got := lg.find(map[string]string{"msg": "queue message executed", "attempt": "2"}); len(got) != 1 {
				t.Fatalf("the log does not show the repeat (attempt 2 executed); log:\n%s", lg.dump())
			}
		})

		t.Run("throw_after_send_reconciled/"+p.String(), func(t *testing.T) {
			t.Parallel()
			src, pub := h.New(t, 30*time.Second)
			var fx effects
			var lg logs
			obs := observe(src)
			l := idem.New(h.store(t), idem.WithPolicy(p), idem.WithLogger(lg.logger()))
			// The hook asks "the mail provider" (fx) whether the mail went out.
			hook := idem.WithReconcile(func(_ context.Context, lp idem.Lapsed) ([]byte, bool, error) {
				return []byte("found in the provider's log"), fx.of("receipt:order-1") > 0, nil
			})
			c := newConsumer(t, obs, l, func(_ context.Context, m queue.Message) ([]byte, error) {
				fx.do("receipt:order-1")
				return nil, errAfterSend
			}, append(fast(&lg), queue.WithCallOptions(func(queue.Message) []idem.CallOption { return []idem.CallOption{hook} }))...)
			publish(t, pub, queue.Outgoing{Body: []byte("order-1 alice@example.com")})
			stop := runConsumer(t, c)
			eventually(t, 30*time.Second, "the message was not acked after the Reconcile hook found the effect", func() bool { return obs.count("ack") == 1 })
			stop()
			if n := fx.of("receipt:order-1"); n != 1 {
				t.Fatalf("%d effects, want 1: the Reconcile hook found the first", n)
			}
			if got := lg.find(map[string]string{"msg": "queue message reconciled"}); len(got) != 1 {
				t.Fatalf("the log does not say the effect was reconciled; log:\n%s", lg.dump())
			}
		})

		t.Run("two_consumers_at_once/"+p.String(), func(t *testing.T) {
			t.Parallel()
			src, pub := h.New(t, 30*time.Second)
			st := h.store(t)
			var fx effects
			var lg logs
			obs := observe(src)
			handler := func(_ context.Context, m queue.Message) ([]byte, error) {
				time.Sleep(300 * time.Millisecond) // both consumers are on the message now
				fx.do("receipt:order-1")
				return []byte("sent"), nil
			}
			a := newConsumer(t, obs, idem.New(st, idem.WithPolicy(p), idem.WithOwner("consumer-a"), idem.WithLease(seedLease)), handler, fast(&lg)...)
			b := newConsumer(t, obs, idem.New(st, idem.WithPolicy(p), idem.WithOwner("consumer-b"), idem.WithLease(seedLease)), handler, fast(&lg)...)
			// Two copies of one message (a producer retry, an SQS standard
			// duplicate) held by two consumers at the same time.
			publish(t, pub, queue.Outgoing{Body: []byte("order-1 alice@example.com")})
			publish(t, pub, queue.Outgoing{Body: []byte("order-1 alice@example.com")})
			ds := receiveAll(t, obs, 2, 10*time.Second)
			var wg sync.WaitGroup
			for i, c := range []*queue.Consumer{a, b} {
				wg.Add(1)
				go func() { defer wg.Done(); c.HandleBatch(context.Background(), ds[i:i+1]) }()
			}
			wg.Wait()
			if n := fx.of("receipt:order-1"); n != 1 {
				t.Fatalf("two consumers on the same message at once: %d effects, want 1; log:\n%s", n, lg.dump())
			}
			// The busy copy was handed back; a consumer finds it done.
			stop := runConsumer(t, a)
			eventually(t, 30*time.Second, "both copies were not acked", func() bool { return obs.count("ack") == 2 })
			stop()
			if n := fx.of("receipt:order-1"); n != 1 {
				t.Fatalf("after the busy copy's redelivery: %d effects, want 1; log:\n%s", n, lg.dump())
			}
			if got := lg.find(map[string]string{"msg": "queue message busy"}); len(got) != 1 {
				t.Fatalf("want one busy line for the copy that met the running attempt; log:\n%s", lg.dump())
			}
		})
	}

	t.Run("two_consumers_same_delivery", func(t *testing.T) {
		t.Parallel()
		src, pub := h.New(t, lapse)
		if src.Visibility() == 0 {
			t.Skip("the broker has no visibility timeout: it never hands a held message to a second consumer")
		}
		st := h.store(t)
		var fx effects
		var lg logs
		obs := observe(src)
		release := make(chan struct{})
		handler := func(ctx context.Context, m queue.Message) ([]byte, error) {
			if m.ReceiveCount == 1 {
				<-release // consumer A is slow: its visibility lapses
			}
			fx.do("receipt:order-1")
			return []byte("sent"), nil
		}
		opts := append(fast(&lg), queue.WithHandlerTimeout(src.Visibility()), queue.WithExtendEvery(time.Hour))
		// A short lease (seedLease): B's retry of the busy key comes soon
		// after A ends.
		a := newConsumer(t, obs, idem.New(st, idem.WithOwner("consumer-a"), idem.WithLease(seedLease)), handler, opts...)
		b := newConsumer(t, obs, idem.New(st, idem.WithOwner("consumer-b"), idem.WithLease(seedLease)), handler, opts...)
		publish(t, pub, queue.Outgoing{Body: []byte("order-1 alice@example.com")})
		d1 := receiveOne(t, obs, 10*time.Second)
		done := make(chan struct{})
		go func() { defer close(done); a.HandleBatch(context.Background(), []queue.Delivery{d1}) }()
		d2 := receiveOne(t, obs, src.Visibility()+10*time.Second) // the same message, to B
		b.HandleBatch(context.Background(), []queue.Delivery{d2})
		close(release)
		<-done
		if n := fx.of("receipt:order-1"); n != 1 {
			t.Fatalf("two consumers on one delivery: %d effects, want 1; log:\n%s", n, lg.dump())
		}
		stop := runConsumer(t, b)
		eventually(t, 30*time.Second, "the message was never acked", func() bool { return obs.count("ack") >= 1 })
		stop()
		receiveNone(t, src, src.Visibility()+time.Second, "after the message was acked")
		if n := fx.of("receipt:order-1"); n != 1 {
			t.Fatalf("after settling: %d effects, want 1; log:\n%s", n, lg.dump())
		}
	})
}
