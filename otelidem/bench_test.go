package otelidem_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/cputime"
	"github.com/idemkit/idem/otelidem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/memstore"
	"github.com/idemkit/idem/store/sqlitestore"
)

// observers are the three settings the benchmarks compare: no observer;
// otelidem with metrics only (an SDK MeterProvider, its reader never
// collecting, and a no-op TracerProvider); otelidem with metrics and
// traces (an SDK TracerProvider sampling every span into a batcher whose
// exporter drops them).
func observers(b *testing.B) []struct {
	name string
	obs  idem.Observer
} {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = mp.Shutdown(context.Background()); _ = tp.Shutdown(context.Background()) })
	return []struct {
		name string
		obs  idem.Observer
	}{
		{"observer=none", nil},
		{"observer=metrics", otelidem.New(otelidem.WithMeterProvider(mp), otelidem.WithTracerProvider(tracenoop.NewTracerProvider()))},
		{"observer=metrics+traces", otelidem.New(otelidem.WithMeterProvider(mp), otelidem.WithTracerProvider(tp))},
	}
}

// BenchmarkLedgerDo is one executed Ledger.Do (a new key each time) on
// memstore, from 8 goroutines, with each observer setting.
func BenchmarkLedgerDo(b *testing.B) {
	for _, o := range observers(b) {
		b.Run(o.name, func(b *testing.B) {
			l := idem.New(memstore.New(), idem.WithObserver(o.obs), idem.WithLogger(slog.New(slog.DiscardHandler)))
			fn := func(context.Context) ([]byte, error) { return nil, nil }
			var n atomic.Int64
			b.SetParallelism(4) // 4 × GOMAXPROCS goroutines
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cputime.Self()
			defer func() { b.ReportMetric(float64((cputime.Self()-cpu).Nanoseconds())/1e3/float64(b.N), "CPU-µs/op") }()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					//idem:allow nondetkey each benchmark iteration is a new operation
					if _, err := l.Do(ctx, idem.RawKey("k"+strconv.FormatInt(n.Add(1), 10)), fn); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkEndToEnd is sqlqueue's BenchmarkEndToEnd (the embedded default:
// sqlqueue in the file of a sqlitestore ledger, the queue's default
// consumer) with each observer setting: b.N messages published, then
// consumed with a no-op effect until the last handler returns; it
// reports messages per second and the process's CPU time per message
// (the steadier figure on a shared machine).
// Run it with -benchtime 20000x or more.
func BenchmarkEndToEnd(b *testing.B) {
	for _, o := range observers(b) {
		b.Run(o.name, func(b *testing.B) {
			ctx := context.Background()
			st, err := sqlitestore.Open(ctx, filepath.Join(b.TempDir(), "idem.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			qs, err := sqlqueue.NewSQLite(ctx, st.DB(), sqlqueue.WithGroupCommit(st))
			if err != nil {
				b.Fatal(err)
			}
			defer qs.Close()
			q, _ := qs.Queue("bench")
			discard := slog.New(slog.DiscardHandler)
			l := idem.New(st, idem.WithObserver(o.obs), idem.WithLogger(discard))
			var handled atomic.Int64
			done := make(chan struct{})
			c, err := queue.NewConsumer(q, l, queue.MessageIDKey("bench"),
				func(context.Context, queue.Message) ([]byte, error) {
					if handled.Add(1) == int64(b.N) {
						close(done)
					}
					return nil, nil
				}, queue.WithLogger(discard))
			if err != nil {
				b.Fatal(err)
			}
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
			b.ResetTimer()
			start, cpu := time.Now(), cputime.Self()
			run, stop := context.WithCancel(ctx)
			ran := make(chan error, 1)
			go func() { ran <- c.Run(run) }()
			select {
			case <-done:
			case err := <-ran:
				b.Fatalf("the consumer stopped: %v", err)
			}
			took, used := time.Since(start), cputime.Self()-cpu
			b.StopTimer()
			stop()
			<-ran
			b.ReportMetric(float64(b.N)/took.Seconds(), "msgs/s")
			b.ReportMetric(float64(used.Nanoseconds())/1e3/float64(b.N), "CPU-µs/msg")
		})
	}
}
