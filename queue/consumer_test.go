package queue_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/memqueue"
	"github.com/idemkit/idem/store/memstore"
)

func noop(context.Context, queue.Message) ([]byte, error) { return nil, nil }

func TestNewConsumerChecks(t *testing.T) {
	l := idem.New(memstore.New())
	q := memqueue.New(memqueue.WithVisibility(time.Minute))
	if _, err := queue.NewConsumer(nil, l, queue.MessageIDKey("m"), noop); err == nil {
		t.Fatal("NewConsumer(nil source): no error")
	}
	if _, err := queue.NewConsumer(q, l, nil, noop); err == nil {
		t.Fatal("NewConsumer(nil key func): no error")
	}
	_, err := queue.NewConsumer(q, l, queue.MessageIDKey("m"), noop, queue.WithHandlerTimeout(2*time.Minute))
	if !errors.Is(err, queue.ErrVisibilityTooShort) || !strings.Contains(err.Error(), "1m0s") {
		t.Fatalf("visibility 1m, handler timeout 2m: %v, want ErrVisibilityTooShort naming both", err)
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	if _, err := queue.NewConsumer(q, l, queue.MessageIDKey("m"), noop, queue.WithHandlerTimeout(20*time.Second), queue.WithLogger(log)); err != nil {
		t.Fatalf("visibility 1m, handler timeout 20s: %v", err)
	}
	if !strings.Contains(buf.String(), "six times") {
		t.Fatalf("visibility under 6x the handler timeout: no warning; log: %s", buf.String())
	}
	buf.Reset()
	if _, err := queue.NewConsumer(q, l, queue.MessageIDKey("m"), noop, queue.WithHandlerTimeout(10*time.Second), queue.WithLogger(log)); err != nil || buf.Len() != 0 {
		t.Fatalf("visibility 1m = 6x the handler timeout: err %v, log %q; want neither", err, buf.String())
	}
}

func TestMessageIDKey(t *testing.T) {
	k, err := queue.MessageIDKey("sqs")(queue.Message{ID: "a:b"})
	if err != nil || k != idem.Key("sqs", "a:b") {
		t.Fatalf("MessageIDKey(sqs)(a:b) = %v, %v; want Key(sqs, a:b)", k, err)
	}
	if _, err := queue.MessageIDKey("sqs")(queue.Message{}); err == nil {
		t.Fatal("MessageIDKey of a message without id: no error")
	}
}

func TestUndecodable(t *testing.T) {
	base := errors.New("bad json")
	err := queue.Undecodable(base)
	if !errors.Is(err, queue.ErrUndecodable) || !errors.Is(err, base) {
		t.Fatalf("Undecodable(%v) = %v: want it to be ErrUndecodable and the original", base, err)
	}
	if queue.Undecodable(nil) != nil {
		t.Fatal("Undecodable(nil) != nil")
	}
}

// A handler that cannot decode its message did nothing: the message is
// dead-lettered and its key released, under AtMostOnce too (not left
// indeterminate), so the message redriven after a fix runs.
func TestUndecodableFromHandlerReleasesTheKey(t *testing.T) {
	store := memstore.New()
	q := memqueue.New()
	l := idem.New(store, idem.WithPolicy(idem.AtMostOnce), idem.WithLogger(slog.New(slog.DiscardHandler)))
	c, err := queue.NewConsumer(q, l, queue.MessageIDKey("m"), func(context.Context, queue.Message) ([]byte, error) {
		return nil, queue.Undecodable(errors.New("unexpected end of JSON input"))
	}, queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	p, err := q.Publish(context.Background(), queue.Outgoing{Body: []byte("{")})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := q.Receive(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	c.HandleBatch(context.Background(), ds)
	if dl := q.DeadLetters(); len(dl) != 1 {
		t.Fatalf("%d dead letters, want the message", len(dl))
	}
	rec, err := store.Get(context.Background(), idem.Key("m", p.ID).String())
	if err != nil || rec.Status != idem.StatusReleased {
		t.Fatalf("record %+v, %v; want released", rec, err)
	}
}

// A panicking handler does not take the consumer down: the message is
// retried, and the next delivery succeeds.
func TestHandlerPanicIsRetried(t *testing.T) {
	q := memqueue.New()
	var calls atomic.Int32
	c, err := queue.NewConsumer(q, idem.New(memstore.New()), queue.MessageIDKey("m"), func(context.Context, queue.Message) ([]byte, error) {
		if calls.Add(1) == 1 {
			panic("nil map")
		}
		return nil, nil
	}, queue.WithBackoff(time.Millisecond, time.Millisecond), queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Publish(context.Background(), queue.Outgoing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ready, held := q.Len()
		if ready+held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("message not done after a panic and a retry: ready %d held %d, calls %d", ready, held, calls.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("handler calls %d, want 2 (the panic, then the retry)", n)
	}
}

// HandleBatch under a context with a deadline (a Lambda invocation) bounds
// the ledger lease by it: a worker killed at the deadline leaves the key to
// the next delivery soon after, not a whole default lease later.
func TestHandleBatchBoundsLeaseByDeadline(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ledger  []idem.Option
		perCall []idem.CallOption
	}{
		{"ledger lease 1h", []idem.Option{idem.WithLease(time.Hour)}, nil},
		// A longer lease from WithCallOptions is bounded as well.
		{"call lease 1h", []idem.Option{idem.WithLease(10 * time.Second)}, []idem.CallOption{idem.WithLease(time.Hour)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := memstore.New()
			q := memqueue.New()
			l := idem.New(store, append(tc.ledger, idem.WithLogger(slog.New(slog.DiscardHandler)))...)
			var leaseLeft time.Duration
			c, err := queue.NewConsumer(q, l, queue.MessageIDKey("m"), func(ctx context.Context, m queue.Message) ([]byte, error) {
				//idem:allow deliveryid the key MessageIDKey("m") gave this message
				rec, err := store.Get(ctx, idem.Key("m", m.ID).String())
				if err != nil {
					return nil, err
				}
				leaseLeft = time.Until(rec.LeaseUntil)
				return nil, nil
			}, queue.WithLogger(slog.New(slog.DiscardHandler)),
				queue.WithCallOptions(func(queue.Message) []idem.CallOption { return tc.perCall }))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := q.Publish(context.Background(), queue.Outgoing{Body: []byte("x")}); err != nil {
				t.Fatal(err)
			}
			ds, err := q.Receive(context.Background(), 10)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			c.HandleBatch(ctx, ds)
			if leaseLeft <= 0 || leaseLeft > 21*time.Second {
				t.Fatalf("lease left while the handler ran: %v, want at most the 20s to the deadline", leaseLeft)
			}
			if ready, held := q.Len(); ready+held != 0 {
				t.Fatalf("after HandleBatch: ready %d held %d, want the message acked", ready, held)
			}
		})
	}
}

// The bound holds for the heartbeats too: a handler that runs most of the
// invocation does not leave the key busy past the deadline.
func TestHandleBatchHeartbeatsStopAtDeadline(t *testing.T) {
	store := memstore.New()
	q := memqueue.New()
	l := idem.New(store, idem.WithLease(time.Hour), idem.WithLogger(slog.New(slog.DiscardHandler)))
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	deadline, _ := ctx.Deadline()
	var leaseUntil time.Time
	c, err := queue.NewConsumer(q, l, queue.MessageIDKey("m"), func(_ context.Context, m queue.Message) ([]byte, error) {
		time.Sleep(time.Until(deadline) - 300*time.Millisecond) // heartbeats run meanwhile
		//idem:allow deliveryid the key MessageIDKey("m") gave this message
		rec, err := store.Get(context.Background(), idem.Key("m", m.ID).String())
		leaseUntil = rec.LeaseUntil
		return nil, err
	}, queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Publish(context.Background(), queue.Outgoing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	ds, err := q.Receive(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	c.HandleBatch(ctx, ds)
	if over := leaseUntil.Sub(deadline); leaseUntil.IsZero() || over > 100*time.Millisecond {
		t.Fatalf("lease held until %v past the invocation's deadline (read: %v)", over, !leaseUntil.IsZero())
	}
}

// A ledger store that fails is never read as "done": a message whose claim
// failed is retried, not acked, and once the store answers again the effect
// happens exactly once. A completion whose answer was lost after it
// committed is retried by the ledger, which finds it recorded: the first
// delivery is acked, with one effect.
func TestStoreFaultsAreRetriedNotAcked(t *testing.T) {
	for _, tc := range []struct {
		name  string
		op    idemtest.Op
		fault idemtest.Fault
		acked bool // the first delivery
		want  int  // effects
	}{
		{"claim_unreachable", idemtest.OpClaim, idemtest.Fault{Err: errors.New("dial tcp: connection refused"), Times: 2}, false, 1},
		{"complete_answer_lost", idemtest.OpComplete, idemtest.Fault{Err: errors.New("i/o timeout"), After: true, Times: 1}, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := idemtest.NewFaultStore(memstore.New())
			fs.Inject(tc.op, tc.fault)
			q := memqueue.New()
			var effects, acks atomic.Int32
			c, err := queue.NewConsumer(q, idem.New(fs, idem.WithLogger(slog.New(slog.DiscardHandler))), queue.MessageIDKey("m"),
				func(context.Context, queue.Message) ([]byte, error) { effects.Add(1); return nil, nil },
				queue.WithBackoff(time.Millisecond, 5*time.Millisecond), queue.WithMaxReceives(0), queue.WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				t.Fatal(err)
			}
			pub, err := q.Publish(context.Background(), queue.Outgoing{Body: []byte("x")})
			if err != nil {
				t.Fatal(err)
			}
			ds, err := q.Receive(context.Background(), 1)
			if err != nil {
				t.Fatal(err)
			}
			first := &countingDelivery{Delivery: ds[0], acks: &acks}
			c.HandleBatch(context.Background(), []queue.Delivery{first})
			if got := acks.Load() == 1; got != tc.acked {
				t.Fatalf("the first delivery acked: %v, want %v (%s failed)", got, tc.acked, tc.op)
			}
			// Redeliveries until the store answers: then exactly one effect.
			deadline := time.Now().Add(10 * time.Second)
			for {
				ready, held := q.Len()
				if ready+held == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("message %s never done: ready %d held %d", pub.ID, ready, held)
				}
				ds, err := q.Receive(context.Background(), 1)
				if err != nil {
					t.Fatal(err)
				}
				c.HandleBatch(context.Background(), ds)
			}
			if n := effects.Load(); int(n) != tc.want {
				t.Fatalf("effects %d, want %d", n, tc.want)
			}
		})
	}
}

type countingDelivery struct {
	queue.Delivery
	acks *atomic.Int32
}

func (d *countingDelivery) Ack(ctx context.Context) error {
	d.acks.Add(1)
	return d.Delivery.Ack(ctx)
}

// greedySource returns every ready message, whatever max says.
type greedySource struct{ *memqueue.Queue }

func (g greedySource) Receive(ctx context.Context, max int) ([]queue.Delivery, error) {
	return g.Queue.Receive(ctx, 100)
}

// A source that hands out more than asked does not stall the consumer: the
// extra messages wait for a free slot.
func TestSourceReturningMoreThanAsked(t *testing.T) {
	q := memqueue.New()
	for i := range 7 {
		q.Publish(context.Background(), queue.Outgoing{Body: []byte{byte('a' + i)}})
	}
	var calls atomic.Int32
	c, err := queue.NewConsumer(greedySource{q}, idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler))), queue.MessageIDKey("m"),
		func(context.Context, queue.Message) ([]byte, error) {
			calls.Add(1)
			time.Sleep(5 * time.Millisecond)
			return nil, nil
		},
		queue.WithConcurrency(2), queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for calls.Load() < 7 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if n := calls.Load(); n != 7 {
		t.Fatalf("handled %d of 7 messages", n)
	}
}

// A copy of a message whose key another worker is still running is not
// dead-lettered for running out of receives while it waits: the ledger is
// asked, and once the key is done the copy is acked as a replay.
func TestBusyCopyOutlivesMaxReceives(t *testing.T) {
	q := memqueue.New()
	store := memstore.New()
	release := make(chan struct{})
	var calls atomic.Int32
	c, err := queue.NewConsumer(q, idem.New(store, idem.WithLogger(slog.New(slog.DiscardHandler))),
		func(m queue.Message) (idem.OperationKey, error) { return idem.Key("order", string(m.Body)), nil },
		func(context.Context, queue.Message) ([]byte, error) {
			calls.Add(1)
			<-release
			return nil, nil
		}, queue.WithMaxReceives(2), queue.WithBusyDelay(10*time.Millisecond), queue.WithConcurrency(4), queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	q.Publish(context.Background(), queue.Outgoing{Body: []byte("42")})
	q.Publish(context.Background(), queue.Outgoing{Body: []byte("42")})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	time.Sleep(300 * time.Millisecond) // the copy is retried well past two receives
	close(release)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ready, held := q.Len(); ready+held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the messages were not settled")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if dl := q.DeadLetters(); len(dl) != 0 {
		t.Fatalf("dead letters %+v, want none: the copy waited for a running key", dl)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// A key function that panics dead-letters the message instead of crashing
// the process.
func TestKeyFuncPanicDeadLetters(t *testing.T) {
	q := memqueue.New()
	c, err := queue.NewConsumer(q, idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler))),
		func(m queue.Message) (idem.OperationKey, error) { var parts []string; return idem.Key(parts[3]), nil },
		noop, queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	q.Publish(context.Background(), queue.Outgoing{Body: []byte("x")})
	ds, _ := q.Receive(context.Background(), 1)
	c.HandleBatch(context.Background(), ds)
	if dl := q.DeadLetters(); len(dl) != 1 || !strings.Contains(dl[0].Reason, "panic") {
		t.Fatalf("dead letters %+v, want the message with a reason naming the panic", dl)
	}
}

// An Ack that fails after the ledger completed the key (the broker went
// away mid-call) leaves the message with the broker, not lost and not
// read as "not done": it comes back, and its redelivery is a replay of the
// stored result, acked without running the handler again.
func TestAckFailureAfterCompletionIsReplayed(t *testing.T) {
	q := memqueue.New(memqueue.WithVisibility(300 * time.Millisecond))
	var logs bytes.Buffer
	var effects atomic.Int32
	c, err := queue.NewConsumer(q, idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler))), queue.MessageIDKey("m"),
		func(context.Context, queue.Message) ([]byte, error) { effects.Add(1); return []byte("done"), nil },
		queue.WithHandlerTimeout(50*time.Millisecond), queue.WithLogger(slog.New(slog.NewJSONHandler(&logs, debugLevel))))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Publish(context.Background(), queue.Outgoing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	ds, err := q.Receive(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	c.HandleBatch(context.Background(), []queue.Delivery{cutAck{ds[0]}})
	if n := effects.Load(); n != 1 {
		t.Fatalf("effects %d after the first delivery, want 1", n)
	}
	if !strings.Contains(logs.String(), `"settle_error":"broker connection cut"`) {
		t.Fatalf("the failed ack is not logged with its error:\n%s", logs.String())
	}
	if ready, held := q.Len(); ready+held != 1 {
		t.Fatalf("ready %d held %d after a failed ack, want the message still queued", ready, held)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ds, err = q.Receive(ctx, 1) // after the visibility lapses
	if err != nil {
		t.Fatal(err)
	}
	if rc := ds[0].Message().ReceiveCount; rc != 2 {
		t.Fatalf("redelivery receive count %d, want 2", rc)
	}
	logs.Reset()
	c.HandleBatch(context.Background(), ds)
	if n := effects.Load(); n != 1 {
		t.Fatalf("effects %d after the redelivery, want 1 (a replay)", n)
	}
	if !strings.Contains(logs.String(), `"outcome":"replayed"`) || !strings.Contains(logs.String(), `"action":"ack"`) {
		t.Fatalf("the redelivery is not a replay acked:\n%s", logs.String())
	}
	if ready, held := q.Len(); ready+held != 0 {
		t.Fatalf("ready %d held %d after the replay, want the message acked", ready, held)
	}
}

// cutAck is a delivery whose Ack fails without reaching the broker.
type cutAck struct{ queue.Delivery }

func (cutAck) Ack(context.Context) error { return errors.New("broker connection cut") }
