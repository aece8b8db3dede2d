package sqlqueue_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const pgSkip = "set IDEM_TEST_POSTGRES=postgres://postgres@127.0.0.1:5432/test?sslmode=disable to run the PostgreSQL queue tests"

// pgPool returns a pool of t's own on IDEM_TEST_POSTGRES, or skips t.
func pgPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	u := os.Getenv("IDEM_TEST_POSTGRES")
	if u == "" {
		t.Skip(pgSkip)
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// pgSchema returns a schema name of t's own, dropped when t ends.
func pgSchema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	var b [6]byte
	rand.Read(b[:])
	name := "sqlqueue_test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", name, err)
		}
	})
	return name
}

func openPostgres(t testing.TB, pool *pgxpool.Pool, schema string, opts ...sqlqueue.Option) *sqlqueue.Postgres {
	t.Helper()
	p, err := sqlqueue.NewPostgres(context.Background(), pool, append([]sqlqueue.Option{sqlqueue.WithSchema(schema)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func pgQueue(t testing.TB, p *sqlqueue.Postgres, name string, opts ...sqlqueue.QueueOption) *sqlqueue.PostgresQueue {
	t.Helper()
	q, err := p.Queue(name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func TestPostgresPublishReceiveSettle(t *testing.T) {
	pool := pgPool(t)
	// Receivers never poll: a receive that gets a message back after its
	// visibility or retry delay was woken at that time, not by a poll.
	p := openPostgres(t, pool, pgSchema(t, pool), sqlqueue.WithPollInterval(time.Hour))
	// The checks while a message is hidden (Stats, receiveNone) must be
	// done before the visibility or retry delay runs out: 400 and 300 ms
	// were short on a loaded machine, where the server shared by every
	// package's tests can take a hundred milliseconds a statement.
	const vis, delay = 2 * time.Second, 1500 * time.Millisecond
	q := pgQueue(t, p, "orders", sqlqueue.WithVisibility(vis))
	ctx := context.Background()
	pub := publish(t, q, queue.Outgoing{Body: []byte("hello"), Attributes: map[string]string{"type": "greeting"}, DedupID: "d1"})
	publish(t, pgQueue(t, p, "other"), queue.Outgoing{Body: []byte("elsewhere")})
	ds := receive(t, q, 10)
	if len(ds) != 1 {
		t.Fatalf("received %q", bodies(ds))
	}
	m := ds[0].Message()
	if m.ID != pub.ID || string(m.Body) != "hello" || m.Attributes["type"] != "greeting" || m.DedupID != "d1" ||
		m.ReceiveCount != 1 || m.FirstReceived.IsZero() || m.Published.IsZero() {
		t.Fatalf("message = %+v", m)
	}
	if st, err := q.Stats(ctx); err != nil || st.InFlight != 1 {
		t.Fatalf("stats = %+v, %v", st, err)
	}
	receiveNone(t, q)

	// The visibility lapses: the message comes back with receive count 2,
	// and the first copy can no longer ack it.
	asked := time.Now()
	again := receive(t, q, 10) // wakes when the visibility lapses
	got := time.Now()
	if len(again) != 1 || again[0].Message().ID != pub.ID || again[0].Message().ReceiveCount != 2 ||
		!again[0].Message().FirstReceived.Equal(m.FirstReceived) {
		t.Fatalf("redelivery = %+v", again)
	}
	if hidden := got.Sub(m.FirstReceived); hidden < vis-10*time.Millisecond {
		t.Fatalf("redelivered %v after the first receive, before the %v visibility lapsed (asked at %v)", hidden, vis, asked.Sub(m.FirstReceived))
	}
	if err := ds[0].Ack(ctx); !errors.Is(err, sqlqueue.ErrReceiptExpired) {
		t.Fatalf("stale ack: %v, want ErrReceiptExpired", err)
	}
	if err := again[0].Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(got.Add(vis + 50*time.Millisecond))) // past the redelivery's own visibility
	receiveNone(t, q)                                          // extended past it
	// Retry with a delay, then Retry(0), then ack.
	start := time.Now()
	if err := again[0].Retry(ctx, delay); err != nil {
		t.Fatal(err)
	}
	if st, _ := q.Stats(ctx); st.Delayed != 1 {
		t.Fatalf("stats after Retry(%v) = %+v, want one delayed", delay, st)
	}
	receiveNone(t, q)
	third := receive(t, q, 10) // wakes when the delay is over (no poll comes)
	if took := time.Since(start); third[0].Message().ReceiveCount != 3 || took < delay-10*time.Millisecond {
		t.Fatalf("after the retry delay: %+v after %v, want receive count 3 after at least %v", third[0].Message(), took, delay)
	}
	if err := third[0].Retry(ctx, 0); err != nil {
		t.Fatal(err)
	}
	fourth := receive(t, q, 10)
	if err := fourth[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fourth[0].Ack(ctx); !errors.Is(err, queue.ErrSettled) {
		t.Fatalf("second ack: %v", err)
	}
	receiveNone(t, q)
	sts, err := p.Stats(ctx)
	if err != nil || len(sts) != 1 || sts[0].Queue != "other" || sts[0].Ready != 1 || sts[0].OldestAge <= 0 {
		t.Fatalf("stats of every queue = %+v, %v", sts, err)
	}
}

func TestPostgresDelayAndWakeUp(t *testing.T) {
	pool := pgPool(t)
	p := openPostgres(t, pool, pgSchema(t, pool), sqlqueue.WithPollInterval(time.Hour))
	q := pgQueue(t, p, "q")
	// A publish by another handle (another process) wakes a waiting
	// receiver through NOTIFY.
	got := make(chan []queue.Delivery, 1)
	go func() {
		ds, _ := q.Receive(context.Background(), 1)
		got <- ds
	}()
	time.Sleep(100 * time.Millisecond)
	p2, err := sqlqueue.NewPostgres(context.Background(), pool, sqlqueue.WithSchema(p.Schema()))
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	q2, _ := p2.Queue("q")
	publish(t, q2, queue.Outgoing{Body: []byte("wake")})
	select {
	case ds := <-got:
		if len(ds) != 1 || string(ds[0].Message().Body) != "wake" {
			t.Fatalf("received %q", bodies(ds))
		}
		ds[0].Ack(context.Background())
	case <-time.After(10 * time.Second):
		t.Fatal("a publish from another handle did not wake the receiver (poll interval 1h)")
	}
	publish(t, q2, queue.Outgoing{Body: []byte("later"), Delay: 300 * time.Millisecond})
	receiveNone(t, q)
	ds := receive(t, q, 1)
	if string(ds[0].Message().Body) != "later" {
		t.Fatalf("received %q", bodies(ds))
	}
}

func TestPostgresFIFOGroups(t *testing.T) {
	pool := pgPool(t)
	p := openPostgres(t, pool, pgSchema(t, pool))
	q := pgQueue(t, p, "fifo")
	for _, m := range []queue.Outgoing{
		{Body: []byte("a1"), GroupID: "a"}, {Body: []byte("a2"), GroupID: "a"}, {Body: []byte("b1"), GroupID: "b"},
		{Body: []byte("n1")}, {Body: []byte("a3"), GroupID: "a"}, {Body: []byte("b2"), GroupID: "b"},
	} {
		publish(t, q, m)
	}
	ds := receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[a1 b1 n1]" {
		t.Fatalf("first receive = %s", got)
	}
	byBody := map[string]queue.Delivery{}
	for _, d := range ds {
		byBody[string(d.Message().Body)] = d
	}
	if err := byBody["b1"].Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	ds = receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[b2]" {
		t.Fatalf("after acking b1 = %s, want b2 (a blocked by a1)", got)
	}
	ds[0].Ack(context.Background())
	receiveNone(t, q)
	if err := byBody["a1"].DeadLetter(context.Background(), "poison"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"a2", "a3"} {
		ds = receive(t, q, 10)
		if got := fmt.Sprint(bodies(ds)); got != "["+want+"]" {
			t.Fatalf("got %s, want %s", got, want)
		}
		ds[0].Ack(context.Background())
	}
}

func TestPostgresDedupWindow(t *testing.T) {
	pool := pgPool(t)
	p := openPostgres(t, pool, pgSchema(t, pool))
	q := pgQueue(t, p, "q", sqlqueue.WithDedupWindow(time.Second))
	first := publish(t, q, queue.Outgoing{Body: []byte("one"), DedupID: "k"})
	if dup := publish(t, q, queue.Outgoing{Body: []byte("two"), DedupID: "k"}); !dup.Duplicate || dup.ID != first.ID {
		t.Fatalf("inside the window: %+v, want a duplicate of %s", dup, first.ID)
	}
	ds := receive(t, q, 10)
	if len(ds) != 1 {
		t.Fatalf("received %q", bodies(ds))
	}
	ds[0].Ack(context.Background())
	if dup := publish(t, q, queue.Outgoing{Body: []byte("three"), DedupID: "k"}); !dup.Duplicate {
		t.Fatal("after the ack, inside the window: not a duplicate")
	}
	time.Sleep(1100 * time.Millisecond)
	p2 := publish(t, q, queue.Outgoing{Body: []byte("four"), DedupID: "k"})
	if p2.Duplicate || p2.ID == first.ID {
		t.Fatalf("after the window: %+v, want a new message", p2)
	}
	// Concurrent publishes of one id insert one message.
	var wg sync.WaitGroup
	var fresh atomic.Int32
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := q.Publish(context.Background(), queue.Outgoing{Body: []byte("race"), DedupID: "race"})
			if err != nil {
				t.Error(err)
			} else if !r.Duplicate {
				fresh.Add(1)
			}
		}()
	}
	wg.Wait()
	if fresh.Load() != 1 {
		t.Fatalf("%d of 8 concurrent publishes of one dedup id were new, want 1", fresh.Load())
	}
	cq := pgQueue(t, p, "content", sqlqueue.WithContentDedup(true))
	c1 := publish(t, cq, queue.Outgoing{Body: []byte("same")})
	if c2 := publish(t, cq, queue.Outgoing{Body: []byte("same")}); !c2.Duplicate || c2.ID != c1.ID {
		t.Fatalf("content dedup: %+v", c2)
	}
	time.Sleep(1100 * time.Millisecond)
	if n, err := p.Sweep(context.Background(), 100); err != nil || n < 2 {
		t.Fatalf("sweep = %d, %v", n, err)
	}
}

func TestPostgresDeadLetterRedrive(t *testing.T) {
	pool := pgPool(t)
	p := openPostgres(t, pool, pgSchema(t, pool))
	q := pgQueue(t, p, "q")
	ctx := context.Background()
	for _, b := range []string{"m1", "m2", "m3"} {
		publish(t, q, queue.Outgoing{Body: []byte(b), Attributes: map[string]string{"b": b}})
	}
	for _, d := range receive(t, q, 10) {
		if err := d.DeadLetter(ctx, "bad "+string(d.Message().Body)); err != nil {
			t.Fatal(err)
		}
	}
	receiveNone(t, q)
	dls, err := q.DeadLetters(ctx, 0)
	if err != nil || len(dls) != 3 || string(dls[0].Message.Body) != "m1" || dls[0].Reason != "bad m1" ||
		dls[0].Message.Attributes["b"] != "m1" || dls[0].Message.ReceiveCount != 1 || dls[0].At.IsZero() {
		t.Fatalf("dead letters = %+v, %v", dls, err)
	}
	if st, _ := q.Stats(ctx); st.DeadLettered != 3 {
		t.Fatalf("stats = %+v", st)
	}
	if n, err := q.Redrive(ctx, 2); err != nil || n != 2 {
		t.Fatalf("redrive 2 = %d, %v", n, err)
	}
	ds := receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[m1 m2]" || ds[0].Message().ReceiveCount != 1 {
		t.Fatalf("after redrive: %s (count %d)", got, ds[0].Message().ReceiveCount)
	}
	if n, err := q.Redrive(ctx, 0); err != nil || n != 1 {
		t.Fatalf("redrive all = %d, %v", n, err)
	}
}

// TestPostgresPublishTx: with pgstore and idem.DoTx, the message is
// queued if and only if the claim's transaction commits.
func TestPostgresPublishTx(t *testing.T) {
	pool := pgPool(t)
	schema := pgSchema(t, pool)
	store, err := pgstore.New(context.Background(), pool, pgstore.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	p := openPostgres(t, pool, schema)
	q := pgQueue(t, p, "outbox")
	l := idem.New(store, idem.WithLogger(discard))
	ctx := context.Background()
	boom := errors.New("boom")
	_, err = idem.DoTx(ctx, l, idem.Key("send", "1"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		if _, err := q.PublishTx(ctx, tx, queue.Outgoing{Body: []byte("rolled back")}); err != nil {
			return nil, err
		}
		return nil, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("DoTx = %v", err)
	}
	receiveNone(t, q)
	for range 3 {
		if _, err := idem.DoTx(ctx, l, idem.Key("send", "1"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			_, err := q.PublishTx(ctx, tx, queue.Outgoing{Body: []byte("committed")})
			return nil, err
		}); err != nil {
			t.Fatal(err)
		}
	}
	ds := receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[committed]" {
		t.Fatalf("received %s, want exactly one committed message", got)
	}
	receiveNone(t, q)
}

// TestPostgresConcurrentReceivers: receivers on two handles (two
// processes' worth) never hold the same message at once.
func TestPostgresConcurrentReceivers(t *testing.T) {
	pool := pgPool(t)
	schema := pgSchema(t, pool)
	pa := openPostgres(t, pool, schema)
	pb := openPostgres(t, pool, schema)
	qa := pgQueue(t, pa, "work", sqlqueue.WithVisibility(time.Minute))
	qb := pgQueue(t, pb, "work", sqlqueue.WithVisibility(time.Minute))
	const n = 400
	for i := range n {
		g := ""
		if i%4 == 0 {
			g = fmt.Sprint("g", i%3) // some FIFO groups among them
		}
		publish(t, qa, queue.Outgoing{Body: fmt.Appendf(nil, "%d", i), GroupID: g})
	}
	var (
		mu       sync.Mutex
		seen     = map[string]int{}
		inFlight = map[string]bool{} // groups
		handled  atomic.Int64
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 8 {
		q := qa
		if i%2 == 1 {
			q = qb
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for handled.Load() < n && ctx.Err() == nil {
				rctx, rcancel := context.WithTimeout(ctx, 200*time.Millisecond)
				ds, err := q.Receive(rctx, 5)
				rcancel()
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Error(err)
						return
					}
					continue
				}
				for _, d := range ds {
					m := d.Message()
					mu.Lock()
					seen[m.ID]++
					if m.GroupID != "" {
						if inFlight[m.GroupID] {
							t.Errorf("group %s handed out twice at once", m.GroupID)
						}
						inFlight[m.GroupID] = true
					}
					mu.Unlock()
					time.Sleep(time.Millisecond)
					mu.Lock()
					delete(inFlight, m.GroupID)
					mu.Unlock()
					if err := d.Ack(ctx); err != nil {
						t.Error(err)
						return
					}
					handled.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if len(seen) != n {
		t.Fatalf("%d distinct messages handled, want %d", len(seen), n)
	}
	for id, c := range seen {
		if c != 1 {
			t.Fatalf("message %s handed out %d times", id, c)
		}
	}
}

func TestPostgresNoTables(t *testing.T) {
	pool := pgPool(t)
	_, err := sqlqueue.NewPostgres(context.Background(), pool, sqlqueue.WithSchema(pgSchema(t, pool)), sqlqueue.WithMigrate(false))
	if !errors.Is(err, sqlqueue.ErrNoTables) {
		t.Fatalf("NewPostgres without migrations on an empty schema: %v, want ErrNoTables", err)
	}
}

// TestPostgresListenerLost: when the LISTEN connection dies, receivers
// fall back to polling, and the handle listens again.
func TestPostgresListenerLost(t *testing.T) {
	pool := pgPool(t)
	schema := pgSchema(t, pool)
	p := openPostgres(t, pool, schema, sqlqueue.WithPollInterval(300*time.Millisecond))
	q := pgQueue(t, p, "q")
	other := pgQueue(t, openPostgres(t, pool, schema), "q")
	receiveNone(t, q) // starts the listener
	listen := "LISTEN " + pgx.Identifier{"idem_queue." + schema}.Sanitize()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE query = $1`, listen).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("terminated %d listening backends, want 1", n)
	}
	publish(t, other, queue.Outgoing{Body: []byte("while deaf")})
	ds := receive(t, q, 1)
	if string(ds[0].Message().Body) != "while deaf" {
		t.Fatalf("received %q", bodies(ds))
	}
	ds[0].Ack(context.Background())
	// It listens again within a second or so.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE query = $1`, listen).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the handle did not listen again after its connection was terminated")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestPostgresClosed(t *testing.T) {
	pool := pgPool(t)
	p := openPostgres(t, pool, pgSchema(t, pool), sqlqueue.WithPollInterval(time.Hour))
	q := pgQueue(t, p, "q")
	publish(t, q, queue.Outgoing{Body: []byte("x")})
	ds := receive(t, q, 1)
	waiting := make(chan error, 1)
	go func() {
		_, err := q.Receive(context.Background(), 1)
		waiting <- err
	}()
	time.Sleep(100 * time.Millisecond)
	p.Close()
	select {
	case err := <-waiting:
		if !errors.Is(err, idem.ErrClosed) {
			t.Fatalf("waiting receive at close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a waiting receive did not return at Close")
	}
	if _, err := q.Publish(context.Background(), queue.Outgoing{Body: []byte("y")}); !errors.Is(err, idem.ErrClosed) {
		t.Fatalf("publish after close: %v", err)
	}
	if err := ds[0].Ack(context.Background()); !errors.Is(err, idem.ErrClosed) {
		t.Fatalf("ack after close: %v", err)
	}
}

// Acks made at once are deleted in groups; each still gets its own answer:
// nil, or ErrReceiptExpired for a message received again since.
func TestPostgresConcurrentAcks(t *testing.T) {
	pool := pgPool(t)
	schema := pgSchema(t, pool)
	p := openPostgres(t, pool, schema)
	q := pgQueue(t, p, "acks", sqlqueue.WithVisibility(time.Minute))
	const n = 300
	for i := range n {
		publish(t, q, queue.Outgoing{Body: fmt.Appendf(nil, "m%d", i)})
	}
	var ds []queue.Delivery
	for len(ds) < n {
		ds = append(ds, receive(t, q, n-len(ds))...)
	}
	// Another receiver took message 7 since: its receipt changed.
	stale := ds[7].Message().ID
	if _, err := pool.Exec(context.Background(),
		"UPDATE "+pgx.Identifier{schema, "idem_queue_messages"}.Sanitize()+" SET receipt = receipt + 1000 WHERE id = $1", stale); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, d := range ds {
		wg.Go(func() {
			<-start
			errs[i] = d.Ack(context.Background())
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if ds[i].Message().ID == stale {
			if !errors.Is(err, sqlqueue.ErrReceiptExpired) {
				t.Errorf("ack of the message received again: %v, want ErrReceiptExpired", err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ack %d: %v", i, err)
		}
	}
	st, err := q.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready+st.InFlight != 1 {
		t.Fatalf("after the acks: %+v; want only the re-received message left", st)
	}
}

// PublishBatch publishes in order, in one transaction, deduplicating
// against the table and within the batch; an invalid message publishes
// nothing.
func TestPostgresPublishBatch(t *testing.T) {
	pool := pgPool(t)
	p := openPostgres(t, pool, pgSchema(t, pool))
	q := pgQueue(t, p, "batch")
	first := publish(t, q, queue.Outgoing{Body: []byte("first"), DedupID: "k"})
	ctx := context.Background()
	var ms []queue.Outgoing
	for i := range 50 {
		ms = append(ms, queue.Outgoing{Body: fmt.Appendf(nil, "p%02d", i)})
	}
	ms = append(ms, queue.Outgoing{Body: []byte("x1"), DedupID: "x"}, queue.Outgoing{Body: []byte("x2"), DedupID: "x"},
		queue.Outgoing{Body: []byte("k2"), DedupID: "k"}, queue.Outgoing{Body: []byte("last"), GroupID: "g"})
	res, err := q.PublishBatch(ctx, ms)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(ms) {
		t.Fatalf("%d results for %d messages", len(res), len(ms))
	}
	x1, x2, k2 := res[50], res[51], res[52]
	if x1.Duplicate || !x2.Duplicate || x2.ID != x1.ID || !k2.Duplicate || k2.ID != first.ID || res[53].Duplicate {
		t.Fatalf("dedup in the batch: x1 %+v, x2 %+v, k2 %+v (first %s), last %+v", x1, x2, k2, first.ID, res[53])
	}
	var got []string
	for len(got) < 53 {
		for _, d := range receive(t, q, 100) {
			got = append(got, string(d.Message().Body))
		}
	}
	want := []string{"first"}
	for i := range 50 {
		want = append(want, fmt.Sprintf("p%02d", i))
	}
	want = append(want, "x1", "last")
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("received %v, want %v (publish order)", got, want)
	}
	// A message that cannot be published stops the batch before anything
	// is written.
	if _, err := q.PublishBatch(ctx, []queue.Outgoing{{Body: []byte("ok")}, {Body: []byte("bad"), Delay: -time.Second}}); err == nil {
		t.Fatal("a batch with an invalid message was published")
	}
	st, err := q.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 0 {
		t.Fatalf("after the refused batch: %+v; want nothing new", st)
	}
}

// See TestSQLitePublishBatchKeepsDedupIDs.
func TestPostgresPublishBatchKeepsDedupIDs(t *testing.T) {
	pool := pgPool(t)
	p := openPostgres(t, pool, pgSchema(t, pool))
	publishBatchKeepsDedupIDs(t, pgQueue(t, p, "q", sqlqueue.WithDedupWindow(0)))
}

// See publishBatchRuns; then a batch of more rows than one statement
// takes keeps its order too.
func TestPostgresPublishBatchRuns(t *testing.T) {
	pool := pgPool(t)
	p := openPostgres(t, pool, pgSchema(t, pool))
	publishBatchRuns(t, pgQueue(t, p, "runs"))

	q := pgQueue(t, p, "long")
	ms := make([]queue.Outgoing, 2500)
	for i := range ms {
		ms[i] = queue.Outgoing{Body: fmt.Appendf(nil, "%d", i)}
	}
	res, err := q.PublishBatch(context.Background(), ms)
	if err != nil {
		t.Fatal(err)
	}
	var prev int64
	for i, r := range res {
		id, err := strconv.ParseInt(r.ID, 10, 64)
		if err != nil || id <= prev || r.Duplicate {
			t.Fatalf("message %d: %+v after id %d; want increasing ids in publish order", i, r, prev)
		}
		prev = id
	}
	for next := 0; next < len(ms); {
		for _, d := range receive(t, q, 1000) {
			if m := d.Message(); string(m.Body) != fmt.Sprint(next) || m.ID != res[next].ID {
				t.Fatalf("received %q (id %s), want message %d (id %s)", m.Body, m.ID, next, res[next].ID)
			}
			next++
		}
	}
}

// See redriveIntoBusyGroup.
func TestPostgresRedriveIntoBusyGroup(t *testing.T) {
	pool := pgPool(t)
	redriveIntoBusyGroup(t, pgQueue(t, openPostgres(t, pool, pgSchema(t, pool)), "fifo"))
}

// See redriveOneMessage.
func TestPostgresRedriveMessage(t *testing.T) {
	pool := pgPool(t)
	redriveOneMessage(t, pgQueue(t, openPostgres(t, pool, pgSchema(t, pool)), "one"))
}

// Message ids are drawn when a publish runs, not when it commits: a
// PublishTx whose transaction commits after a later publish to the same
// group adds an earlier id to a group whose later message may be in
// flight. It must wait for it: a group is handed out one at a time.
func TestPostgresLateCommitIntoBusyGroup(t *testing.T) {
	pool := pgPool(t)
	p := openPostgres(t, pool, pgSchema(t, pool))
	q := pgQueue(t, p, "fifo")
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := q.PublishTx(ctx, tx, queue.Outgoing{Body: []byte("x1"), GroupID: "x"}); err != nil {
		t.Fatal(err)
	}
	publish(t, q, queue.Outgoing{Body: []byte("x2"), GroupID: "x"})
	ds := receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[x2]" {
		t.Fatalf("first receive = %s, want x2 (x1 not committed)", got)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	receiveNone(t, q) // x2 is in flight: x1 waits for it
	if err := ds[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	ds = receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[x1]" {
		t.Fatalf("after acking x2 = %s, want x1", got)
	}
}

// A transaction that publishes three messages of one group (PublishTx
// called three times) hands them out in order, each after the one before
// it is acked. The hold trigger fires once per message at the commit: a
// later message's own trigger must not hold again a message the first
// one's trigger already held (it stayed hidden for good).
func TestPostgresPublishTxSameGroup(t *testing.T) {
	pool := pgPool(t)
	p := openPostgres(t, pool, pgSchema(t, pool))
	q := pgQueue(t, p, "fifo")
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, b := range []string{"g1", "g2", "g3"} {
			if _, err := q.PublishTx(ctx, tx, queue.Outgoing{Body: []byte(b), GroupID: "g"}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"g1", "g2", "g3"} {
		ds := receive(t, q, 10)
		if got := fmt.Sprint(bodies(ds)); got != "["+want+"]" {
			t.Fatalf("received %s, want [%s]", got, want)
		}
		if err := ds[0].Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	receiveNone(t, q)
}

// A message whose stored attributes are not a string map (a row written
// from outside the API) is dead-lettered by the receive that takes it; the
// receive hands out the others instead of failing.
func TestPostgresCorruptAttributesDeadLettered(t *testing.T) {
	pool := pgPool(t)
	schema := pgSchema(t, pool)
	p := openPostgres(t, pool, schema)
	q := pgQueue(t, p, "q")
	bad := publish(t, q, queue.Outgoing{Body: []byte("bad"), Attributes: map[string]string{"a": "1"}})
	publish(t, q, queue.Outgoing{Body: []byte("good")})
	if _, err := pool.Exec(context.Background(), `UPDATE `+pgx.Identifier{schema, "idem_queue_messages"}.Sanitize()+
		` SET attributes = '{"a": 1}'::jsonb WHERE id = $1`, bad.ID); err != nil {
		t.Fatal(err)
	}
	ds := receive(t, q, 10)
	if len(ds) != 1 || string(ds[0].Message().Body) != "good" {
		t.Fatalf("received %d messages (first %q), want only the good one", len(ds), ds[0].Message().Body)
	}
	dls, err := q.DeadLetters(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || string(dls[0].Message.Body) != "bad" || !strings.Contains(dls[0].Reason, "undecodable") {
		t.Fatalf("dead letters %+v, want the bad message, undecodable", dls)
	}
}
