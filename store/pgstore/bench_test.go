package pgstore

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/cputime"
	"github.com/idemkit/idem/store"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The benchmarks compare with pgbench running one single-row
// INSERT ... ON CONFLICT DO NOTHING per transaction at the same number of
// clients and the server's synchronous_commit (see the package doc):
//
//	echo 'INSERT INTO bench_k VALUES (md5(random()::text)) ON CONFLICT DO NOTHING;' > ins.sql
//	psql -c 'CREATE TABLE IF NOT EXISTS bench_k (k text PRIMARY KEY)' test
//	pgbench -n -f ins.sql -c 8 -j 2 -T 10 test
//	pgbench -n -f ins.sql -c 64 -j 2 -T 10 test
//
//	IDEM_TEST_POSTGRES=... go test -run '^$' -bench 'ClaimComplete|ClaimBatch10' -benchtime 10s ./store/pgstore/
//
// pgbench's rate on a small machine moves by a factor of two from one run
// to the next (the disk's flush latency, other load), so run the two
// alternately, each concurrency's pgbench just before and after its
// benchmarks, and compare each benchmark with the runs around it.

// callers are the concurrencies the benchmarks run at.
var callers = []int{8, 64}

// benchStore returns a store in a fresh schema on a pool of its own with
// one connection per caller.
func benchStore(b *testing.B, conns int) *Store {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(testURL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = int32(conns)
	cfg.MinConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	s, err := New(context.Background(), pool, WithSchema(newSchema(b)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// runCallers runs body from n goroutines (b.SetParallelism rounds to a
// multiple of GOMAXPROCS) and reports ops/s, this process's CPU time per
// op (which, unlike the rate, hardly changes when other processes share
// the machine) and, with perOp keys per operation, keys/s.
func runCallers(b *testing.B, n, perOp int, body func(pb *testing.PB, keys *keyGen)) {
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((n + procs - 1) / procs)
	var prefix atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cputime.Self()
	b.RunParallel(func(pb *testing.PB) { body(pb, newKeyGen(&prefix)) })
	cpu := cputime.Self() - cpu0
	b.StopTimer()
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(b.N)/s, "ops/s")
		b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "CPU-µs/op")
		b.ReportMetric(float64(b.N*perOp)/s, "keys/s")
	}
}

// BenchmarkClaimComplete: Claim then Finish (completed) of a new key, one
// pair per op: two statements, two commits. Each attempt gets its own id,
// as the Ledger's do. Like every benchmark of a store call here, it runs
// on a prefilled table (see BenchmarkClaim).
func BenchmarkClaimComplete(b *testing.B) {
	for _, n := range callers {
		b.Run(fmt.Sprintf("callers=%d", n), func(b *testing.B) {
			s := benchStore(b, n)
			prefill(b, s)
			ctx := context.Background()
			runCallers(b, n, 1, func(pb *testing.PB, keys *keyGen) {
				r := benchRequest()
				result := []byte("result")
				for pb.Next() {
					r.Key, r.AttemptID = keys.next(), store.NewAttemptID()
					cr, err := s.Claim(ctx, r)
					if err != nil || !cr.Acquired {
						b.Errorf("Claim(%q): acquired %v, %v", r.Key, cr.Acquired, err)
						return
					}
					if err := s.Finish(ctx, store.FinishRequest{Key: r.Key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: result, Retention: time.Hour}); err != nil {
						b.Errorf("Finish: %v", err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkClaimBatch10: ClaimBatch of 10 new keys, one batch per op:
// alone (claim-only: one statement, one commit per 10 keys), then
// completed with FinishBatch (two statements, two commits), or with
// Finish for each key (eleven).
func BenchmarkClaimBatch10(b *testing.B) {
	const size = 10
	for _, mode := range []string{"claim-only", "complete-batch", "complete-each"} {
		for _, n := range callers {
			b.Run(fmt.Sprintf("%s/callers=%d", mode, n), func(b *testing.B) {
				s := benchStore(b, n)
				prefill(b, s)
				ctx := context.Background()
				runCallers(b, n, size, func(pb *testing.PB, keys *keyGen) {
					reqs := make([]store.ClaimRequest, size)
					cs := make([]store.FinishRequest, size)
					for i := range reqs {
						reqs[i] = benchRequest()
					}
					for pb.Next() {
						for i := range reqs {
							reqs[i].Key, reqs[i].AttemptID = keys.next(), store.NewAttemptID()
						}
						res, err := s.ClaimBatch(ctx, reqs)
						if err != nil {
							b.Errorf("ClaimBatch: %v", err)
							return
						}
						for i, r := range res {
							if !r.Acquired {
								b.Errorf("ClaimBatch: %q not acquired", r.Record.Key)
								return
							}
							cs[i] = store.FinishRequest{Key: r.Record.Key, Fence: r.Record.Fence, AttemptID: r.Record.AttemptID,
								Outcome: store.OutcomeCompleted, Result: []byte("result"), Retention: time.Hour}
						}
						switch mode {
						case "claim-only":
							continue
						case "complete-each":
							for _, c := range cs {
								if err := s.Finish(ctx, c); err != nil {
									b.Errorf("Finish: %v", err)
									return
								}
							}
							continue
						}
						errs, err := s.FinishBatch(ctx, cs)
						if err != nil {
							b.Errorf("FinishBatch: %v", err)
							return
						}
						for _, err := range errs {
							if err != nil {
								b.Errorf("FinishBatch: %v", err)
								return
							}
						}
					}
				})
			})
		}
	}
}

// BenchmarkDo: Ledger.Do of a new key with a no-op fn (a claim and a
// completion), each call's own statements ("plain") or sharing them with
// the calls made at the same time ("coalesced", idem.WithCoalescing(64):
// concurrent claims go as one ClaimBatch statement and one commit, and so
// do completions).
func BenchmarkDo(b *testing.B) {
	for _, mode := range []string{"plain", "coalesced"} {
		for _, n := range callers {
			b.Run(fmt.Sprintf("%s/callers=%d", mode, n), func(b *testing.B) {
				opts := []idem.Option{idem.WithLogger(slog.New(slog.DiscardHandler)), idem.WithRetention(time.Hour)}
				if mode == "coalesced" {
					opts = append(opts, idem.WithCoalescing(64))
				}
				s := benchStore(b, n)
				prefill(b, s)
				l := idem.New(s, opts...)
				ctx := context.Background()
				fn := func(context.Context) ([]byte, error) { return []byte("result"), nil }
				runCallers(b, n, 1, func(pb *testing.PB, keys *keyGen) {
					for pb.Next() {
						if _, err := l.Do(ctx, idem.Key(keys.next()), fn); err != nil {
							b.Errorf("Do: %v", err)
							return
						}
					}
				})
			})
		}
	}
}

// BenchmarkClaim: Claim of a new key alone (one statement, one commit),
// the figure to hold against its own statement from pgbench
// (BenchmarkEngineStatements/claim). Both run on a prefilled table: on a
// new one the store plans each statement per call until the table is
// warm (plans.go), which is the store starting up, not its claim (that
// cost is BenchmarkEngineStatements/claim-planned).
func BenchmarkClaim(b *testing.B) {
	for _, n := range callers {
		b.Run(fmt.Sprintf("callers=%d", n), func(b *testing.B) {
			s := benchStore(b, n)
			prefill(b, s)
			ctx := context.Background()
			runCallers(b, n, 1, func(pb *testing.PB, keys *keyGen) {
				r := benchRequest()
				for pb.Next() {
					r.Key, r.AttemptID = keys.next(), store.NewAttemptID()
					if cr, err := s.Claim(ctx, r); err != nil || !cr.Acquired {
						b.Errorf("Claim(%q): acquired %v, %v", r.Key, cr.Acquired, err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkConformance runs idemtest's benchmarks on the store.
func BenchmarkConformance(b *testing.B) {
	h := harness(b)
	h.New = func(t testing.TB) store.Store { return benchStore(t.(*testing.B), 16) }
	idemtest.BenchmarkStore(b, h)
}

// prefill gives s's table what a table in use has: 20,000 completed
// records (over 300 pages, past warmPages) and statistics, so that the
// store runs cached statements from its first call, with the plans a
// running store has. It waits until the store has seen the table's size.
func prefill(b *testing.B, s *Store) {
	b.Helper()
	ctx := context.Background()
	for _, q := range []string{
		"INSERT INTO " + s.Table() + " (key, status, policy, fence, attempt, lease_until, expires_at, created_at, updated_at) " +
			"SELECT 'prefill-' || g, 'completed', 'at_least_once', 1, 1, now(), now() + interval '1 hour', now(), now() FROM generate_series(1, 20000) AS g",
		"ANALYZE " + s.Table(),
	} {
		if _, err := s.pool.Exec(ctx, q); err != nil {
			b.Fatalf("%s: %v", q, err)
		}
	}
	s.checkWarm()
	if !s.warm.Load() {
		b.Fatal("the store does not see its prefilled table as warm")
	}
}

func benchRequest() store.ClaimRequest {
	return store.ClaimRequest{AttemptID: store.NewAttemptID(), Owner: "bench", Correlation: "bench", Policy: store.AtLeastOnce, Lease: 30 * time.Second, Retention: time.Hour}
}

// keyGen makes keys no other goroutine makes.
type keyGen struct {
	buf []byte
	pre int
	n   int
}

func newKeyGen(prefix *atomic.Int64) *keyGen {
	g := &keyGen{buf: make([]byte, 0, 48)}
	g.buf = append(g.buf, "bench:"...)
	g.buf = strconv.AppendInt(g.buf, time.Now().UnixNano(), 36)
	g.buf = append(g.buf, ':')
	g.buf = strconv.AppendInt(g.buf, prefix.Add(1), 10)
	g.buf = append(g.buf, ':')
	g.pre = len(g.buf)
	return g
}

func (g *keyGen) next() string {
	g.n++
	g.buf = strconv.AppendInt(g.buf[:g.pre], int64(g.n), 10)
	return string(g.buf)
}

// BenchmarkSweep: Sweep(5000) in a loop over expired records, one op per
// record deleted.
func BenchmarkSweep(b *testing.B) {
	s := benchStore(b, 4)
	fill(b, s, "old-", b.N, store.StatusCompleted, -time.Hour, -time.Hour)
	fill(b, s, "live-", 1000, store.StatusCompleted, time.Hour, 0)
	ctx := context.Background()
	b.ResetTimer()
	total := 0
	for {
		n, err := s.Sweep(ctx, 5000)
		if err != nil {
			b.Fatal(err)
		}
		if n == 0 {
			break
		}
		total += n
	}
	b.StopTimer()
	if total != b.N {
		b.Fatalf("swept %d, want %d", total, b.N)
	}
	b.ReportMetric(float64(total)/b.Elapsed().Seconds(), "rows/s")
}
