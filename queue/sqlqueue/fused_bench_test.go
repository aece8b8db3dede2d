package sqlqueue_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/pgstore"
	"github.com/jackc/pgx/v5/pgxpool"
)

// claimingCountingSource is countingSource that passes the fused path
// through.
type claimingCountingSource struct{ *countingSource }

func (s claimingCountingSource) ClaimsFor(st store.Store) bool {
	return s.Source.(queue.ClaimingSource).ClaimsFor(st)
}

func (s claimingCountingSource) ReceiveClaimed(ctx context.Context, max int, claim func(queue.Message) (store.ClaimRequest, bool)) ([]queue.Delivery, []*idem.Claimed, error) {
	ds, claims, err := s.Source.(queue.ClaimingSource).ReceiveClaimed(ctx, max, claim)
	for i, d := range ds {
		ds[i] = &countingDelivery{Delivery: d, s: s.countingSource}
	}
	return ds, claims, err
}

// BenchmarkEndToEndPostgres is BenchmarkEndToEnd on PostgreSQL: sqlqueue
// and a pgstore ledger in one schema, b.N messages published in batches
// of 1,000, then consumed by a queue.Consumer of 512 handlers receiving
// 256 at a time with a no-op effect. path=fused gives the handle the
// ledger's store (sqlqueue.WithLedger: claims in the receive's
// transaction, completion and ack in one commit); path=separate does not,
// and coalesces the ledger's claims and completions
// (idem.WithCoalescing(256)), as bench/cmd/compare does. It reports
// msgs/s, the process's CPU time a message (cpu-µs/msg), and the row
// writes a message made to the queue's and the ledger's tables (from
// pg_stat_user_tables, publish included). Run it with -benchtime 30000x.
func BenchmarkEndToEndPostgres(b *testing.B) {
	pool := pgPool(b)
	for _, path := range []string{"fused", "separate"} {
		b.Run("path="+path, func(b *testing.B) {
			benchEndToEndPG(b, pool, path == "fused")
		})
	}
}

func benchEndToEndPG(b *testing.B, pool *pgxpool.Pool, fused bool) {
	ctx := context.Background()
	schema := pgSchema(b, pool)
	st, err := pgstore.New(ctx, pool, pgstore.WithSchema(schema), pgstore.WithTable("ledger"))
	if err != nil {
		b.Fatal(err)
	}
	opts := []sqlqueue.Option{sqlqueue.WithSchema(schema)}
	coalesce := 256
	if fused {
		opts, coalesce = append(opts, sqlqueue.WithLedger(st)), 0
	}
	p, err := sqlqueue.NewPostgres(ctx, pool, opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	q := pgQueue(b, p, "bench")
	l := idem.New(st, idem.WithLogger(discard), idem.WithCoalescing(coalesce))
	counting := &countingSource{Source: q, n: int64(b.N), done: make(chan struct{})}
	var src queue.Source = counting
	if fused {
		src = claimingCountingSource{counting}
	}
	c, err := queue.NewConsumer(src, l, queue.MessageIDKey("bench"),
		func(context.Context, queue.Message) ([]byte, error) { return nil, nil },
		queue.WithConcurrency(512), queue.WithBatchSize(256), queue.WithLogger(discard))
	if err != nil {
		b.Fatal(err)
	}
	writes0 := pgRowWrites(b, pool, schema)
	b.ResetTimer()
	cpu0 := cpuTime()
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
	cctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- c.Run(cctx) }()
	select {
	case <-counting.done:
	case err := <-ran:
		b.Fatalf("the consumer stopped: %v", err)
	}
	total, cpu := time.Since(start), cpuTime()-cpu0
	b.StopTimer()
	stop()
	<-ran
	b.ReportMetric(float64(b.N)/total.Seconds(), "msgs/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/msg")
	time.Sleep(1500 * time.Millisecond) // the servers' table statistics are flushed about every second
	b.ReportMetric(float64(pgRowWrites(b, pool, schema)-writes0)/float64(b.N), "row-writes/msg")
}

// pgRowWrites is the rows inserted, updated and deleted in schema's tables
// so far.
func pgRowWrites(b *testing.B, pool *pgxpool.Pool, schema string) int64 {
	var n int64
	err := pool.QueryRow(context.Background(), `SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint
FROM pg_stat_user_tables WHERE schemaname = $1`, schema).Scan(&n)
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
