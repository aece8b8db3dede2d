package sqlqueue_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/sqlitestore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// countingSource counts the acks of its deliveries and closes done at the
// n-th.
type countingSource struct {
	queue.Source
	acked atomic.Int64
	n     int64
	done  chan struct{}
}

func (s *countingSource) Receive(ctx context.Context, max int) ([]queue.Delivery, error) {
	ds, err := s.Source.Receive(ctx, max)
	for i, d := range ds {
		ds[i] = &countingDelivery{Delivery: d, s: s}
	}
	return ds, err
}

type countingDelivery struct {
	queue.Delivery
	s *countingSource
}

func (d *countingDelivery) Ack(ctx context.Context) error {
	err := d.Delivery.Ack(ctx)
	if err == nil && d.s.acked.Add(1) == d.s.n {
		close(d.s.done)
	}
	return err
}

// BenchmarkEndToEnd is the embedded default end to end: sqlqueue on
// SQLite in the file of a durable sqlitestore ledger (synchronous=FULL).
// It publishes b.N messages in batches of 1,000 (PublishBatch), then
// consumes them through queue.Consumer with a no-op effect under the
// ledger (one key per message), and reports publish, consume and overall
// messages per second. Each consumer setting runs with the queue writing
// through the store's group commit (writes=groupcommit,
// sqlqueue.WithGroupCommit) and with a writer of its own that takes turns
// with the store's (writes=writelock, sqlqueue.WithWriteLock), one after
// the other, and with the fused path (writes=fused, sqlqueue.WithLedger:
// the claims in the receive's unit of work, each completion in one with
// its ack), so that they compare on the same machine load. Run it with
// -benchtime 100000x.
func BenchmarkEndToEnd(b *testing.B) {
	for _, tc := range []struct {
		name               string
		concurrency, batch int
	}{
		{"consumer=default", 8, 10}, // queue's defaults
		{"consumer=64x64", 64, 64},
		{"consumer=256x128", 256, 128},
	} {
		for _, writes := range []string{"groupcommit", "writelock", "fused"} {
			b.Run(tc.name+"/writes="+writes, func(b *testing.B) {
				benchEndToEnd(b, tc.concurrency, tc.batch, writes)
			})
		}
	}
}

// benchSQLite opens a store and a queue handle on its file in b's
// temporary directory, with the handle's write option for that store;
// both are closed when b ends.
func benchSQLite(b *testing.B, writes func(*sqlitestore.Store) sqlqueue.Option) (*sqlitestore.Store, *sqlqueue.SQLite) {
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(b.TempDir(), "idem.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	qs, err := sqlqueue.NewSQLite(ctx, st.DB(), writes(st))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { qs.Close() })
	return st, qs
}

// groupCommit is benchSQLite's usual write option: the store's writer.
func groupCommit(st *sqlitestore.Store) sqlqueue.Option { return sqlqueue.WithGroupCommit(st) }

func benchEndToEnd(b *testing.B, concurrency, batchSize int, writes string) {
	ctx := context.Background()
	st, qs := benchSQLite(b, func(st *sqlitestore.Store) sqlqueue.Option {
		switch writes {
		case "writelock":
			return sqlqueue.WithWriteLock(st.LockWrites)
		case "fused":
			return sqlqueue.WithLedger(st)
		}
		return sqlqueue.WithGroupCommit(st)
	})
	q, _ := qs.Queue("bench")
	l := idem.New(st, idem.WithLogger(discard))
	counting := &countingSource{Source: q, n: int64(b.N), done: make(chan struct{})}
	var src queue.Source = counting
	if writes == "fused" {
		src = claimingCountingSource{counting}
	}
	c, err := queue.NewConsumer(src, l, queue.MessageIDKey("bench"),
		func(context.Context, queue.Message) ([]byte, error) { return nil, nil },
		queue.WithConcurrency(concurrency), queue.WithBatchSize(batchSize), queue.WithLogger(discard))
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	batch := make([]queue.Outgoing, 0, 1000)
	for i := range b.N {
		batch = append(batch, queue.Outgoing{Body: fmt.Appendf(nil, "message %d", i)})
		if len(batch) == cap(batch) || i == b.N-1 {
			if _, err := q.PublishBatch(ctx, batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	published := time.Since(start)
	before := st.Stats()
	cctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- c.Run(cctx) }()
	select {
	case <-counting.done:
	case err := <-ran:
		b.Fatalf("the consumer stopped: %v", err)
	}
	total := time.Since(start)
	b.StopTimer()
	stop()
	<-ran
	consumed := total - published
	b.ReportMetric(float64(b.N)/published.Seconds(), "published/s")
	b.ReportMetric(float64(b.N)/consumed.Seconds(), "consumed/s")
	b.ReportMetric(float64(b.N)/total.Seconds(), "msgs/s")
	s := st.Stats()
	// The store's commits while consuming; with writes=groupcommit they
	// carry the queue's writes too.
	b.ReportMetric(float64(s.Commits-before.Commits)/float64(b.N), "ledger-commits/msg")
}

// batchPublisher is what both backends' queues offer for loading many
// messages at once.
type batchPublisher interface {
	queue.Source
	PublishBatch(ctx context.Context, ms []queue.Outgoing) ([]queue.Published, error)
}

// BenchmarkReceiveBehindBlockedGroups measures one Receive of up to 10
// messages from a queue where backlog messages wait behind 10 FIFO groups
// whose heads are in flight, and 100 messages are ready: 50 ungrouped and
// the heads of 50 groups of one message. The ready messages are retried
// at once after each receive (off the clock), so they always sort after
// the backlog: a receive that walked the messages in order of visibility
// would pass the whole backlog first. Its cost should not grow with the
// backlog (docs/benchmarks.md). Run it with -benchtime 200x;
// IDEM_TEST_POSTGRES adds the PostgreSQL runs.
func BenchmarkReceiveBehindBlockedGroups(b *testing.B) {
	for _, backlog := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("engine=sqlite/backlog=%d", backlog), func(b *testing.B) {
			_, qs := benchSQLite(b, groupCommit)
			q, _ := qs.Queue("blocked", sqlqueue.WithVisibility(time.Hour))
			benchReceiveBehindBlocked(b, q, backlog, func() {})
		})
		b.Run(fmt.Sprintf("engine=postgres/backlog=%d", backlog), func(b *testing.B) {
			pool := pgPool(b)
			schema := pgSchema(b, pool)
			q := pgQueue(b, openPostgres(b, pool, schema), "blocked", sqlqueue.WithVisibility(time.Hour))
			benchReceiveBehindBlocked(b, q, backlog, pgAnalyze(b, pool, schema))
		})
	}
}

// pgAnalyze returns a func that takes the statistics of schema's messages
// table: plans follow them, so a benchmark takes them once its table is
// loaded rather than whenever autovacuum gets to the new table.
func pgAnalyze(b *testing.B, pool *pgxpool.Pool, schema string) func() {
	return func() {
		if _, err := pool.Exec(context.Background(), "ANALYZE "+pgx.Identifier{schema, "idem_queue_messages"}.Sanitize()); err != nil {
			b.Fatal(err)
		}
	}
}

// benchReceiveBehindBlocked fills q and times its receives; loaded runs
// once the messages are in.
func benchReceiveBehindBlocked(b *testing.B, q batchPublisher, backlog int, loaded func()) {
	ctx := context.Background()
	const groups, ready, limit = 10, 100, 10
	load := func(n int, group func(i int) string) {
		batch := make([]queue.Outgoing, 0, 1000)
		for i := range n {
			batch = append(batch, queue.Outgoing{Body: fmt.Appendf(nil, "message %d", i), GroupID: group(i)})
			if len(batch) == cap(batch) || i == n-1 {
				if _, err := q.PublishBatch(ctx, batch); err != nil {
					b.Fatal(err)
				}
				batch = batch[:0]
			}
		}
	}
	load(backlog, func(i int) string { return fmt.Sprint("g", i%groups) })
	heads, err := q.Receive(ctx, 2*groups)
	if err != nil || len(heads) != groups {
		b.Fatalf("receiving the groups' heads: %d messages, %v; want %d", len(heads), err, groups)
	}
	load(ready, func(i int) string {
		if i%2 == 0 {
			return ""
		}
		return fmt.Sprint("r", i)
	})
	loaded()
	b.ResetTimer()
	for range b.N {
		ds, err := q.Receive(ctx, limit)
		if err != nil || len(ds) != limit {
			b.Fatalf("receive: %d messages, %v; want %d", len(ds), err, limit)
		}
		b.StopTimer()
		for _, d := range ds {
			if g := d.Message().GroupID; g != "" && g[0] != 'r' {
				b.Fatalf("received %s of group %s, whose head is in flight", d.Message().ID, g)
			}
			if err := d.Retry(ctx, 0); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
}

// BenchmarkReceiveBesideDelayed measures one Receive of 10 messages of
// FIFO groups from a queue that also holds delayed messages (delayed
// messages: a delay on publish, or a retry's backoff). The groups with a
// message in flight, which the receive reads, must be found without
// passing the delayed ones: its cost should not grow with them. Run it
// with -benchtime 200x; IDEM_TEST_POSTGRES adds the PostgreSQL runs.
func BenchmarkReceiveBesideDelayed(b *testing.B) {
	for _, delayed := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("engine=sqlite/delayed=%d", delayed), func(b *testing.B) {
			_, qs := benchSQLite(b, groupCommit)
			q, _ := qs.Queue("delayed", sqlqueue.WithVisibility(time.Hour))
			benchReceiveBesideDelayed(b, q, delayed, func() {})
		})
		b.Run(fmt.Sprintf("engine=postgres/delayed=%d", delayed), func(b *testing.B) {
			pool := pgPool(b)
			schema := pgSchema(b, pool)
			q := pgQueue(b, openPostgres(b, pool, schema), "delayed", sqlqueue.WithVisibility(time.Hour))
			benchReceiveBesideDelayed(b, q, delayed, pgAnalyze(b, pool, schema))
		})
	}
}

// benchReceiveBesideDelayed fills q and times its receives; loaded runs
// once the messages are in.
func benchReceiveBesideDelayed(b *testing.B, q batchPublisher, delayed int, loaded func()) {
	ctx := context.Background()
	const ready, limit = 100, 10
	batch := make([]queue.Outgoing, 0, 1000)
	for i := range delayed + ready {
		m := queue.Outgoing{Body: fmt.Appendf(nil, "message %d", i), Delay: time.Hour}
		if i >= delayed {
			m = queue.Outgoing{Body: m.Body, GroupID: fmt.Sprint("r", i)}
		}
		batch = append(batch, m)
		if len(batch) == cap(batch) || i == delayed+ready-1 {
			if _, err := q.PublishBatch(ctx, batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	loaded()
	b.ResetTimer()
	for range b.N {
		ds, err := q.Receive(ctx, limit)
		if err != nil || len(ds) != limit {
			b.Fatalf("receive: %d messages, %v; want %d", len(ds), err, limit)
		}
		b.StopTimer()
		for _, d := range ds {
			if err := d.Retry(ctx, 0); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
}

// BenchmarkPublishReceiveAck measures the queue alone, without a ledger:
// b.N messages published one by one by 16 goroutines, then consumed by 8
// workers that receive up to 10 at a time and ack each, with no FIFO
// group (groups=0) or spread over 100 groups. It reports published/s
// and consumed/s. Run it with -benchtime 20000x; IDEM_TEST_POSTGRES adds
// the PostgreSQL runs.
func BenchmarkPublishReceiveAck(b *testing.B) {
	for _, groups := range []int{0, 100} {
		b.Run(fmt.Sprintf("engine=sqlite/groups=%d", groups), func(b *testing.B) {
			_, qs := benchSQLite(b, groupCommit)
			q, _ := qs.Queue("bench")
			benchPublishReceiveAck(b, q, q, groups)
		})
		b.Run(fmt.Sprintf("engine=postgres/groups=%d", groups), func(b *testing.B) {
			pool := pgPool(b)
			q := pgQueue(b, openPostgres(b, pool, pgSchema(b, pool)), "bench")
			benchPublishReceiveAck(b, q, q, groups)
		})
	}
}

func benchPublishReceiveAck(b *testing.B, src queue.Source, pub queue.Publisher, groups int) {
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
				m := queue.Outgoing{Body: fmt.Appendf(nil, "message %d", i)}
				if groups > 0 {
					m.GroupID = fmt.Sprint("g", i%int64(groups))
				}
				if _, err := pub.Publish(ctx, m); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	published := time.Since(start)
	var acked atomic.Int64
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	for range 8 {
		wg.Go(func() {
			for cctx.Err() == nil {
				ds, err := src.Receive(cctx, 10)
				if err != nil && cctx.Err() == nil {
					// A broken store must fail the run, not spin it.
					b.Error(err)
					stop()
					return
				}
				for _, d := range ds {
					if err := d.Ack(ctx); err != nil {
						b.Error(err)
					}
					if acked.Add(1) == int64(b.N) {
						stop()
					}
				}
			}
		})
	}
	wg.Wait()
	total := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/published.Seconds(), "published/s")
	b.ReportMetric(float64(b.N)/(total-published).Seconds(), "consumed/s")
}
