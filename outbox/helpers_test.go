package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/sqlitestore"
)

var quiet = slog.New(slog.DiscardHandler)

// app is the application's SQLite database: a business table (orders) and
// the outbox queue, in one file.
type app struct {
	path   string
	store  *sqlitestore.Store // opens the file (WAL, busy timeout)
	queues *sqlqueue.SQLite
	outbox *sqlqueue.SQLiteQueue
}

// openApp opens (or creates) the application's database at path ("" for
// a new file), with the outbox's visibility vis.
func openApp(t testing.TB, path string, vis time.Duration) *app {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "app.db")
	}
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.DB().ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, total INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	qs, err := sqlqueue.NewSQLite(ctx, st.DB(), sqlqueue.WithGroupCommit(st), sqlqueue.WithPollInterval(20*time.Millisecond))
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		qs.Close()
		st.Close()
	})
	ob, err := qs.Queue("outbox", sqlqueue.WithVisibility(vis))
	if err != nil {
		t.Fatal(err)
	}
	return &app{path: path, store: st, queues: qs, outbox: ob}
}

// placeOrder is the application's transaction: the order's row and its
// "order placed" message in the outbox, committed together, or rolled
// back together when commit is false. With group, the message is in that
// FIFO group; without key, it is written with the queue's own PublishTx
// (no operation key, so the relay derives the dedup id).
func (a *app) placeOrder(t testing.TB, id string, commit bool, opt ...func(*queue.Outgoing)) {
	t.Helper()
	ctx := context.Background()
	tx, err := a.store.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders(id, total) VALUES (?, ?)`, id, 100); err != nil {
		t.Fatal(err)
	}
	m := queue.Outgoing{Body: []byte("order placed " + id)}
	for _, o := range opt {
		o(&m)
	}
	if m.Attributes["no-key"] == "" {
		_, err = outbox.PublishTx(ctx, a.outbox, tx, idem.Key("order-placed", id), m)
	} else {
		_, err = a.outbox.PublishTx(ctx, tx, m)
	}
	if err != nil {
		t.Fatal(err)
	}
	if commit {
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

func inGroup(g string) func(*queue.Outgoing) { return func(m *queue.Outgoing) { m.GroupID = g } }

func withoutKey(m *queue.Outgoing) { m.Attributes = map[string]string{"no-key": "1"} }

func (a *app) orders(t testing.TB) int {
	t.Helper()
	var n int
	if err := a.store.DB().QueryRow(`SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// statser is a sqlqueue queue on either database.
type statser interface {
	Stats(context.Context) (sqlqueue.Stats, error)
}

// stats returns a queue's counts.
func stats(t testing.TB, q statser) sqlqueue.Stats {
	t.Helper()
	st, err := q.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// target is the broker side: a sqlqueue queue in a file of its own with a
// dedup window, and a ledger in the same file for its consumer.
type target struct {
	store  *sqlitestore.Store
	queues *sqlqueue.SQLite
	q      *sqlqueue.SQLiteQueue
}

func openTarget(t testing.TB, path string) *target {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "broker.db")
	}
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := sqlqueue.NewSQLite(ctx, st.DB(), sqlqueue.WithGroupCommit(st), sqlqueue.WithPollInterval(20*time.Millisecond))
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		qs.Close()
		st.Close()
	})
	q, err := qs.Queue("orders", sqlqueue.WithDedupWindow(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return &target{store: st, queues: qs, q: q}
}

// consume runs a queue.Consumer with a ledger on the target until the
// queue is empty, keyed by outbox.MessageKey, and returns how many times
// each key's effect ran.
func (tg *target) consume(t testing.TB) map[string]int {
	t.Helper()
	var mu sync.Mutex
	effects := map[string]int{}
	l := idem.New(tg.store, idem.WithLogger(quiet))
	c, err := queue.NewConsumer(tg.q, l, outbox.MessageKey, func(_ context.Context, m queue.Message) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		effects[m.Attributes[outbox.KeyAttribute]]++
		return nil, nil
	}, queue.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitFor(t, 20*time.Second, "the target's queue to empty", func() bool {
		st := stats(t, tg.q)
		return st.Ready+st.InFlight+st.Delayed == 0
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	return effects
}

// received receives every message ready in q (acking each) and returns
// them in the order received.
func received(t testing.TB, q queue.Source) []queue.Message {
	t.Helper()
	var out []queue.Message
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		ds, err := q.Receive(ctx, 1)
		cancel()
		if err != nil || len(ds) == 0 {
			return out
		}
		for _, d := range ds {
			out = append(out, d.Message())
			if err := d.Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// drainUntilEmpty runs relay's Drain until the outbox holds nothing
// (retried messages included), and returns how many it relayed.
func drainUntilEmpty(t testing.TB, r *outbox.Relay, ob statser) int {
	t.Helper()
	n := 0
	waitFor(t, 30*time.Second, "the outbox to empty", func() bool {
		k, err := r.Drain(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		n += k
		st := stats(t, ob)
		return st.Ready+st.InFlight+st.Delayed == 0
	})
	return n
}

func waitFor(t testing.TB, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// recorder is a publisher that records every publish it passes on to the
// target, and may fail some first: fail returns the error for the n-th
// publish of a dedup id (1-based), or nil to pass it on.
type recorder struct {
	to   queue.Publisher
	fail func(m queue.Outgoing, n int) error

	mu    sync.Mutex
	calls []call
	tries map[string]int
}

type call struct {
	m   queue.Outgoing
	p   queue.Published
	err error
}

func (r *recorder) Publish(ctx context.Context, m queue.Outgoing) (queue.Published, error) {
	r.mu.Lock()
	if r.tries == nil {
		r.tries = map[string]int{}
	}
	r.tries[m.DedupID]++
	n := r.tries[m.DedupID]
	r.mu.Unlock()
	var (
		p   queue.Published
		err error
	)
	if r.fail != nil {
		err = r.fail(m, n)
	}
	if err == nil {
		p, err = r.to.Publish(ctx, m)
	}
	r.mu.Lock()
	r.calls = append(r.calls, call{m, p, err})
	r.mu.Unlock()
	return p, err
}

func (r *recorder) published() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []call
	for _, c := range r.calls {
		if c.err == nil {
			out = append(out, c)
		}
	}
	return out
}

func debugLog(w *testlog.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

var errCrash = errors.New("test: the relay died before the ack")

// crashingSource wraps an outbox so that every Ack fails without acking:
// as if the relay died between the confirmed publish and the ack.
type crashingSource struct{ queue.Source }

func (s crashingSource) Receive(ctx context.Context, max int) ([]queue.Delivery, error) {
	ds, err := s.Source.Receive(ctx, max)
	for i, d := range ds {
		ds[i] = crashingDelivery{d}
	}
	return ds, err
}

type crashingDelivery struct{ queue.Delivery }

func (crashingDelivery) Ack(context.Context) error { return errCrash }
