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
	"github.com/idemkit/idem/store/sqlitestore"
)

func BenchmarkCalibLedgerOnly(b *testing.B) {
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(b.TempDir(), "idem.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	l := idem.New(st, idem.WithLogger(discard))
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				l.Do(ctx, idem.Key("m", fmt.Sprint(i)), func(context.Context) ([]byte, error) { return nil, nil })
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "do/s")
	s := st.Stats()
	b.ReportMetric(float64(s.BatchedOps)/float64(s.Batches), "ops/batch")
}
