package outbox_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/queue/sqlqueue"
)

// TestCrashBetweenPublishAndAck: a relay publishes two messages (one
// written with an operation key, one without, whose dedup id the relay
// derives) and dies before it acks them: its acks fail. The messages stay
// in the outbox and come back when their visibility lapses; a restarted
// relay publishes each again with the same dedup id, the target reports a
// duplicate, and the relay acks it. The target holds one copy of each, and
// the consumer runs each effect once.
func TestCrashBetweenPublishAndAck(t *testing.T) {
	const vis = time.Second
	a := openApp(t, "", vis)
	tg := openTarget(t, "")
	a.placeOrder(t, "o1", true)
	a.placeOrder(t, "o2", true, withoutKey)

	rec := &recorder{to: tg.q}
	var firstLog testlog.Buffer
	doomed, err := outbox.NewRelay(crashingSource{a.outbox}, rec, outbox.WithPublishTimeout(vis/2), outbox.WithLogger(debugLog(&firstLog)))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := doomed.Drain(t.Context()); err != nil || n != 0 {
		t.Fatalf("the doomed relay's Drain = %d, %v; want 0 relayed (its acks failed), nil", n, err)
	}
	if !strings.Contains(firstLog.String(), "its ack failed") {
		t.Fatalf("the failed ack is not logged:\n%s", firstLog.String())
	}
	if st := stats(t, a.outbox); st.InFlight != 2 {
		t.Fatalf("outbox after the crash: %+v, want 2 in flight (published, not acked)", st)
	}
	if st := stats(t, tg.q); st.Ready != 2 {
		t.Fatalf("target after the crash: %+v, want 2 ready", st)
	}

	var log testlog.Buffer
	restarted, err := outbox.NewRelay(a.outbox, rec, outbox.WithPublishTimeout(vis/2), outbox.WithLogger(debugLog(&log)))
	if err != nil {
		t.Fatal(err)
	}
	if n := drainUntilEmpty(t, restarted, a.outbox); n != 2 {
		t.Fatalf("the restarted relay relayed %d, want 2", n)
	}
	calls := rec.published()
	if len(calls) != 4 {
		t.Fatalf("%d publishes, want 4 (each message twice)", len(calls))
	}
	first := map[string]string{} // body → dedup id of the first publish
	for _, c := range calls[:2] {
		if c.p.Duplicate || c.m.DedupID == "" {
			t.Fatalf("first publish %+v -> %+v: want a dedup id and a new message", c.m, c.p)
		}
		first[string(c.m.Body)] = c.m.DedupID
	}
	for _, c := range calls[2:] {
		if !c.p.Duplicate || c.m.DedupID != first[string(c.m.Body)] {
			t.Fatalf("republish %+v -> %+v: want dedup id %q and a duplicate", c.m, c.p, first[string(c.m.Body)])
		}
	}
	if !strings.HasPrefix(first["order placed o2"], outbox.DefaultDedupPrefix) {
		t.Fatalf("derived dedup id %q does not begin with %q", first["order placed o2"], outbox.DefaultDedupPrefix)
	}
	if strings.Count(log.String(), "duplicate=true") != 2 {
		t.Fatalf("the restarted relay does not log two duplicates:\n%s", log.String())
	}
	if st := stats(t, a.outbox); st != (sqlqueue.Stats{Queue: "outbox"}) {
		t.Fatalf("outbox after the restart: %+v, want empty", st)
	}
	if st := stats(t, tg.q); st.Ready != 2 {
		t.Fatalf("target after the restart: %+v, want 2 ready (one copy each)", st)
	}
	// The message written without a key carries its derived dedup id as
	// its key: the consumer (keyed by MessageKey) runs each effect once.
	effects := tg.consume(t)
	if len(effects) != 2 || effects["order-placed:o1"] != 1 || effects[first["order placed o2"]] != 1 {
		t.Fatalf("effects %v, want order-placed:o1 and %s once each", effects, first["order placed o2"])
	}
}
