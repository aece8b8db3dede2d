package outbox_test

import (
	"testing"
	"time"

	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/queue"
)

// TestDelayedMessage: a delayed outbox message is relayed when it falls
// due, and published for delivery at once, not delayed a second time.
func TestDelayedMessage(t *testing.T) {
	a := openApp(t, "", 30*time.Second)
	tg := openTarget(t, "")
	const delay = 500 * time.Millisecond
	a.placeOrder(t, "later", true, func(m *queue.Outgoing) { m.Delay = delay })
	written := time.Now()
	r, err := outbox.NewRelay(a.outbox, tg.q, outbox.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.Drain(t.Context()); err != nil || (n != 0 && time.Since(written) < delay) {
		t.Fatalf("Drain before the message is due = %d, %v; want 0", n, err)
	}
	drainUntilEmpty(t, r, a.outbox)
	if st := stats(t, tg.q); st.Ready != 1 || st.Delayed != 0 {
		t.Fatalf("target: %+v, want the message ready at once", st)
	}
}
