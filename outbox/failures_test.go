package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
)

var errTooBig = errors.New("test: message too large for the target")

// TestPermanentRefusalDeadLetters: a publish the target refuses for good,
// with an error given to WithPermanentErrors, wrapped by idem.Permanent or
// matching queue.ErrRefused (an adapter's refusal, here sqlqueue's),
// dead-letters the outbox message at once with the reason; the other
// messages are relayed.
func TestPermanentRefusalDeadLetters(t *testing.T) {
	a := openApp(t, "", 30*time.Second)
	tg := openTarget(t, "")
	a.placeOrder(t, "big", true)
	a.placeOrder(t, "marked", true)
	a.placeOrder(t, "refused", true)
	a.placeOrder(t, "fine", true)
	rec := &recorder{to: tg.q, fail: func(m queue.Outgoing, _ int) error {
		switch string(m.Body) {
		case "order placed big":
			return fmt.Errorf("target: %w", errTooBig)
		case "order placed marked":
			return idem.Permanent(errors.New("target: bad attribute"))
		case "order placed refused":
			return fmt.Errorf("target: %w: a group id that is not UTF-8", sqlqueue.ErrBadMessage)
		}
		return nil
	}}
	var log testlog.Buffer
	r, err := outbox.NewRelay(a.outbox, rec, outbox.WithPermanentErrors(errTooBig), outbox.WithLogger(debugLog(&log)))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.Drain(t.Context()); err != nil || n != 1 {
		t.Fatalf("Drain = %d, %v; want 1, nil", n, err)
	}
	if st := stats(t, a.outbox); st != (sqlqueue.Stats{Queue: "outbox", DeadLettered: 3}) {
		t.Fatalf("outbox: %+v, want 3 dead letters and nothing else", st)
	}
	dls, err := a.outbox.DeadLetters(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, dl := range dls {
		if !strings.Contains(dl.Reason, "refused the message for good") || dl.Message.ReceiveCount != 1 {
			t.Fatalf("dead letter %q: reason %q after %d receives, want a refusal after 1", dl.Message.Body, dl.Reason, dl.Message.ReceiveCount)
		}
	}
	if got := strings.Count(log.String(), "level=WARN msg=\"outbox message dead-lettered: the target refused it\""); got != 3 {
		t.Fatalf("%d dead letters logged at warn, want 3:\n%s", got, log.String())
	}
	if st := stats(t, tg.q); st.Ready != 1 {
		t.Fatalf("target: %+v, want the one fine message", st)
	}
}

// TestTransientErrorsRetried: a publish that fails with an error not
// marked permanent is retried through the outbox with backoff (the receive
// count grows), then relayed once the target takes it.
func TestTransientErrorsRetried(t *testing.T) {
	a := openApp(t, "", 30*time.Second)
	tg := openTarget(t, "")
	a.placeOrder(t, "o1", true)
	rec := &recorder{to: tg.q, fail: func(_ queue.Outgoing, n int) error {
		if n <= 2 {
			return errors.New("target: connection refused")
		}
		return nil
	}}
	var log testlog.Buffer
	r, err := outbox.NewRelay(a.outbox, rec, outbox.WithBackoff(50*time.Millisecond, 100*time.Millisecond), outbox.WithLogger(debugLog(&log)))
	if err != nil {
		t.Fatal(err)
	}
	if n := drainUntilEmpty(t, r, a.outbox); n != 1 {
		t.Fatalf("relayed %d, want 1", n)
	}
	if got := strings.Count(log.String(), "outbox publish failed: retried"); got != 2 {
		t.Fatalf("%d retries logged, want 2:\n%s", got, log.String())
	}
	if !strings.Contains(log.String(), "receive_count=3 target_id") {
		t.Fatalf("the relayed message's receive count is not 3:\n%s", log.String())
	}
	if !strings.Contains(log.String(), "delay=") {
		t.Fatalf("retries do not log their delay:\n%s", log.String())
	}
	if st := stats(t, tg.q); st.Ready != 1 {
		t.Fatalf("target: %+v, want one message", st)
	}
}

// TestMaxReceivesDeadLetters: with WithMaxReceives, a message whose
// publish keeps failing transiently is dead-lettered on its last receive.
func TestMaxReceivesDeadLetters(t *testing.T) {
	a := openApp(t, "", 30*time.Second)
	tg := openTarget(t, "")
	a.placeOrder(t, "o1", true)
	rec := &recorder{to: tg.q, fail: func(queue.Outgoing, int) error { return errors.New("target: down") }}
	r, err := outbox.NewRelay(a.outbox, rec, outbox.WithMaxReceives(2),
		outbox.WithBackoff(20*time.Millisecond, 40*time.Millisecond), outbox.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	drainUntilEmpty(t, r, a.outbox)
	dls, err := a.outbox.DeadLetters(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || !strings.Contains(dls[0].Reason, "publish failed on receive 2 of at most 2") {
		t.Fatalf("dead letters %+v, want one out of receives", dls)
	}
}

// TestDrainReturnsWhileTheTargetIsDown: Drain tries a message once and
// returns once the target fails, however short the backoff: before, it
// published the same message again each time its backoff ended (56 times
// in 5 s) and returned only when its context did.
func TestDrainReturnsWhileTheTargetIsDown(t *testing.T) {
	a := openApp(t, "", 30*time.Second)
	a.placeOrder(t, "o1", true)
	a.placeOrder(t, "o2", true)
	var calls atomic.Int64
	down := &recorder{fail: func(queue.Outgoing, int) error {
		calls.Add(1)
		return errors.New("target: connection refused")
	}}
	r, err := outbox.NewRelay(a.outbox, down, outbox.WithBackoff(10*time.Millisecond, 100*time.Millisecond), outbox.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	n, err := r.Drain(ctx)
	if err != nil || n != 0 {
		t.Fatalf("Drain = %d, %v; want 0, nil while the target is down (%d publishes)", n, err, calls.Load())
	}
	if c := calls.Load(); c < 1 || c > 2 {
		t.Fatalf("%d publishes in one Drain, want each message tried at most once", c)
	}
}
