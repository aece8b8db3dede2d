package sqlqueue_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/queuetest"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/pgstore"
	"github.com/idemkit/idem/store/sqlitestore"
)

// loadMessages keeps the suite's load check short enough for the race
// detector; BenchmarkEndToEnd measures throughput.
const loadMessages = 1000

// deadLetters reads a queue's dead letters for the suite.
func deadLetters(t *testing.T, src queue.Source) []queuetest.DeadLetter {
	t.Helper()
	var dls []sqlqueue.DeadLetter
	var err error
	switch q := src.(type) {
	case *sqlqueue.SQLiteQueue:
		dls, err = q.DeadLetters(context.Background(), 1000)
	case *sqlqueue.PostgresQueue:
		dls, err = q.DeadLetters(context.Background(), 1000)
	default:
		t.Fatalf("deadLetters: unexpected source %T", src)
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []queuetest.DeadLetter
	for _, dl := range dls {
		out = append(out, queuetest.DeadLetter{Message: dl.Message, Reason: dl.Reason})
	}
	return out
}

var features = queuetest.Features{FIFO: true, DedupWindow: true, Delay: true, RetryDelay: true, DeadLetter: true, LoadMessages: loadMessages}

// TestConformanceSQLite runs the adapter suite on SQLite, with the ledger
// in the same file (sqlitestore) for the consumer checks: the queue
// writing through the store's group commit (WithGroupCommit), and with a
// writer of its own that takes turns with the store's (WithWriteLock).
func TestConformanceSQLite(t *testing.T) {
	t.Parallel() // mostly waits for visibility timeouts and delays
	for _, mode := range []struct {
		name string
		gc   bool
	}{{"groupcommit", true}, {"writelock", false}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			conformanceSQLite(t, mode.gc)
		})
	}
}

func conformanceSQLite(t *testing.T, gc bool) {
	var cur atomic.Pointer[sqliteEnv] // the environment New made last
	queuetest.Run(t, queuetest.Harness{
		New: func(t *testing.T, vis time.Duration) (queue.Source, queue.Publisher) {
			e := openSQLiteMode(t, "", nil, gc, sqlqueue.WithPollInterval(100*time.Millisecond))
			cur.Store(e)
			q := e.queue(t, "conformance", sqlqueue.WithVisibility(vis))
			return q, q
		},
		DeadLetters: deadLetters,
		Store: func(t *testing.T) store.Store {
			if e := cur.Load(); e != nil {
				return e.store
			}
			st, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "ledger.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		},
		Features: features,
	})
}

// TestConformancePostgres runs the adapter suite on PostgreSQL, with the
// ledger in pgstore in the same schema (a table per test).
func TestConformancePostgres(t *testing.T) {
	t.Parallel()
	pool := pgPool(t)
	schema := pgSchema(t, pool)
	p := openPostgres(t, pool, schema, sqlqueue.WithPollInterval(100*time.Millisecond))
	var n atomic.Int64
	queuetest.Run(t, queuetest.Harness{
		New: func(t *testing.T, vis time.Duration) (queue.Source, queue.Publisher) {
			q := pgQueue(t, p, fmt.Sprint("conformance-", n.Add(1)), sqlqueue.WithVisibility(vis))
			return q, q
		},
		DeadLetters: deadLetters,
		Store: func(t *testing.T) store.Store { // a table of the test's own
			st, err := pgstore.New(context.Background(), pool, pgstore.WithSchema(schema), pgstore.WithTable(fmt.Sprint("ledger_", n.Add(1))))
			if err != nil {
				t.Fatal(err)
			}
			return st
		},
		Features: features,
	})
}

// redriver is what both backends' queues offer for redriveIntoBusyGroup.
type redriver interface {
	queue.Source
	queue.Publisher
	Redrive(ctx context.Context, limit int) (int, error)
	RedriveMessage(ctx context.Context, id string) (bool, error)
}

// redriveOneMessage: RedriveMessage moves the dead letter it names and
// no other, once; an id that is no dead letter of the queue moves
// nothing, and one that is no id is ErrBadID.
func redriveOneMessage(t *testing.T, q redriver) {
	t.Helper()
	ctx := context.Background()
	for _, b := range []string{"m1", "m2", "m3"} {
		publish(t, q, queue.Outgoing{Body: []byte(b)})
	}
	ds := receive(t, q, 10)
	if len(ds) != 3 {
		t.Fatalf("received %d, want 3", len(ds))
	}
	ids := map[string]string{}
	for _, d := range ds {
		ids[string(d.Message().Body)] = d.Message().ID
		if err := d.DeadLetter(ctx, "poison"); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := q.RedriveMessage(ctx, ids["m2"]); err != nil || !ok {
		t.Fatalf("RedriveMessage(m2) = %v, %v; want true", ok, err)
	}
	if ok, err := q.RedriveMessage(ctx, ids["m2"]); err != nil || ok {
		t.Fatalf("RedriveMessage(m2) again = %v, %v; want false, nil", ok, err)
	}
	if ok, err := q.RedriveMessage(ctx, "999999999"); err != nil || ok {
		t.Fatalf("RedriveMessage(an id never published) = %v, %v; want false, nil", ok, err)
	}
	if _, err := q.RedriveMessage(ctx, "not-an-id"); !errors.Is(err, sqlqueue.ErrBadID) {
		t.Fatalf("RedriveMessage(not-an-id) = %v; want ErrBadID", err)
	}
	ds = receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[m2]" {
		t.Fatalf("after redriving m2, received %s", got)
	}
	if ds[0].Message().ID != ids["m2"] || ds[0].Message().ReceiveCount != 1 {
		t.Fatalf("redriven m2 has id %s (was %s) and receive count %d, want its id and 1", ds[0].Message().ID, ids["m2"], ds[0].Message().ReceiveCount)
	}
	var left []string
	for _, dl := range deadLetters(t, q) {
		left = append(left, string(dl.Message.Body))
	}
	if got := fmt.Sprint(left); got != "[m1 m3]" {
		t.Fatalf("dead letters left = %s, want [m1 m3]", got)
	}
}

// redriveIntoBusyGroup: a redriven message of a FIFO group keeps its id,
// so it sorts before the messages of its group published after it. It
// must still wait while one of them is in flight: a group is handed out
// one message at a time.
func redriveIntoBusyGroup(t *testing.T, q redriver) {
	t.Helper()
	publish(t, q, queue.Outgoing{Body: []byte("a1"), GroupID: "a"})
	publish(t, q, queue.Outgoing{Body: []byte("a2"), GroupID: "a"})
	ds := receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[a1]" {
		t.Fatalf("first receive = %s", got)
	}
	if err := ds[0].DeadLetter(context.Background(), "poison"); err != nil {
		t.Fatal(err)
	}
	ds = receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[a2]" {
		t.Fatalf("after dead-lettering a1 = %s, want a2", got)
	}
	a2 := ds[0]
	if n, err := q.Redrive(context.Background(), 0); err != nil || n != 1 {
		t.Fatalf("redrive = %d, %v", n, err)
	}
	receiveNone(t, q) // a2 is in flight: a1 waits for it
	if err := a2.Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	ds = receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[a1]" {
		t.Fatalf("after acking a2 = %s, want a1", got)
	}
}
