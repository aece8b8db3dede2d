package sqlqueue_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
)

// heldQueue is what both backends' queues offer for headWalk.
type heldQueue interface {
	redriver
	Stats(ctx context.Context) (sqlqueue.Stats, error)
}

// heldViolations is the query heldCheck runs on a messages table: the
// messages of FIFO groups that break the held invariant. A group's lowest
// id must not be held (it would never be received), and every other
// message of a group must be held unless it is in flight (a redrive may
// put a lower id behind a message already handed out; the receive's
// lower-id check holds that one back).
func heldViolations(table string) string {
	return `SELECT m.id FROM ` + table + ` m WHERE m.group_id IS NOT NULL AND CASE
	WHEN EXISTS (SELECT 1 FROM ` + table + ` e WHERE e.queue = m.queue AND e.group_id = m.group_id AND e.id < m.id)
	THEN m.held_visible_at IS NULL AND m.receipt IS NULL
	ELSE m.held_visible_at IS NOT NULL END
ORDER BY m.id`
}

// headWalk walks a FIFO group through every change of its head: a
// publish behind the head, a delayed message behind it, a retry, an ack,
// a dead letter, and redrives of an old, lower id while a later message
// waits and while one is in flight. check fails the test if the held
// invariant is broken.
func headWalk(t *testing.T, q heldQueue, check func(t *testing.T)) {
	t.Helper()
	ctx := context.Background()
	const delay = time.Second
	start := time.Now()
	publish(t, q, queue.Outgoing{Body: []byte("a1"), GroupID: "a"})
	publish(t, q, queue.Outgoing{Body: []byte("a2"), GroupID: "a", Delay: delay})
	publish(t, q, queue.Outgoing{Body: []byte("a3"), GroupID: "a"})
	publish(t, q, queue.Outgoing{Body: []byte("b1"), GroupID: "b"})
	check(t)
	// Held messages count by their own visibility: a3 is ready (waiting
	// its turn), a2 delayed.
	if st, err := q.Stats(ctx); err != nil || st.Ready != 3 || st.Delayed != 1 || st.InFlight != 0 {
		t.Fatalf("stats after publishing = %+v, %v; want 3 ready (a1 a3 b1), 1 delayed (a2)", st, err)
	}
	ds := receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[a1 b1]" {
		t.Fatalf("first receive = %s, want the heads a1 b1", got)
	}
	a1, b1 := ds[0], ds[1]
	if st, err := q.Stats(ctx); err != nil || st.Ready != 1 || st.Delayed != 1 || st.InFlight != 2 {
		t.Fatalf("stats after receiving = %+v, %v; want 1 ready (a3), 1 delayed (a2), 2 in flight", st, err)
	}
	if err := b1.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	check(t)
	// A retried head stays the head.
	if err := a1.Retry(ctx, 0); err != nil {
		t.Fatal(err)
	}
	check(t)
	ds = receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[a1]" {
		t.Fatalf("after retrying a1 = %s, want a1 again (a2 and a3 wait)", got)
	}
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	check(t)
	// The new head a2 keeps its delay; a3, visible long ago, waits for it.
	if time.Since(start) < delay-200*time.Millisecond {
		receiveNone(t, q)
	}
	ds = receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[a2]" {
		t.Fatalf("after acking a1 = %s, want a2", got)
	}
	if el := time.Since(start); el < delay-50*time.Millisecond {
		t.Fatalf("a2 received %v after its publish, before its delay of %v", el, delay)
	}
	// Dead-lettering the head frees the next.
	if err := ds[0].DeadLetter(ctx, "poison"); err != nil {
		t.Fatal(err)
	}
	check(t)
	ds = receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[a3]" {
		t.Fatalf("after dead-lettering a2 = %s, want a3", got)
	}
	a3 := ds[0]
	// A redrive brings a2 back with its old, lower id while a3 is in
	// flight: a2 waits for a3; a4, published behind, waits for both.
	if n, err := q.Redrive(ctx, 0); err != nil || n != 1 {
		t.Fatalf("redrive = %d, %v", n, err)
	}
	publish(t, q, queue.Outgoing{Body: []byte("a4"), GroupID: "a"})
	check(t)
	receiveNone(t, q)
	if err := a3.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	check(t)
	ds = receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[a2]" {
		t.Fatalf("after acking a3 = %s, want the redriven a2", got)
	}
	// Dead-letter a2 again: a4 is the head, waiting. Redriving a2 makes it
	// the head again and holds a4.
	if err := ds[0].DeadLetter(ctx, "poison again"); err != nil {
		t.Fatal(err)
	}
	check(t)
	if n, err := q.Redrive(ctx, 0); err != nil || n != 1 {
		t.Fatalf("second redrive = %d, %v", n, err)
	}
	check(t)
	for _, want := range []string{"a2", "a4"} {
		ds = receive(t, q, 10)
		if got := fmt.Sprint(bodies(ds)); got != "["+want+"]" {
			t.Fatalf("got %s, want %s", got, want)
		}
		if err := ds[0].Ack(ctx); err != nil {
			t.Fatal(err)
		}
		check(t)
	}
	receiveNone(t, q)
	if st, err := q.Stats(ctx); err != nil || st.Ready+st.Delayed+st.InFlight != 0 {
		t.Fatalf("stats at the end = %+v, %v; want an empty queue", st, err)
	}
}

// longExtendKeepsGroupInFlight: however far an Extend pushes a message's
// visibility (it is capped at 100 years), the message stays in flight for
// its group: a redriven lower id of the group waits for it. (Past the
// year 2200, where held messages wait, the receive would not have seen
// it in flight.)
func longExtendKeepsGroupInFlight(t *testing.T, q redriver) {
	ctx := context.Background()
	publish(t, q, queue.Outgoing{Body: []byte("old"), GroupID: "g"})
	ds := receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[old]" {
		t.Fatalf("receive = %s, want old", got)
	}
	if err := ds[0].DeadLetter(ctx, "for the redrive"); err != nil {
		t.Fatal(err)
	}
	publish(t, q, queue.Outgoing{Body: []byte("new"), GroupID: "g"})
	ds = receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[new]" {
		t.Fatalf("receive = %s, want new", got)
	}
	if err := ds[0].Extend(ctx, time.Duration(math.MaxInt64)); err != nil {
		t.Fatalf("Extend by the longest duration: %v", err)
	}
	if n, err := q.Redrive(ctx, 0); err != nil || n != 1 {
		t.Fatalf("Redrive = %d, %v; want 1", n, err)
	}
	receiveNone(t, q)
}

// TestSQLiteLongExtend: see longExtendKeepsGroupInFlight.
func TestSQLiteLongExtend(t *testing.T) {
	e := openSQLiteMode(t, "", nil, true)
	longExtendKeepsGroupInFlight(t, e.queue(t, "fifo"))
}

// TestPostgresLongExtend: see longExtendKeepsGroupInFlight.
func TestPostgresLongExtend(t *testing.T) {
	pool := pgPool(t)
	longExtendKeepsGroupInFlight(t, pgQueue(t, openPostgres(t, pool, pgSchema(t, pool)), "fifo"))
}
