package queuetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
)

var errFlaky = errors.New("queuetest: provider timed out")

// bodyKey keys a message by its body's first word ("order-7 ..." → order-7):
// the business id, shared by every copy of the message.
func bodyKey(m queue.Message) (idem.OperationKey, error) {
	id, _, _ := strings.Cut(string(m.Body), " ")
	if id == "" || id == "garbage" {
		return idem.OperationKey{}, fmt.Errorf("no order id in %q", m.Body)
	}
	return idem.Key("receipt", id), nil
}

// fast are consumer options that keep the suite quick: short backoff and
// busy delay, and a lease short enough for a retried busy key to find the
// first attempt finished.
func fast(l *logs) []queue.Option {
	return []queue.Option{
		queue.WithBackoff(20*time.Millisecond, 200*time.Millisecond),
		queue.WithBusyDelay(100 * time.Millisecond),
		queue.WithHandlerTimeout(5 * time.Second),
		queue.WithShutdownTimeout(5 * time.Second),
		queue.WithLogger(l.logger()),
	}
}

func newConsumer(t *testing.T, src queue.Source, l *idem.Ledger, h queue.Handler, opts ...queue.Option) *queue.Consumer {
	t.Helper()
	c, err := queue.NewConsumer(src, l, bodyKey, h, opts...)
	if err != nil {
		t.Fatalf("NewConsumer: %v", err)
	}
	return c
}

// testConsumer checks how the Consumer maps outcomes to the broker.
func testConsumer(t *testing.T, h Harness) {
	t.Run("once_per_key_then_ack", func(t *testing.T) {
		t.Parallel()
		src, pub := h.New(t, 30*time.Second)
		var fx effects
		var lg logs
		obs := observe(src)
		l := idem.New(h.store(t), idem.WithLogger(lg.logger()))
		c := newConsumer(t, obs, l, func(_ context.Context, m queue.Message) ([]byte, error) {
			k, _ := bodyKey(m)
			fx.do(k.String())
			return []byte("sent " + string(m.Body)), nil
		}, fast(&lg)...)
		for i := range 5 {
			publish(t, pub, queue.Outgoing{Body: fmt.Appendf(nil, "order-%d", i)})
		}
		publish(t, pub, queue.Outgoing{Body: []byte("order-3")}) // a duplicate the broker delivers
		stop := runConsumer(t, c)
		eventually(t, 30*time.Second, "not every message was acked", func() bool { return obs.count("ack") == 6 })
		stop()
		if keys, total := fx.distinct(); keys != 5 || total != 5 {
			t.Fatalf("effects: %d keys, %d in all; want 5 and 5", keys, total)
		}
		if got := lg.find(map[string]string{"outcome": "replayed", "action": "ack"}); len(got) != 1 {
			t.Fatalf("%d replayed-and-acked lines, want 1 (the duplicate order-3); log:\n%s", len(got), lg.dump())
		}
		receiveNone(t, src, 300*time.Millisecond, "after the consumer acked everything")
	})

	t.Run("refuses_visibility_shorter_than_handler_timeout", func(t *testing.T) {
		t.Parallel()
		src, _ := h.New(t, lapse)
		if src.Visibility() == 0 {
			t.Skip("the broker has no visibility timeout")
		}
		l := idem.New(h.store(t))
		_, err := queue.NewConsumer(src, l, bodyKey, func(context.Context, queue.Message) ([]byte, error) { return nil, nil },
			queue.WithHandlerTimeout(src.Visibility()+time.Second))
		if !errors.Is(err, queue.ErrVisibilityTooShort) {
			t.Fatalf("NewConsumer with a handler timeout over the visibility: %v, want ErrVisibilityTooShort", err)
		}
	})

	t.Run("retryable_error_retried_until_done", func(t *testing.T) {
		t.Parallel()
		src, pub := h.New(t, 30*time.Second)
		var calls atomic.Int32
		var counts []int
		var mu sync.Mutex
		var lg logs
		obs := observe(src)
		c := newConsumer(t, obs, idem.New(h.store(t)), func(_ context.Context, m queue.Message) ([]byte, error) {
			mu.Lock()
			counts = append(counts, m.ReceiveCount)
			mu.Unlock()
			if calls.Add(1) < 3 {
				return nil, errFlaky
			}
			return nil, nil
		}, append(fast(&lg), queue.WithMaxReceives(5))...)
		publish(t, pub, queue.Outgoing{Body: []byte("order-1")})
		stop := runConsumer(t, c)
		eventually(t, 30*time.Second, "the message was never acked", func() bool { return obs.count("ack") == 1 })
		stop()
		mu.Lock()
		defer mu.Unlock()
		if len(counts) != 3 || counts[0] != 1 || counts[2] < 3 {
			t.Fatalf("handler saw receive counts %v, want 3 calls counting up from 1", counts)
		}
		if got := lg.find(map[string]string{"outcome": "retried", "action": "retry"}); len(got) != 2 {
			t.Fatalf("%d retried lines, want 2; log:\n%s", len(got), lg.dump())
		}
	})

	t.Run("max_receives_dead_letters", func(t *testing.T) {
		t.Parallel()
		if !h.Features.DeadLetter {
			t.Skip("the adapter declares no dead-letter destination")
		}
		src, pub := h.New(t, 30*time.Second)
		var lg logs
		var calls atomic.Int32
		c := newConsumer(t, src, idem.New(h.store(t)), func(context.Context, queue.Message) ([]byte, error) {
			calls.Add(1)
			return nil, errFlaky
		}, append(fast(&lg), queue.WithMaxReceives(2))...)
		publish(t, pub, queue.Outgoing{Body: []byte("order-1")})
		stop := runConsumer(t, c)
		var dl []DeadLetter
		eventually(t, 30*time.Second, "the failing message was never dead-lettered", func() bool {
			dl = h.DeadLetters(t, src)
			return len(dl) == 1
		})
		stop()
		if n := calls.Load(); n != 2 {
			t.Fatalf("handler ran %d times, want 2 (the maximum receives)", n)
		}
		if dl[0].Reason != "" && !strings.Contains(dl[0].Reason, errFlaky.Error()) {
			t.Fatalf("dead-letter reason %q, want it to name the last error", dl[0].Reason)
		}
	})

	t.Run("permanent_and_undecodable_dead_lettered", func(t *testing.T) {
		t.Parallel()
		if !h.Features.DeadLetter {
			t.Skip("the adapter declares no dead-letter destination")
		}
		src, pub := h.New(t, 30*time.Second)
		var lg logs
		var calls atomic.Int32
		c := newConsumer(t, src, idem.New(h.store(t)), func(_ context.Context, m queue.Message) ([]byte, error) {
			calls.Add(1)
			return nil, idem.Permanent(errors.New("card declined"))
		}, fast(&lg)...)
		publish(t, pub, queue.Outgoing{Body: []byte("order-9")})
		publish(t, pub, queue.Outgoing{Body: []byte("garbage")})
		stop := runConsumer(t, c)
		eventually(t, 30*time.Second, "the two messages were not dead-lettered", func() bool { return len(h.DeadLetters(t, src)) == 2 })
		// A redelivery of the failed key replays the failure without the handler.
		publish(t, pub, queue.Outgoing{Body: []byte("order-9 again")})
		eventually(t, 30*time.Second, "the copy of the failed message was not dead-lettered", func() bool { return len(h.DeadLetters(t, src)) == 3 })
		stop()
		if n := calls.Load(); n != 1 {
			t.Fatalf("handler ran %d times, want 1 (the undecodable message and the replayed failure never reach it)", n)
		}
		reasons := ""
		for _, d := range h.DeadLetters(t, src) {
			reasons += d.Reason + "\n"
		}
		if h.DeadLetters(t, src)[0].Reason != "" && (!strings.Contains(reasons, "card declined") || !strings.Contains(reasons, "undecodable")) {
			t.Fatalf("dead-letter reasons:\n%s\nwant the permanent error and undecodable", reasons)
		}
	})

	t.Run("fifo_failure_holds_only_its_group", func(t *testing.T) {
		t.Parallel()
		if !h.Features.FIFO {
			t.Skip("the broker has no FIFO groups")
		}
		src, pub := h.New(t, 30*time.Second)
		var lg logs
		var mu sync.Mutex
		var order []string
		failedOnce := false
		c := newConsumer(t, src, idem.New(h.store(t)), func(_ context.Context, m queue.Message) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, string(m.Body))
			if string(m.Body) == "a0" && !failedOnce {
				failedOnce = true
				return nil, errFlaky
			}
			return nil, nil
		}, append(fast(&lg), queue.WithBackoff(time.Second, time.Second))...)
		for i := range 3 {
			publish(t, pub, queue.Outgoing{Body: fmt.Appendf(nil, "a%d", i), GroupID: "a", DedupID: fmt.Sprintf("a%d", i)})
			publish(t, pub, queue.Outgoing{Body: fmt.Appendf(nil, "b%d", i), GroupID: "b", DedupID: fmt.Sprintf("b%d", i)})
		}
		stop := runConsumer(t, c)
		eventually(t, 30*time.Second, "not every message was handled", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(order) == 7
		})
		stop()
		mu.Lock()
		defer mu.Unlock()
		var a, b []string
		for _, s := range order {
			if s[0] == 'a' {
				a = append(a, s)
			} else {
				b = append(b, s)
			}
		}
		if !slices.Equal(a, []string{"a0", "a0", "a1", "a2"}) || !slices.Equal(b, []string{"b0", "b1", "b2"}) {
			t.Fatalf("handled %q: group a %q, want a0 a0 a1 a2; group b %q, want b0 b1 b2", order, a, b)
		}
		first := slices.Index(order, "a0")
		if second := first + 1 + slices.Index(order[first+1:], "a0"); slices.Index(order, "b2") > second {
			t.Fatalf("handled %q: group b waited for a0's retry; a failure must hold back only its own group", order)
		}
	})

	t.Run("extends_while_running", func(t *testing.T) {
		t.Parallel()
		src, pub := h.New(t, lapse)
		if src.Visibility() == 0 {
			t.Skip("the broker has no visibility timeout")
		}
		var lg logs
		obs := observe(src)
		var runs atomic.Int32
		// Extensions every tenth of the visibility, so that two land while
		// the handler runs even when a loaded machine delays some of them.
		c := newConsumer(t, obs, idem.New(h.store(t)), func(context.Context, queue.Message) ([]byte, error) {
			runs.Add(1)
			time.Sleep(src.Visibility() * 9 / 10)
			return nil, nil
		}, append(fast(&lg), queue.WithHandlerTimeout(src.Visibility()), queue.WithExtendEvery(src.Visibility()/10))...)
		publish(t, pub, queue.Outgoing{Body: []byte("order-1")})
		stop := runConsumer(t, c)
		eventually(t, 30*time.Second, "the message was never acked", func() bool { return obs.count("ack") == 1 })
		stop()
		if n := obs.count("extend"); n < 2 {
			t.Fatalf("the delivery was extended %d times while the handler ran, want at least 2", n)
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("the handler ran %d times: the message reappeared while it ran", n)
		}
	})

	t.Run("shutdown_hands_back_unfinished", func(t *testing.T) {
		t.Parallel()
		src, pub := h.New(t, 30*time.Second)
		var lg logs
		obs := observe(src)
		started := make(chan struct{}, 1)
		c := newConsumer(t, obs, idem.New(h.store(t)), func(ctx context.Context, m queue.Message) ([]byte, error) {
			started <- struct{}{}
			<-ctx.Done() // a handler that only stops when cancelled
			return nil, idem.NotDone(ctx.Err())
		}, append(fast(&lg), queue.WithShutdownTimeout(200*time.Millisecond))...)
		publish(t, pub, queue.Outgoing{Body: []byte("order-1")})
		stop := runConsumer(t, c)
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("the handler never started")
		}
		stop() // cancel Run: the handler outlives the shutdown timeout
		if n := obs.count("ack"); n != 0 {
			t.Fatalf("%d acks after a shutdown that cut the handler short, want 0", n)
		}
		if n := obs.count("retry"); n != 1 {
			t.Fatalf("%d messages handed back at shutdown, want 1; log:\n%s", n, lg.dump())
		}
		d := receiveOne(t, src, 15*time.Second)
		if string(d.Message().Body) != "order-1" {
			t.Fatalf("after shutdown received %q, want order-1 back", d.Message().Body)
		}
		settle(t, "Ack", d.Ack(context.Background()))
	})
}
