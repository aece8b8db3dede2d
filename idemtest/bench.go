package idemtest

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// BenchmarkStore measures the store h makes, directly and under an
// idem.Ledger:
//
//   - claim+complete/new-keys: Claim then Complete of fresh keys from
//     parallel goroutines, at the Store level; one pair is one op.
//   - do/new-keys: Ledger.Do of fresh keys from parallel goroutines.
//   - replay/store: Ledger.Do of a completed key, answered by the store.
//   - replay/cache: Ledger.Do of a completed key, answered by the Ledger's
//     local cache (idem.WithCache); should not allocate.
//
// Each reports ops/s beside ns/op. Harness.Parallelism, when set, is the
// parallel benchmarks' goroutines per GOMAXPROCS.
func BenchmarkStore(b *testing.B, h Harness) {
	if h.New == nil {
		b.Fatal("idemtest: Harness.New is required")
	}
	b.Run("claim+complete/new-keys", func(b *testing.B) {
		s := newStore(b, h)
		ctx := context.Background()
		var prefix atomic.Int64
		b.ReportAllocs()
		if h.Parallelism > 0 {
			b.SetParallelism(h.Parallelism)
		}
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			keys := newKeyGen(&prefix)
			r := store.ClaimRequest{AttemptID: store.NewAttemptID(), Owner: "bench", Policy: idem.AtLeastOnce, Lease: 30 * time.Second, Retention: time.Hour}
			result := []byte("result")
			for pb.Next() {
				r.Key = keys.next()
				cr, err := s.Claim(ctx, r)
				if err != nil {
					b.Fatalf("Claim: %v", err)
				}
				if !cr.Acquired {
					b.Fatalf("Claim(%q) of a new key: not acquired", r.Key)
				}
				if err := s.Finish(ctx, store.FinishRequest{Key: r.Key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: result, Retention: time.Hour}); err != nil {
					b.Fatalf("Complete: %v", err)
				}
			}
		})
		reportOps(b)
	})

	b.Run("do/new-keys", func(b *testing.B) {
		s := newStore(b, h)
		l := idem.New(s, idem.WithLogger(discard), idem.WithOwner("bench"))
		ctx := context.Background()
		var prefix atomic.Int64
		b.ReportAllocs()
		if h.Parallelism > 0 {
			b.SetParallelism(h.Parallelism)
		}
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			keys := newKeyGen(&prefix)
			fn := func(context.Context) ([]byte, error) { return []byte("result"), nil }
			for pb.Next() {
				res, err := l.Do(ctx, idem.RawKey(keys.next()), fn)
				if err != nil {
					b.Fatalf("Do: %v", err)
				}
				if res.Replayed {
					b.Fatal("Do of a new key replayed")
				}
			}
		})
		reportOps(b)
	})

	replay := func(b *testing.B, opts ...idem.Option) {
		s := newStore(b, h)
		l := idem.New(s, append([]idem.Option{idem.WithLogger(discard), idem.WithOwner("bench")}, opts...)...)
		ctx := context.Background()
		key := idem.Key("bench", "replay")
		fn := func(context.Context) ([]byte, error) { return []byte("result"), nil }
		if _, err := l.Do(ctx, key, fn); err != nil {
			b.Fatalf("Do: %v", err)
		}
		b.ReportAllocs()
		for b.Loop() {
			res, err := l.Do(ctx, key, fn)
			if err != nil {
				b.Fatalf("Do: %v", err)
			}
			if !res.Replayed {
				b.Fatal("Do of a completed key did not replay")
			}
		}
		reportOps(b)
	}
	b.Run("replay/store", func(b *testing.B) { replay(b) })
	b.Run("replay/cache", func(b *testing.B) { replay(b, idem.WithCache(1024)) })
}

// reportOps adds ops/s to b's results.
func reportOps(b *testing.B) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(b.N)/s, "ops/s")
	}
}

// keyGen makes keys no other goroutine makes: "bench:<prefix>:<n>".
type keyGen struct {
	buf []byte
	n   int
	pre int
}

func newKeyGen(prefix *atomic.Int64) *keyGen {
	g := &keyGen{buf: make([]byte, 0, 48)}
	g.buf = append(g.buf, "bench:"...)
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
