package outbox_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/queue"
)

// TestFIFOGroupOrder: the messages of a FIFO group reach the target in the
// order they were written, one at a time, although a publish in the middle
// of one group fails and is retried and other groups go on in parallel.
func TestFIFOGroupOrder(t *testing.T) {
	a := openApp(t, "", 30*time.Second)
	tg := openTarget(t, "")
	want := map[string][]string{}
	for i := range 5 {
		for _, g := range []string{"alice", "bob", "carol"} {
			id := fmt.Sprintf("%s-%d", g, i)
			a.placeOrder(t, id, true, inGroup(g))
			want[g] = append(want[g], "order placed "+id)
		}
	}
	rec := &recorder{to: tg.q, fail: func(m queue.Outgoing, n int) error {
		if string(m.Body) == "order placed bob-2" && n == 1 {
			return errors.New("target: timeout")
		}
		return nil
	}}
	r, err := outbox.NewRelay(a.outbox, rec, outbox.WithConcurrency(3),
		outbox.WithBackoff(50*time.Millisecond, 100*time.Millisecond), outbox.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	if n := drainUntilEmpty(t, r, a.outbox); n != 15 {
		t.Fatalf("relayed %d, want 15", n)
	}
	published := map[string][]string{}
	for _, c := range rec.published() {
		published[c.m.GroupID] = append(published[c.m.GroupID], string(c.m.Body))
	}
	atTarget := map[string][]string{}
	for _, m := range received(t, tg.q) {
		atTarget[m.GroupID] = append(atTarget[m.GroupID], string(m.Body))
	}
	for g, w := range want {
		if !slices.Equal(published[g], w) {
			t.Errorf("group %s published in the order %v, want %v", g, published[g], w)
		}
		if !slices.Equal(atTarget[g], w) {
			t.Errorf("group %s received at the target in the order %v, want %v", g, atTarget[g], w)
		}
	}
}
