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
)

// BenchmarkManualEndToEnd publishes b.N messages in batches of 1,000, then
// consumes them with workers that receive a batch, run a no-op effect
// through the ledger per message and ack it.
func BenchmarkManualEndToEnd(b *testing.B) {
	for _, workers := range []int{64} {
		b.Run(fmt.Sprint("workers=", workers), func(b *testing.B) {
			ctx := context.Background()
			st, err := sqlitestore.Open(ctx, filepath.Join(b.TempDir(), "idem.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			qs, err := sqlqueue.NewSQLite(ctx, st.DB(), sqlqueue.WithWriteLock(st.LockWrites))
			if err != nil {
				b.Fatal(err)
			}
			defer qs.Close()
			q, _ := qs.Queue("bench")
			l := idem.New(st, idem.WithLogger(discard))
			b.ResetTimer()
			start := time.Now()
			batch := make([]queue.Outgoing, 0, 1000)
			for i := range b.N {
				batch = append(batch, queue.Outgoing{Body: fmt.Appendf(nil, "%d", i)})
				if len(batch) == cap(batch) || i == b.N-1 {
					if _, err := q.PublishBatch(ctx, batch); err != nil {
						b.Fatal(err)
					}
					batch = batch[:0]
				}
			}
			published := time.Since(start)
			var done atomic.Int64
			var wg sync.WaitGroup
			cstart := time.Now()
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for done.Load() < int64(b.N) {
						rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
						ds, err := q.Receive(rctx, 10)
						cancel()
						if err != nil {
							continue
						}
						for _, d := range ds {
							if _, err := l.Do(ctx, idem.Key("m", d.Message().ID), func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
								b.Error(err)
								return
							}
							if err := d.Ack(ctx); err != nil {
								b.Error(err)
								return
							}
							done.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			consumed := time.Since(cstart)
			b.ReportMetric(float64(b.N)/published.Seconds(), "published/s")
			b.ReportMetric(float64(b.N)/consumed.Seconds(), "consumed/s")
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}
