package sqlqueue_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/sqlitestore"
)

var discard = slog.New(slog.DiscardHandler)

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// sqliteEnv is a sqlitestore on a temp file with a queue handle on its DB.
type sqliteEnv struct {
	path  string
	store *sqlitestore.Store
	qs    *sqlqueue.SQLite
	clock *fakeClock // nil: the real clock
}

// openSQLite opens the queues with WithGroupCommit(store), the
// recommended way.
func openSQLite(t *testing.T, path string, clock *fakeClock, opts ...sqlqueue.Option) *sqliteEnv {
	t.Helper()
	return openSQLiteMode(t, path, clock, true, opts...)
}

// openSQLiteMode opens the queues with WithGroupCommit(store) if gc, else
// with a writer of their own and WithWriteLock(store.LockWrites).
func openSQLiteMode(t *testing.T, path string, clock *fakeClock, gc bool, opts ...sqlqueue.Option) *sqliteEnv {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "idem.db")
	}
	var sopts []sqlitestore.Option
	if clock != nil {
		sopts = append(sopts, sqlitestore.WithClock(clock.Now))
		opts = append([]sqlqueue.Option{sqlqueue.WithClock(clock.Now)}, opts...)
	}
	st, err := sqlitestore.Open(context.Background(), path, sopts...)
	if err != nil {
		t.Fatal(err)
	}
	mode := sqlqueue.WithWriteLock(st.LockWrites)
	if gc {
		mode = sqlqueue.WithGroupCommit(st)
	}
	opts = append([]sqlqueue.Option{mode}, opts...)
	qs, err := sqlqueue.NewSQLite(context.Background(), st.DB(), opts...)
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		qs.Close()
		st.Close()
	})
	return &sqliteEnv{path: path, store: st, qs: qs, clock: clock}
}

func (e *sqliteEnv) queue(t *testing.T, name string, opts ...sqlqueue.QueueOption) *sqlqueue.SQLiteQueue {
	t.Helper()
	q, err := e.qs.Queue(name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func publish(t *testing.T, p queue.Publisher, m queue.Outgoing) queue.Published {
	t.Helper()
	res, err := p.Publish(context.Background(), m)
	if err != nil {
		t.Fatalf("publish %q: %v", m.Body, err)
	}
	return res
}

// receive receives up to max deliveries, failing the test if none comes
// within 5 s.
func receive(t *testing.T, src queue.Source, max int) []queue.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ds, err := src.Receive(ctx, max)
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	return ds
}

// receiveNone checks that nothing can be received for a little while.
func receiveNone(t *testing.T, src queue.Source) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	ds, err := src.Receive(ctx, 10)
	if len(ds) > 0 {
		t.Fatalf("received %q, want nothing", bodies(ds))
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("receive with nothing to receive: %v, want the context's deadline", err)
	}
}

// bodies returns the deliveries' bodies as strings.
var bodies = sqlqueue.DeliveryBodies

func TestSQLitePublishReceiveAck(t *testing.T) {
	e := openSQLite(t, "", nil)
	q := e.queue(t, "orders")
	before := time.Now().Add(-time.Millisecond)
	p := publish(t, q, queue.Outgoing{Body: []byte("hello"), Attributes: map[string]string{"type": "greeting"}, DedupID: "d1"})
	if p.ID == "" || p.Duplicate {
		t.Fatalf("publish = %+v, want an id and not a duplicate", p)
	}
	// Another queue in the same database is separate.
	other := e.queue(t, "other")
	publish(t, other, queue.Outgoing{Body: []byte("elsewhere")})

	ds := receive(t, q, 10)
	if len(ds) != 1 {
		t.Fatalf("received %q, want one message", bodies(ds))
	}
	m := ds[0].Message()
	if m.ID != p.ID || string(m.Body) != "hello" || m.Attributes["type"] != "greeting" || m.DedupID != "d1" ||
		m.ReceiveCount != 1 || m.FirstReceived.Before(before) || m.Published.Before(before) {
		t.Fatalf("message = %+v", m)
	}
	st, err := q.Stats(context.Background())
	if err != nil || st.InFlight != 1 || st.Ready != 0 {
		t.Fatalf("stats with one in flight = %+v, %v", st, err)
	}
	if err := ds[0].Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := ds[0].Ack(context.Background()); !errors.Is(err, queue.ErrSettled) {
		t.Fatalf("second ack: %v, want ErrSettled", err)
	}
	if err := ds[0].Extend(context.Background(), time.Second); !errors.Is(err, queue.ErrSettled) {
		t.Fatalf("extend after ack: %v, want ErrSettled", err)
	}
	receiveNone(t, q)
	sts, err := e.qs.Stats(context.Background())
	if err != nil || len(sts) != 1 || sts[0].Queue != "other" || sts[0].Ready != 1 {
		t.Fatalf("stats of every queue = %+v, %v; want only other with one ready", sts, err)
	}
}

func TestSQLiteBadInput(t *testing.T) {
	e := openSQLite(t, "", nil)
	if _, err := e.qs.Queue(""); !errors.Is(err, sqlqueue.ErrBadName) {
		t.Fatalf("empty queue name: %v", err)
	}
	q := e.queue(t, "q")
	if _, err := q.Publish(context.Background(), queue.Outgoing{Body: []byte("x"), Delay: -time.Second}); !errors.Is(err, sqlqueue.ErrBadMessage) {
		t.Fatalf("negative delay: %v", err)
	}
	if _, err := q.Publish(context.Background(), queue.Outgoing{Body: []byte("x"), Delay: 101 * 365 * 24 * time.Hour}); !errors.Is(err, sqlqueue.ErrBadMessage) {
		t.Fatalf("delay past the year 2200: %v", err)
	}
	receiveNone(t, q)
}

func TestSQLiteVisibilityExpiryRedelivers(t *testing.T) {
	clock := newFakeClock()
	e := openSQLite(t, "", clock)
	q := e.queue(t, "q", sqlqueue.WithVisibility(30*time.Second))
	publish(t, q, queue.Outgoing{Body: []byte("m")})
	first := receive(t, q, 1)
	receiveNone(t, q) // hidden while the visibility runs

	clock.Add(31 * time.Second)
	second := receive(t, q, 1)
	m := second[0].Message()
	if m.ID != first[0].Message().ID || m.ReceiveCount != 2 || !m.FirstReceived.Equal(first[0].Message().FirstReceived) {
		t.Fatalf("redelivery = %+v, want the same id, receive count 2 and the first receive time kept", m)
	}
	// The first receiver's copy is stale: it can neither ack nor extend
	// the second receiver's.
	if err := first[0].Extend(context.Background(), time.Minute); !errors.Is(err, sqlqueue.ErrReceiptExpired) {
		t.Fatalf("stale extend: %v, want ErrReceiptExpired", err)
	}
	if err := first[0].Ack(context.Background()); !errors.Is(err, sqlqueue.ErrReceiptExpired) {
		t.Fatalf("stale ack: %v, want ErrReceiptExpired", err)
	}
	st, _ := q.Stats(context.Background())
	if st.InFlight != 1 {
		t.Fatalf("after a refused stale ack, stats = %+v; want the message still in flight", st)
	}
	if err := second[0].Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	clock.Add(time.Hour)
	receiveNone(t, q)
}

func TestSQLiteRetryExtendDelay(t *testing.T) {
	clock := newFakeClock()
	e := openSQLite(t, "", clock)
	q := e.queue(t, "q", sqlqueue.WithVisibility(10*time.Second))

	// Delay postpones the first delivery.
	publish(t, q, queue.Outgoing{Body: []byte("later"), Delay: time.Minute})
	st, _ := q.Stats(context.Background())
	if st.Delayed != 1 {
		t.Fatalf("stats = %+v, want one delayed", st)
	}
	receiveNone(t, q)
	clock.Add(time.Minute)
	ds := receive(t, q, 1)

	// Extend keeps it hidden past the visibility timeout.
	clock.Add(8 * time.Second)
	if err := ds[0].Extend(context.Background(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	clock.Add(15 * time.Second)
	receiveNone(t, q)

	// Retry with a delay hands it back for later; the receive count grows.
	if err := ds[0].Retry(context.Background(), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := ds[0].Extend(context.Background(), time.Minute); !errors.Is(err, queue.ErrSettled) {
		t.Fatalf("extend after retry: %v, want ErrSettled", err)
	}
	st, _ = q.Stats(context.Background())
	if st.Delayed != 1 || st.InFlight != 0 {
		t.Fatalf("stats after Retry(5s) = %+v, want one delayed", st)
	}
	receiveNone(t, q)
	clock.Add(5 * time.Second)
	ds = receive(t, q, 1)
	if ds[0].Message().ReceiveCount != 2 {
		t.Fatalf("after a retry the receive count is %d, want 2", ds[0].Message().ReceiveCount)
	}
	// Retry(0) makes it visible at once.
	if err := ds[0].Retry(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	ds = receive(t, q, 1)
	if ds[0].Message().ReceiveCount != 3 {
		t.Fatalf("receive count %d, want 3", ds[0].Message().ReceiveCount)
	}
}

func TestSQLiteFIFOGroups(t *testing.T) {
	e := openSQLite(t, "", nil)
	q := e.queue(t, "fifo")
	for _, m := range []queue.Outgoing{
		{Body: []byte("a1"), GroupID: "a"},
		{Body: []byte("a2"), GroupID: "a"},
		{Body: []byte("b1"), GroupID: "b"},
		{Body: []byte("n1")},
		{Body: []byte("a3"), GroupID: "a"},
		{Body: []byte("b2"), GroupID: "b"},
	} {
		publish(t, q, m)
	}
	ds := receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[a1 b1 n1]" {
		t.Fatalf("first receive = %s, want the head of each group and the ungrouped message", got)
	}
	byBody := map[string]queue.Delivery{}
	for _, d := range ds {
		byBody[string(d.Message().Body)] = d
	}
	// Group a is blocked while a1 is in flight; settling b1 frees b2.
	if err := byBody["b1"].Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	ds = receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[b2]" {
		t.Fatalf("after acking b1 = %s, want b2 only (a is blocked by a1)", got)
	}
	if err := ds[0].Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	receiveNone(t, q)
	// A retried head stays the head: a2 waits for it.
	if err := byBody["a1"].Retry(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	ds = receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[a1]" {
		t.Fatalf("after retrying a1 = %s, want a1 again", got)
	}
	// Dead-lettering the head frees the next.
	if err := ds[0].DeadLetter(context.Background(), "poison"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"a2", "a3"} {
		ds = receive(t, q, 10)
		if got := fmt.Sprint(bodies(ds)); got != "["+want+"]" {
			t.Fatalf("got %s, want %s", got, want)
		}
		if err := ds[0].Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := byBody["n1"].Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	receiveNone(t, q)
}

func TestSQLiteDedupWindow(t *testing.T) {
	clock := newFakeClock()
	e := openSQLite(t, "", clock)
	q := e.queue(t, "q", sqlqueue.WithDedupWindow(5*time.Minute))
	first := publish(t, q, queue.Outgoing{Body: []byte("one"), DedupID: "k"})
	dup := publish(t, q, queue.Outgoing{Body: []byte("two"), DedupID: "k"})
	if !dup.Duplicate || dup.ID != first.ID {
		t.Fatalf("second publish inside the window = %+v, want a duplicate of %s", dup, first.ID)
	}
	// Other queues have their own ids.
	if p := publish(t, e.queue(t, "other"), queue.Outgoing{Body: []byte("x"), DedupID: "k"}); p.Duplicate {
		t.Fatal("a dedup id of one queue deduplicated a publish to another")
	}
	// The id is remembered after the message is consumed.
	ds := receive(t, q, 10)
	if len(ds) != 1 || string(ds[0].Message().Body) != "one" {
		t.Fatalf("received %q, want only the first publish", bodies(ds))
	}
	ds[0].Ack(context.Background())
	clock.Add(4 * time.Minute)
	if p := publish(t, q, queue.Outgoing{Body: []byte("three"), DedupID: "k"}); !p.Duplicate || p.ID != first.ID {
		t.Fatalf("publish after the ack, inside the window = %+v, want a duplicate", p)
	}
	clock.Add(time.Minute + time.Second)
	p := publish(t, q, queue.Outgoing{Body: []byte("four"), DedupID: "k"})
	if p.Duplicate || p.ID == first.ID {
		t.Fatalf("publish after the window = %+v, want a new message", p)
	}
	if p2 := publish(t, q, queue.Outgoing{Body: []byte("five"), DedupID: "k"}); !p2.Duplicate || p2.ID != p.ID {
		t.Fatalf("publish right after the renewed id = %+v, want a duplicate of %s", p2, p.ID)
	}
	// Batch publishes dedup against each other and the table.
	res, err := q.PublishBatch(context.Background(), []queue.Outgoing{
		{Body: []byte("b1"), DedupID: "x"}, {Body: []byte("b2"), DedupID: "x"}, {Body: []byte("b3"), DedupID: "k"}, {Body: []byte("b4")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Duplicate || !res[1].Duplicate || res[1].ID != res[0].ID || !res[2].Duplicate || res[2].ID != p.ID || res[3].Duplicate {
		t.Fatalf("batch = %+v", res)
	}
	// Without an id nothing is deduplicated, unless content dedup is on.
	publish(t, q, queue.Outgoing{Body: []byte("same")})
	if p := publish(t, q, queue.Outgoing{Body: []byte("same")}); p.Duplicate {
		t.Fatal("a publish without a dedup id was deduplicated")
	}
	cq := e.queue(t, "content", sqlqueue.WithContentDedup(true))
	c1 := publish(t, cq, queue.Outgoing{Body: []byte("same"), Attributes: map[string]string{"a": "1"}})
	if c2 := publish(t, cq, queue.Outgoing{Body: []byte("same"), Attributes: map[string]string{"a": "2"}}); !c2.Duplicate || c2.ID != c1.ID {
		t.Fatalf("content dedup: second publish of the same body = %+v, want a duplicate", c2)
	}
	if c3 := publish(t, cq, queue.Outgoing{Body: []byte("same"), DedupID: "explicit"}); c3.Duplicate {
		t.Fatal("an explicit dedup id did not take precedence over the body's hash")
	}
	// A window of 0 turns dedup off.
	off := e.queue(t, "off", sqlqueue.WithDedupWindow(0))
	publish(t, off, queue.Outgoing{Body: []byte("1"), DedupID: "k"})
	if p := publish(t, off, queue.Outgoing{Body: []byte("2"), DedupID: "k"}); p.Duplicate {
		t.Fatal("dedup with the window off")
	}
	clock.Add(6 * time.Minute)
	// Expired ids are swept (the writer sweeps on its own once a minute
	// of its clock has passed; Sweep takes what is left).
	if _, err := e.qs.Sweep(context.Background(), 100); err != nil {
		t.Fatal(err)
	}
	if n, err := e.qs.Sweep(context.Background(), 100); err != nil || n != 0 {
		t.Fatalf("second sweep = %d, %v; want the expired ids gone", n, err)
	}
	if p := publish(t, q, queue.Outgoing{Body: []byte("b5"), DedupID: "x"}); p.Duplicate {
		t.Fatal("a swept dedup id still deduplicates")
	}
}

// PublishBatch inserts runs of messages without a dedup id many rows to a
// statement: every message must still get its own id, in publish order,
// with its body, attributes, group and delay, on both write modes.
func TestSQLitePublishBatch(t *testing.T) {
	for _, gc := range []bool{true, false} {
		t.Run(fmt.Sprintf("groupcommit=%v", gc), func(t *testing.T) {
			e := openSQLiteMode(t, "", nil, gc)
			publishBatchRuns(t, e.queue(t, "batch"))
		})
	}
}

// With the dedup window off, a DedupID "is only carried to the
// receiver" (WithDedupWindow): a batch of such messages, inserted many
// rows to a statement, must carry them too. The batch was cut into runs
// whose sizes are powers of two, and only a run of one kept its ids.
func TestSQLitePublishBatchKeepsDedupIDs(t *testing.T) {
	for _, gc := range []bool{true, false} {
		t.Run(fmt.Sprintf("groupcommit=%v", gc), func(t *testing.T) {
			e := openSQLiteMode(t, "", nil, gc)
			publishBatchKeepsDedupIDs(t, e.queue(t, "q", sqlqueue.WithDedupWindow(0)))
		})
	}
}

// publishBatchKeepsDedupIDs publishes, to q without a dedup window, a
// message and a batch of three with dedup ids (one repeated), and checks
// that each arrives with its own.
func publishBatchKeepsDedupIDs(t *testing.T, q interface {
	batchPublisher
	queue.Publisher
}) {
	publish(t, q, queue.Outgoing{Body: []byte("single"), DedupID: "d-single"})
	res, err := q.PublishBatch(context.Background(), []queue.Outgoing{
		{Body: []byte("b1"), DedupID: "d-b1"},
		{Body: []byte("b2"), DedupID: "d-b2"},
		{Body: []byte("b3"), DedupID: "d-b1"}, // no window: a new message
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Duplicate {
			t.Fatalf("message %d reported a duplicate with the dedup window off", i)
		}
	}
	got := map[string]string{}
	for len(got) < 4 {
		for _, d := range receive(t, q, 10) {
			got[string(d.Message().Body)] = d.Message().DedupID
		}
	}
	for body, want := range map[string]string{"single": "d-single", "b1": "d-b1", "b2": "d-b2", "b3": "d-b1"} {
		if got[body] != want {
			t.Errorf("message %s arrived with DedupID %q, want %q", body, got[body], want)
		}
	}
}

// publishBatchRuns publishes a batch of 301 messages to the empty queue q
// (runs without dedup ids, with a duplicate and a fresh dedup id among
// them, attributes, a FIFO group, a delay) and checks that each message
// got its own id, in publish order, and is received with what it was
// published with.
func publishBatchRuns(t *testing.T, q interface {
	batchPublisher
	queue.Publisher
}) {
	first := publish(t, q, queue.Outgoing{Body: []byte("first"), DedupID: "k"})
	var ms []queue.Outgoing
	for i := range 300 { // more than one statement's rows, and a remainder
		m := queue.Outgoing{Body: fmt.Appendf(nil, "p%03d", i), Attributes: map[string]string{"i": fmt.Sprint(i)}}
		switch {
		case i == 7:
			m.DedupID = "k" // a duplicate inside a run
		case i == 130:
			m.DedupID = "fresh"
		case i == 200:
			m.Delay = time.Hour
		case i%50 == 3:
			m.GroupID = "g"
		}
		ms = append(ms, m)
	}
	ms = append(ms, queue.Outgoing{Body: []byte("lone")})
	res, err := q.PublishBatch(context.Background(), ms)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(ms) {
		t.Fatalf("%d results for %d messages", len(res), len(ms))
	}
	idOf := map[string]string{}
	var prev int64
	for i, r := range res {
		if (i == 7) != r.Duplicate {
			t.Fatalf("message %d: %+v; only message 7 (dedup id k) is a duplicate", i, r)
		}
		if r.Duplicate {
			if r.ID != first.ID {
				t.Fatalf("duplicate's id %s, want the first message's %s", r.ID, first.ID)
			}
			continue
		}
		id, err := strconv.ParseInt(r.ID, 10, 64)
		if err != nil || id <= prev {
			t.Fatalf("message %d: id %q after %d; want increasing ids in publish order", i, r.ID, prev)
		}
		prev = id
		idOf[string(ms[i].Body)] = r.ID
	}
	got := 0
	for got < len(ms)-1 { // "first", and all but the duplicate and the delayed one
		for _, d := range receive(t, q, 100) {
			m := d.Message()
			body := string(m.Body)
			if m.ID != idOf[body] && body != "first" {
				t.Fatalf("received %q as message %s; PublishBatch said %s", body, m.ID, idOf[body])
			}
			if i, err := strconv.Atoi(strings.TrimPrefix(body, "p")); err == nil {
				if m.Attributes["i"] != fmt.Sprint(i) || (m.GroupID == "g") != (i%50 == 3) {
					t.Fatalf("message %q: attributes %v, group %q", body, m.Attributes, m.GroupID)
				}
			}
			if err := d.Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
			got++
		}
	}
	receiveNone(t, q) // p200 is delayed an hour
}

func TestSQLiteDeadLetterRedrive(t *testing.T) {
	e := openSQLite(t, "", nil)
	q := e.queue(t, "q")
	for _, b := range []string{"m1", "m2", "m3"} {
		publish(t, q, queue.Outgoing{Body: []byte(b), Attributes: map[string]string{"b": b}, GroupID: "g" + b})
	}
	ds := receive(t, q, 10)
	if len(ds) != 3 {
		t.Fatalf("received %q", bodies(ds))
	}
	for _, d := range ds {
		if err := d.DeadLetter(context.Background(), "bad "+string(d.Message().Body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := ds[0].Ack(context.Background()); !errors.Is(err, queue.ErrSettled) {
		t.Fatalf("ack after dead letter: %v", err)
	}
	receiveNone(t, q)
	dls, err := q.DeadLetters(context.Background(), 0)
	if err != nil || len(dls) != 3 {
		t.Fatalf("dead letters = %+v, %v", dls, err)
	}
	if dl := dls[0]; string(dl.Message.Body) != "m1" || dl.Reason != "bad m1" || dl.Message.ReceiveCount != 1 ||
		dl.Message.Attributes["b"] != "m1" || dl.Message.GroupID != "gm1" || dl.At.IsZero() {
		t.Fatalf("dead letter = %+v", dl)
	}
	st, _ := q.Stats(context.Background())
	if st.DeadLettered != 3 || st.Ready+st.InFlight+st.Delayed != 0 {
		t.Fatalf("stats = %+v", st)
	}
	if n, err := q.Redrive(context.Background(), 2); err != nil || n != 2 {
		t.Fatalf("redrive 2 = %d, %v", n, err)
	}
	ds = receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[m1 m2]" {
		t.Fatalf("after redrive received %s", got)
	}
	for _, d := range ds {
		if d.Message().ReceiveCount != 1 {
			t.Fatalf("redriven message's receive count = %d, want 1 (reset)", d.Message().ReceiveCount)
		}
		d.Ack(context.Background())
	}
	if n, err := q.Redrive(context.Background(), 0); err != nil || n != 1 {
		t.Fatalf("redrive all = %d, %v", n, err)
	}
	if n, err := q.Redrive(context.Background(), 0); err != nil || n != 0 {
		t.Fatalf("redrive of nothing = %d, %v", n, err)
	}
	if st, _ := q.Stats(context.Background()); st.DeadLettered != 0 || st.Ready != 1 {
		t.Fatalf("stats after redrive = %+v", st)
	}
}

func TestSQLiteReceiveWakesOnPublish(t *testing.T) {
	e := openSQLite(t, "", nil, sqlqueue.WithPollInterval(time.Hour))
	q := e.queue(t, "q")
	got := make(chan []queue.Delivery, 1)
	go func() {
		ds, _ := q.Receive(context.Background(), 1)
		got <- ds
	}()
	time.Sleep(50 * time.Millisecond) // let it wait (with an hour's poll interval)
	publish(t, q, queue.Outgoing{Body: []byte("wake")})
	select {
	case ds := <-got:
		if len(ds) != 1 || string(ds[0].Message().Body) != "wake" {
			t.Fatalf("received %q", bodies(ds))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a waiting Receive was not woken by a publish on the same handle")
	}
}

// TestSQLitePublishTx: a message published in DoTx's transaction is
// queued if and only if the transaction commits, and a replayed key
// publishes nothing.
func TestSQLitePublishTx(t *testing.T) {
	e := openSQLite(t, "", nil)
	q := e.queue(t, "outbox")
	l := idem.New(e.store, idem.WithLogger(discard))
	ctx := context.Background()
	boom := errors.New("boom")
	_, err := idem.DoTx(ctx, l, idem.Key("send", "1"), func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		if _, err := q.PublishTx(ctx, tx, queue.Outgoing{Body: []byte("rolled back")}); err != nil {
			return nil, err
		}
		return nil, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("DoTx = %v, want boom", err)
	}
	receiveNone(t, q)
	for range 3 {
		_, err := idem.DoTx(ctx, l, idem.Key("send", "1"), func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
			p, err := q.PublishTx(ctx, tx, queue.Outgoing{Body: []byte("committed"), DedupID: "send-1"})
			return []byte(p.ID), err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	ds := receive(t, q, 10)
	if got := fmt.Sprint(bodies(ds)); got != "[committed]" {
		t.Fatalf("received %s, want exactly one committed message", got)
	}
	ds[0].Ack(ctx)
	receiveNone(t, q)
}

// TestSQLiteConcurrentReceivers: many goroutines on two handles (two
// stores on the same file, as two processes would be) receive, ack and
// use the ledger at once; every message is acked exactly once, and
// nothing fails with SQLITE_BUSY.
func TestSQLiteConcurrentReceivers(t *testing.T) {
	a := openSQLite(t, "", nil)
	b := openSQLite(t, a.path, nil)

	const n = 600
	qa := a.queue(t, "work", sqlqueue.WithVisibility(time.Minute))
	qb := b.queue(t, "work", sqlqueue.WithVisibility(time.Minute))
	var batch []queue.Outgoing
	for i := range n {
		batch = append(batch, queue.Outgoing{Body: fmt.Appendf(nil, "%d", i)})
	}
	if _, err := qa.PublishBatch(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		seen    = map[string]int{}
		handled atomic.Int64
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := range 8 {
		env, q := a, qa
		if i%2 == 1 {
			env, q = b, qb
		}
		l := idem.New(env.store, idem.WithLogger(discard))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for handled.Load() < n {
				rctx, rcancel := context.WithTimeout(ctx, 200*time.Millisecond)
				ds, err := q.Receive(rctx, 5)
				rcancel()
				if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				for _, d := range ds {
					id := d.Message().ID
					mu.Lock()
					seen[id]++
					mu.Unlock()
					//idem:allow deliveryid the test counts runs per message
					if _, err := l.Do(ctx, idem.Key("job", id), func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
						errs <- err
						return
					}
					if err := d.Ack(ctx); err != nil {
						errs <- err
						return
					}
					handled.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(seen) != n {
		t.Fatalf("%d distinct messages handled, want %d", len(seen), n)
	}
	for id, c := range seen {
		if c != 1 {
			t.Fatalf("message %s handed out %d times with a minute's visibility", id, c)
		}
	}
	if st, _ := qa.Stats(context.Background()); st != (sqlqueue.Stats{Queue: "work"}) {
		t.Fatalf("stats after all acked = %+v", st)
	}
}

func TestSQLiteClosed(t *testing.T) {
	e := openSQLite(t, "", nil, sqlqueue.WithPollInterval(time.Hour))
	q := e.queue(t, "q")
	publish(t, q, queue.Outgoing{Body: []byte("x")})
	ds := receive(t, q, 1)
	waiting := make(chan error, 1)
	go func() {
		_, err := q.Receive(context.Background(), 1)
		waiting <- err
	}()
	time.Sleep(50 * time.Millisecond)
	e.qs.Close()
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
	if _, err := q.Receive(context.Background(), 1); !errors.Is(err, idem.ErrClosed) {
		t.Fatalf("receive after close: %v", err)
	}
}

// Under WithGroupCommit the queue writes through the ledger's store: once
// that store is closed, the queue's calls fail with ErrClosed, as if the
// queue itself had been closed.
func TestSQLiteGroupCommitterClosed(t *testing.T) {
	e := openSQLite(t, "", nil, sqlqueue.WithPollInterval(10*time.Millisecond))
	q := e.queue(t, "q")
	publish(t, q, queue.Outgoing{Body: []byte("x")})
	ds := receive(t, q, 1)
	if err := e.store.Close(); err != nil {
		t.Fatal(err)
	}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, sqlqueue.ErrClosed) || !errors.Is(err, idem.ErrClosed) {
			t.Fatalf("%s after the store closed: %v, want sqlqueue.ErrClosed (and idem.ErrClosed)", what, err)
		}
	}
	_, err := q.Publish(context.Background(), queue.Outgoing{Body: []byte("y")})
	check("publish", err)
	_, err = q.PublishBatch(context.Background(), []queue.Outgoing{{Body: []byte("y")}, {Body: []byte("z")}})
	check("publish batch", err)
	check("ack", ds[0].Ack(context.Background()))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = q.Receive(ctx, 1)
	check("receive", err)
}

func TestSQLiteNoTables(t *testing.T) {
	st, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "x.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	_, err = sqlqueue.NewSQLite(context.Background(), st.DB(), sqlqueue.WithMigrate(false))
	if !errors.Is(err, sqlqueue.ErrNoTables) {
		t.Fatalf("NewSQLite without migrations on a database without the tables: %v, want ErrNoTables", err)
	}
}

// TestSQLiteReceiveGivenUp: a receive that commits after its caller gave
// up (here: while another connection held the write lock) hands its
// messages back at once, uncounted, instead of hiding them for the
// visibility timeout.
func TestSQLiteReceiveGivenUp(t *testing.T) {
	e := openSQLite(t, "", nil)
	q := e.queue(t, "q", sqlqueue.WithVisibility(time.Hour))
	publish(t, q, queue.Outgoing{Body: []byte("m")})
	conn, err := e.store.DB().Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	ds, err := q.Receive(ctx, 1)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || len(ds) != 0 {
		t.Fatalf("receive while the lock is held = %d, %v; want the deadline", len(ds), err)
	}
	if _, err := conn.ExecContext(context.Background(), "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	ds = receive(t, q, 1) // not after the hour's visibility
	if m := ds[0].Message(); m.ReceiveCount != 1 {
		t.Fatalf("receive count %d after a receive nobody saw, want 1", m.ReceiveCount)
	}
}

// A Publish made from inside a DoTx function with its context fails with
// sqlitestore.ErrOnWriter (the function runs on the store's writer, which
// the Publish would wait for); PublishTx with its transaction works, and
// the failed DoTx publishes nothing.
func TestSQLitePublishInsideDoTx(t *testing.T) {
	e := openSQLite(t, "", nil)
	q := e.queue(t, "q")
	l := idem.New(e.store, idem.WithLogger(slog.New(slog.DiscardHandler)))
	ctx := context.Background()
	_, err := idem.DoTx(ctx, l, idem.Key("wrong"), func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		_, err := q.Publish(ctx, queue.Outgoing{Body: []byte("x")})
		return nil, err
	})
	if !errors.Is(err, sqlitestore.ErrOnWriter) {
		t.Fatalf("Publish inside DoTx: %v, want sqlitestore.ErrOnWriter", err)
	}
	res, err := idem.DoTx(ctx, l, idem.Key("right"), func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		p, err := q.PublishTx(ctx, tx, queue.Outgoing{Body: []byte("y")})
		return []byte(p.ID), err
	})
	if err != nil || len(res.Value) == 0 {
		t.Fatalf("PublishTx inside DoTx: %+v, %v", res, err)
	}
	ds := receive(t, q, 10)
	if len(ds) != 1 || string(ds[0].Message().Body) != "y" {
		t.Fatalf("received %d messages, want only the PublishTx one", len(ds))
	}
}

// See redriveIntoBusyGroup.
func TestSQLiteRedriveIntoBusyGroup(t *testing.T) {
	for _, gc := range []bool{true, false} {
		t.Run(fmt.Sprintf("groupcommit=%v", gc), func(t *testing.T) {
			redriveIntoBusyGroup(t, openSQLiteMode(t, "", nil, gc).queue(t, "fifo"))
		})
	}
}

// See redriveOneMessage.
func TestSQLiteRedriveMessage(t *testing.T) {
	for _, gc := range []bool{true, false} {
		t.Run(fmt.Sprintf("groupcommit=%v", gc), func(t *testing.T) {
			redriveOneMessage(t, openSQLiteMode(t, "", nil, gc).queue(t, "one"))
		})
	}
}

// cancelInUnit is a GroupCommitter that runs units on a store's writer
// and, once the unit with the marked context has run, cancels that
// context before the transaction commits: the caller gives up while the
// writer has its receive in hand.
type cancelInUnit struct {
	st *sqlitestore.Store
}

type cancelKey struct{}

func (c cancelInUnit) WriteTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return c.st.WriteTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		err := fn(ctx, tx)
		if cancel, ok := ctx.Value(cancelKey{}).(context.CancelFunc); ok {
			cancel()
		}
		return err
	})
}

// A Receive whose context ends while the group committer runs its unit
// returns the context's error, and the messages it took are handed back
// (visible at once, the receive uncounted), as with the handle's own
// writer: not handed to a caller that has gone, nor hidden for the
// visibility timeout.
func TestSQLiteGroupCommitReceiveGivenUp(t *testing.T) {
	st, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	qs, err := sqlqueue.NewSQLite(context.Background(), st.DB(), sqlqueue.WithGroupCommit(cancelInUnit{st}))
	if err != nil {
		t.Fatal(err)
	}
	defer qs.Close()
	q, err := qs.Queue("q", sqlqueue.WithVisibility(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	publish(t, q, queue.Outgoing{Body: []byte("m")})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ds, err := q.Receive(context.WithValue(ctx, cancelKey{}, cancel), 1)
	if !errors.Is(err, context.Canceled) || len(ds) != 0 {
		t.Fatalf("receive given up in the unit = %q, %v; want context.Canceled", bodies(ds), err)
	}
	ds = receive(t, q, 1) // not after the hour's visibility
	if m := ds[0].Message(); m.ReceiveCount != 1 {
		t.Fatalf("receive count %d after a receive nobody saw, want 1", m.ReceiveCount)
	}
}

// Under WithGroupCommit, a Receive already waiting when the ledger's store
// closes, and the handle's reads after that, fail with ErrClosed too (the
// store closes the database they read).
func TestSQLiteGroupCommitterClosedWhileWaiting(t *testing.T) {
	e := openSQLite(t, "", nil, sqlqueue.WithPollInterval(10*time.Millisecond))
	q := e.queue(t, "q")
	waiting := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := q.Receive(ctx, 1)
		waiting <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if err := e.store.Close(); err != nil {
		t.Fatal(err)
	}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, sqlqueue.ErrClosed) || !errors.Is(err, idem.ErrClosed) {
			t.Fatalf("%s after the store closed: %v, want sqlqueue.ErrClosed (and idem.ErrClosed)", what, err)
		}
	}
	check("waiting receive", <-waiting)
	_, err := q.Stats(context.Background())
	check("stats", err)
	_, err = q.DeadLetters(context.Background(), 0)
	check("dead letters", err)
}

// A message whose stored attributes cannot be read (a row written from
// outside the API) is dead-lettered by the receive that takes it, with the
// reason; the receive hands out the others instead of failing, which
// would have failed every receive after it too.
func TestSQLiteCorruptAttributesDeadLettered(t *testing.T) {
	e := openSQLite(t, "", nil)
	q := e.queue(t, "q")
	bad := publish(t, q, queue.Outgoing{Body: []byte("bad"), Attributes: map[string]string{"a": "1"}})
	publish(t, q, queue.Outgoing{Body: []byte("good")})
	if _, err := e.store.DB().Exec(`UPDATE idem_queue_messages SET attributes = '{' WHERE id = ?`, bad.ID); err != nil {
		t.Fatal(err)
	}
	ds := receive(t, q, 10)
	if got := bodies(ds); len(got) != 1 || got[0] != "good" {
		t.Fatalf("received %q, want only the good message", got)
	}
	dls, err := q.DeadLetters(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || string(dls[0].Message.Body) != "bad" || !strings.Contains(dls[0].Reason, "undecodable") {
		t.Fatalf("dead letters %+v, want the bad message, undecodable", dls)
	}
}

// TestSQLiteHeadWalk: see headWalk.
func TestSQLiteHeadWalk(t *testing.T) {
	for _, gc := range []bool{true, false} {
		t.Run(fmt.Sprintf("groupcommit=%v", gc), func(t *testing.T) {
			e := openSQLiteMode(t, "", nil, gc)
			headWalk(t, e.queue(t, "fifo"), func(t *testing.T) {
				t.Helper()
				sqliteCheckHeld(t, e.store.DB())
			})
		})
	}
}

// sqliteCheckHeld fails t if a message of a FIFO group in db breaks the
// held invariant (see heldViolations).
func sqliteCheckHeld(t *testing.T, db *sql.DB) {
	t.Helper()
	rows, err := db.Query(heldViolations("idem_queue_messages"))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var bad []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		bad = append(bad, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(bad) > 0 {
		t.Fatalf("messages %v break the held invariant", bad)
	}
}

// TestSQLitePublishBatchSizes: batches of many sizes, split into inserts
// of 128, 64, ... 2 rows and single messages around messages with a dedup
// id, publish every message once, in order, and give each its own id, in
// both write modes.
func TestSQLitePublishBatchSizes(t *testing.T) {
	for _, gc := range []bool{true, false} {
		t.Run(fmt.Sprintf("group-commit=%v", gc), func(t *testing.T) {
			e := openSQLiteMode(t, "", nil, gc)
			q := e.queue(t, "sizes")
			ctx := context.Background()
			var want []string
			ids := map[string]string{}
			for _, size := range []int{2, 3, 127, 128, 129, 300, 1, 5} {
				ms := make([]queue.Outgoing, size)
				for i := range ms {
					ms[i].Body = fmt.Appendf(nil, "m%05d", len(want)+i)
					if i == size/2 && size > 2 {
						ms[i].DedupID = string(ms[i].Body) // a dedup id splits the run
					}
				}
				res, err := q.PublishBatch(ctx, ms)
				if err != nil || len(res) != size {
					t.Fatalf("PublishBatch of %d: %d results, %v", size, len(res), err)
				}
				for i, r := range res {
					body := string(ms[i].Body)
					if r.Duplicate || r.ID == "" || ids[r.ID] != "" {
						t.Fatalf("PublishBatch of %d: message %s got %+v (id already %q's)", size, body, r, ids[r.ID])
					}
					ids[r.ID] = body
					want = append(want, body)
				}
			}
			var got []string
			for len(got) < len(want) {
				for _, d := range receive(t, q, 256) {
					if ids[d.Message().ID] != string(d.Message().Body) {
						t.Fatalf("message %s came with id %s, which PublishBatch gave to %s", d.Message().Body, d.Message().ID, ids[d.Message().ID])
					}
					got = append(got, string(d.Message().Body))
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("received %d messages, not in publish order:\n got %v\nwant %v", len(got), got, want)
			}
		})
	}
}

// gatedCommitter holds every unit of work that starts while gate is set
// until the gate opens.
type gatedCommitter struct {
	sqlqueue.GroupCommitter
	gate    atomic.Pointer[chan struct{}]
	entered chan struct{}
}

func (g *gatedCommitter) WriteTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return g.GroupCommitter.WriteTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if gate := g.gate.Load(); gate != nil {
			g.entered <- struct{}{}
			<-*gate
		}
		return fn(ctx, tx)
	})
}

// TestSQLitePublishBatchAcrossClose: a PublishBatch whose unit the group
// committer already runs when the handle closes finishes with an answer
// (its messages written or an error), not a panic on a statement the close
// took away.
func TestSQLitePublishBatchAcrossClose(t *testing.T) {
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	gc := &gatedCommitter{GroupCommitter: st, entered: make(chan struct{}, 1)}
	qs, err := sqlqueue.NewSQLite(ctx, st.DB(), sqlqueue.WithGroupCommit(gc))
	if err != nil {
		t.Fatal(err)
	}
	q, err := qs.Queue("closing")
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	gc.gate.Store(&gate)
	done := make(chan any, 1)
	go func() {
		defer func() { done <- recover() }()
		_, err := q.PublishBatch(ctx, []queue.Outgoing{{Body: []byte("a")}, {Body: []byte("b")}})
		t.Logf("PublishBatch across Close: %v", err)
	}()
	<-gc.entered
	qs.Close()
	close(gate)
	if p := <-done; p != nil {
		t.Fatalf("PublishBatch panicked across Close: %v", p)
	}
}
