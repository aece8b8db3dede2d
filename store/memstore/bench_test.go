package memstore_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

// BenchmarkSteadyState measures claim+complete of new keys when records do
// not pile up: each completion's retention passes at once and every caller
// sweeps now and then, as a long-running process with a retention does. The
// store's own cost, without the heap growth that BenchmarkConformance's
// ever-growing set of records adds (on this VM a first touch of a fresh page
// costs microseconds).
func BenchmarkSteadyState(b *testing.B) {
	ctx := context.Background()
	s := memstore.New()
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 0, 32)
		n := 0
		for pb.Next() {
			buf = strconv.AppendInt(append(buf[:0], "receipt:"...), next.Add(1), 10)
			key := string(buf)
			res, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: key, Owner: "bench", Lease: time.Minute})
			if err != nil || !res.Acquired {
				b.Fatalf("claim %s: %v %+v", key, err, res)
			}
			if err := s.Finish(ctx, store.FinishRequest{Key: key, Fence: res.Record.Fence, AttemptID: res.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: nil, Retention: time.Nanosecond}); err != nil {
				b.Fatal(err)
			}
			if n++; n%4096 == 0 {
				if _, err := s.Sweep(ctx, 1<<20); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}
