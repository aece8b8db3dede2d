package sqlqueue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
)

// TestSQLiteConcurrentAcks: acks made at once (which the handle puts
// together into units of its writer) each get their own answer. Of 300
// messages in two queues, 100 were handed out again after their first
// delivery's visibility ran out; all 400 deliveries ack at once. The
// stale ones get ErrReceiptExpired and delete nothing, the others delete
// their message, and a FIFO group's next message becomes visible when its
// head is acked.
func TestSQLiteConcurrentAcks(t *testing.T) {
	for _, gc := range []bool{true, false} {
		t.Run(fmt.Sprintf("groupcommit=%v", gc), func(t *testing.T) {
			ctx := context.Background()
			clock := newFakeClock()
			e := openSQLiteMode(t, "", clock, gc)
			qa := e.queue(t, "a", sqlqueue.WithVisibility(30*time.Second))
			qb := e.queue(t, "b", sqlqueue.WithVisibility(30*time.Second))
			for i := range 150 {
				publish(t, qa, queue.Outgoing{Body: fmt.Appendf(nil, "a%d", i)})
				publish(t, qb, queue.Outgoing{Body: fmt.Appendf(nil, "b%d", i)})
			}
			publish(t, qb, queue.Outgoing{Body: []byte("g1"), GroupID: "g"})
			publish(t, qb, queue.Outgoing{Body: []byte("g2"), GroupID: "g"})

			var stale, fresh []queue.Delivery
			take := func(q *sqlqueue.SQLiteQueue, n int) []queue.Delivery {
				var ds []queue.Delivery
				for len(ds) < n {
					ds = append(ds, receive(t, q, n-len(ds))...)
				}
				return ds
			}
			stale = append(stale, take(qa, 50)...)
			stale = append(stale, take(qb, 50)...)
			clock.Add(31 * time.Second) // the first 100 are visible again
			fresh = append(fresh, take(qa, 150)...)
			fresh = append(fresh, take(qb, 151)...) // with g1; g2 waits behind it
			var head queue.Delivery
			for _, d := range fresh {
				if string(d.Message().Body) == "g1" {
					head = d
				}
				if string(d.Message().Body) == "g2" {
					t.Fatal("g2 was handed out while g1 is in flight")
				}
			}
			if head == nil {
				t.Fatal("g1 was not handed out")
			}

			errs := make([]error, len(stale)+len(fresh))
			all := append(append([]queue.Delivery{}, stale...), fresh...)
			var wg sync.WaitGroup
			for i, d := range all {
				wg.Go(func() { errs[i] = d.Ack(ctx) })
			}
			wg.Wait()
			for i, err := range errs[:len(stale)] {
				if !errors.Is(err, sqlqueue.ErrReceiptExpired) {
					t.Fatalf("stale ack of %s: %v, want ErrReceiptExpired", stale[i].Message().Body, err)
				}
			}
			for i, err := range errs[len(stale):] {
				if err != nil {
					t.Fatalf("ack of %s: %v", fresh[i].Message().Body, err)
				}
			}
			for _, q := range []*sqlqueue.SQLiteQueue{qa, qb} {
				st, err := q.Stats(ctx)
				if err != nil {
					t.Fatal(err)
				}
				want := int64(0)
				if q == qb {
					want = 1 // g2
				}
				if st.InFlight != 0 || st.Ready != want {
					t.Fatalf("queue %s after the acks: %+v, want nothing in flight and %d ready", q.Name(), st, want)
				}
			}
			ds := receive(t, qb, 10) // the ack of g1 woke this receiver
			if len(ds) != 1 || string(ds[0].Message().Body) != "g2" {
				t.Fatalf("after g1's ack: %q, want g2", bodies(ds))
			}
			if err := ds[0].Ack(ctx); err != nil {
				t.Fatal(err)
			}
			// A second ack of an acked delivery is refused, not counted again.
			if err := fresh[0].Ack(ctx); !errors.Is(err, queue.ErrSettled) {
				t.Fatalf("second ack: %v, want ErrSettled", err)
			}
		})
	}
}

// TestSQLiteAckClosed: an ack after Close, or one waiting for the writer
// as the handle closes, gets ErrClosed, never a false nil.
func TestSQLiteAckClosed(t *testing.T) {
	e := openSQLite(t, "", nil)
	q := e.queue(t, "q")
	for i := range 20 {
		publish(t, q, queue.Outgoing{Body: fmt.Appendf(nil, "m%d", i)})
	}
	ds := receive(t, q, 20)
	errs := make(chan error, len(ds))
	for _, d := range ds {
		go func() { errs <- d.Ack(context.Background()) }()
	}
	e.qs.Close()
	acked := 0
	for range ds {
		switch err := <-errs; {
		case err == nil:
			acked++
		case !errors.Is(err, sqlqueue.ErrClosed):
			t.Fatalf("ack as the handle closes: %v, want nil or ErrClosed", err)
		}
	}
	st, err := e.store.DB().QueryContext(context.Background(), "SELECT count(*) FROM idem_queue_messages")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var left int
	for st.Next() {
		if err := st.Scan(&left); err != nil {
			t.Fatal(err)
		}
	}
	if left != len(ds)-acked {
		t.Fatalf("%d acks answered nil but %d of %d messages are left", acked, left, len(ds))
	}
}
