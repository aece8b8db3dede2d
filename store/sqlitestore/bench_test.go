package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/cputime"
	"github.com/idemkit/idem/store"
)

// Run with:
//
//	go test -run '^$' -bench . -benchtime 3s ./store/sqlitestore

// BenchmarkClaimComplete measures durable claim+complete of new keys by 64
// concurrent callers (whatever GOMAXPROCS is): the group commit's case. One
// op is one Claim plus one Complete; syncs/op is the WAL syncs (commits) per
// claim+complete.
//
// keys=seq are "receipt:N" from a counter (new keys land next to each
// other, like order numbers); keys=random are random hex (every insert
// lands on another page, so each commit writes more pages).
func BenchmarkClaimComplete(b *testing.B) {
	for _, callers := range []int{1, 64} {
		b.Run(fmt.Sprintf("callers=%d/keys=seq", callers), func(b *testing.B) {
			var next atomic.Int64
			benchClaimComplete(b, callers, func() string { return "receipt:" + strconv.FormatInt(next.Add(1), 10) })
		})
	}
	b.Run("callers=64/keys=random", func(b *testing.B) {
		benchClaimComplete(b, 64, func() string {
			return "receipt:" + strconv.FormatUint(rand.Uint64(), 16)
		})
	})
}

func benchClaimComplete(b *testing.B, callers int, key func() string) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(b.TempDir(), "idem.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	result := []byte(`{"id":"msg_0123456789"}`)
	before := s.Stats()
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cputime.Self()
	start := time.Now()
	if callers == 1 {
		for i := 0; i < b.N; i++ {
			claimComplete(b, s, ctx, key(), result)
		}
	} else {
		b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				claimComplete(b, s, ctx, key(), result)
			}
		})
	}
	elapsed := time.Since(start)
	cpu := cputime.Self() - cpu0
	b.StopTimer()
	st := s.Stats()
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "claim+complete/s")
	b.ReportMetric(float64(st.Syncs-before.Syncs)/float64(b.N), "syncs/op")
	if n := st.Batches - before.Batches; n > 0 {
		b.ReportMetric(float64(st.BatchedOps-before.BatchedOps)/float64(n), "ops/batch")
	}
}

func claimComplete(b *testing.B, s *Store, ctx context.Context, key string, result []byte) {
	res, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(),
		Key: key, Owner: "bench", Policy: store.AtLeastOnce,
		Lease: 30 * time.Second, Retention: 24 * time.Hour,
	})
	if err != nil || !res.Acquired {
		b.Errorf("claim %s: %v %+v", key, err, res)
		return
	}
	if err := s.Finish(ctx, store.FinishRequest{Key: key, Fence: res.Record.Fence, AttemptID: res.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: result, Retention: 24 * time.Hour}); err != nil {
		b.Errorf("complete %s: %v", key, err)
	}
}

// BenchmarkEngineInsert is the engine's limit on this disk with the store's
// durability (WAL, synchronous=FULL): a one-column INSERT ... ON CONFLICT DO
// NOTHING loop at 1, 64 and 1000 rows per commit, on one connection.
func BenchmarkEngineInsert(b *testing.B) {
	for _, per := range []int{1, 64, 1000} {
		b.Run(fmt.Sprintf("rows/commit=%d", per), func(b *testing.B) {
			db, err := sql.Open("sqlite", filepath.Join(b.TempDir(), "engine.db")+
				"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)")
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			ctx := context.Background()
			conn, err := db.Conn(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.ExecContext(ctx, `CREATE TABLE t (k TEXT PRIMARY KEY) WITHOUT ROWID`); err != nil {
				b.Fatal(err)
			}
			ins, err := conn.PrepareContext(ctx, `INSERT INTO t (k) VALUES (?) ON CONFLICT DO NOTHING`)
			if err != nil {
				b.Fatal(err)
			}
			defer ins.Close()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; {
				if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
					b.Fatal(err)
				}
				for j := 0; j < per && i < b.N; j, i = j+1, i+1 {
					if _, err := ins.ExecContext(ctx, "key:"+strconv.Itoa(i)); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "rows/s")
		})
	}
}

// BenchmarkReplay measures a Claim that finds its key completed (a
// duplicate delivery), with no cache in front of the store.
func BenchmarkReplay(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(b.TempDir(), "idem.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const keys = 1000
	for i := range keys {
		claimComplete(b, s, ctx, "receipt:"+strconv.Itoa(i), []byte(`{"id":"msg_0123456789"}`))
	}
	r := store.ClaimRequest{AttemptID: store.NewAttemptID(), Owner: "bench", Lease: 30 * time.Second, Retention: 24 * time.Hour}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			r := r
			r.Key = "receipt:" + strconv.Itoa(i%keys)
			res, err := s.Claim(ctx, r)
			if err != nil || res.Acquired || res.Record.Status != store.StatusCompleted {
				b.Fatalf("replay: %v %+v", err, res)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		var n atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r := r
				r.Key = "receipt:" + strconv.FormatInt(n.Add(1)%keys, 10)
				res, err := s.Claim(ctx, r)
				if err != nil || res.Acquired || res.Record.Status != store.StatusCompleted {
					b.Errorf("replay: %v %+v", err, res)
					return
				}
			}
		})
	})
}

// BenchmarkBatch measures ClaimBatch then FinishBatch of 100 new keys
// by 4 concurrent callers, as a consumer that claims what it received in
// one call does. One op is one key claimed and completed.
func BenchmarkBatch(b *testing.B) {
	const size, callers = 100, 4
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(b.TempDir(), "idem.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var next atomic.Int64
	rounds := (b.N + size - 1) / size
	var round atomic.Int64
	b.ResetTimer()
	start := time.Now()
	errs := make(chan error, callers)
	for range callers {
		go func() {
			reqs := make([]store.ClaimRequest, size)
			cs := make([]store.FinishRequest, size)
			for round.Add(1) <= int64(rounds) {
				for i := range reqs {
					reqs[i] = store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "receipt:" + strconv.FormatInt(next.Add(1), 10),
						Owner: "bench", Policy: store.AtLeastOnce, Lease: 30 * time.Second, Retention: time.Hour}
				}
				res, err := s.ClaimBatch(ctx, reqs)
				if err != nil {
					errs <- err
					return
				}
				for i, r := range res {
					if !r.Acquired {
						errs <- fmt.Errorf("%s not acquired", reqs[i].Key)
						return
					}
					cs[i] = store.FinishRequest{Key: reqs[i].Key, Fence: r.Record.Fence, AttemptID: r.Record.AttemptID,
						Outcome: store.OutcomeCompleted, Result: []byte("ok"), Retention: time.Hour}
				}
				failed, err := s.FinishBatch(ctx, cs)
				if err == nil {
					err = errors.Join(failed...)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range callers {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rounds*size)/time.Since(start).Seconds(), "keys/s")
}

// BenchmarkDo: Ledger.Do of a new key with a no-op fn, each call's own
// writes ("plain") or with idem.WithCoalescing(64) ("coalesced"), at 8
// and 64 callers. The store's writer already shares its commits among
// the writes queued meanwhile, so coalescing has little to add here.
func BenchmarkDo(b *testing.B) {
	for _, mode := range []string{"plain", "coalesced"} {
		for _, callers := range []int{8, 64} {
			b.Run(fmt.Sprintf("%s/callers=%d", mode, callers), func(b *testing.B) {
				ctx := context.Background()
				s, err := Open(ctx, filepath.Join(b.TempDir(), "idem.db"))
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				opts := []idem.Option{idem.WithLogger(slog.New(slog.DiscardHandler)), idem.WithRetention(time.Hour)}
				if mode == "coalesced" {
					opts = append(opts, idem.WithCoalescing(64))
				}
				l := idem.New(s, opts...)
				fn := func(context.Context) ([]byte, error) { return []byte("result"), nil }
				var next atomic.Int64
				b.ReportAllocs()
				b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
				b.ResetTimer()
				cpu0 := cputime.Self()
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						//idem:allow nondetkey each benchmark iteration is a new operation
						key := idem.Key("receipt", strconv.FormatInt(next.Add(1), 10))
						if _, err := l.Do(ctx, key, fn); err != nil {
							b.Errorf("Do: %v", err)
							return
						}
					}
				})
				elapsed := time.Since(start)
				cpu := cputime.Self() - cpu0
				b.StopTimer()
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
			})
		}
	}
}
