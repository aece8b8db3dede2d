package outbox_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/queue/sqlqueue"
)

// TestSQLiteEndToEnd: the application's transaction writes an order and
// its message to the outbox, both or neither; the relay moves every
// committed message to a target queue in another file, with the
// operation key as its dedup id; a consumer with a ledger on the target
// runs each key's effect once; nothing is left in the outbox.
func TestSQLiteEndToEnd(t *testing.T) {
	a := openApp(t, "", 30*time.Second)
	tg := openTarget(t, "")
	for i := range 5 {
		a.placeOrder(t, fmt.Sprint("o", i), true)
	}
	a.placeOrder(t, "rolled-back", false)
	if n := a.orders(t); n != 5 {
		t.Fatalf("%d orders after 5 commits and a rollback, want 5", n)
	}
	if st := stats(t, a.outbox); st.Ready != 5 {
		t.Fatalf("outbox after 5 commits and a rollback: %+v, want 5 ready", st)
	}

	rec := &recorder{to: tg.q}
	r, err := outbox.NewRelay(a.outbox, rec, outbox.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	n, err := r.Drain(t.Context())
	if err != nil || n != 5 {
		t.Fatalf("Drain = %d, %v; want 5, nil", n, err)
	}
	if st := stats(t, a.outbox); st != (sqlqueue.Stats{Queue: "outbox"}) {
		t.Fatalf("outbox after the relay: %+v, want empty", st)
	}
	for _, c := range rec.published() {
		key := c.m.Attributes[outbox.KeyAttribute]
		if c.m.DedupID == "" || c.m.DedupID != key || c.p.Duplicate {
			t.Fatalf("published %+v -> %+v: want the key as dedup id, not a duplicate", c.m, c.p)
		}
	}
	if st := stats(t, tg.q); st.Ready != 5 {
		t.Fatalf("target after the relay: %+v, want 5 ready", st)
	}

	effects := tg.consume(t)
	if len(effects) != 5 {
		t.Fatalf("effects %v, want one for each of 5 orders", effects)
	}
	for i := range 5 {
		if k := idem.Key("order-placed", fmt.Sprint("o", i)).String(); effects[k] != 1 {
			t.Fatalf("effect of %s ran %d times, want 1 (%v)", k, effects[k], effects)
		}
	}
	if effects[idem.Key("order-placed", "rolled-back").String()] != 0 {
		t.Fatal("the rolled-back order's message reached the consumer")
	}
}
