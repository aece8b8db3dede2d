package redisstore

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/cputime"
	"github.com/idemkit/idem/store"
	"github.com/redis/go-redis/v9"
)

// The benchmarks run 50 concurrent callers, unpipelined, and are compared
// with redis-benchmark's SET NX PX of random keys at 50 clients (the
// engine's limit on this machine), which BenchmarkEngineSetNX runs in the
// same session when redis-benchmark is installed:
//
//	redis-benchmark -h 127.0.0.1 -p 6379 -c 50 -n 200000 -r 1000000 -P 1 -q SET __rand_int__ v NX PX 60000
//	IDEM_TEST_REDIS=redis://127.0.0.1:6379/0 go test -run '^$' \
//		-bench 'EngineSetNX|Claim$|ClaimComplete$' -benchtime 200000x ./store/redisstore/
//
// Targets of issue 3: Claim ≥ 0.8× and Claim+Complete (two round trips)
// ≥ 0.4× redis-benchmark's rate. On a machine shared with other work, run
// the engine and the store back to back, more than once, and compare the
// pairs.

// BenchmarkEngineSetNX runs redis-benchmark (SET __rand_int__ v NX PX
// 60000, 50 clients, unpipelined, b.N requests) against the test server
// and reports its rate: the engine's limit beside the store's figures.
func BenchmarkEngineSetNX(b *testing.B) {
	redisBenchmark(b, "SET", "idem:engine:__rand_int__", "v", "NX", "PX", "60000")
}

// BenchmarkEngineScripts runs the store's claim script from redis-benchmark
// (50 clients, unpipelined, a new key each), with no Go client in the way,
// beside SET NX PX and two scripts that only bound what any claim script
// can do: "lua-set" runs SET NX PX in Lua, given the claim's eleven
// arguments, and "lua-time-set" reads TIME first, as every claim on the
// store's clock must. Their rates over "set-nx-px" are the ceiling of a claim's ratio
// (issue 3 asks 0.8×), whatever the Go side does:
//
//	IDEM_TEST_REDIS=... go test -run '^$' -bench EngineScripts -benchtime 200000x ./store/redisstore/
func BenchmarkEngineScripts(b *testing.B) {
	c := testClient(b)
	ctx := context.Background()
	load := func(src string) string {
		sha, err := c.ScriptLoad(ctx, src).Result()
		if err != nil {
			b.Fatal(err)
		}
		return sha
	}
	// The claim's ARGV (see claimScript): no clock offset, no keep-expired
	// period, a call id, an attempt id, owner, correlation, policy, a 30 s
	// lease, a 60 s retention (the keys go away a minute later), no
	// fingerprint, no take.
	args := []string{"0", "0", "bench-call-id", store.NewAttemptID(), "bench", "bench", "at_least_once", "30000000", "60000000", "", "0"}
	eval := func(src string) func(key string) []string {
		sha := load(src)
		return func(key string) []string { return append([]string{"EVALSHA", sha, "1", key}, args...) }
	}
	for _, x := range []struct {
		name string
		cmd  func(key string) []string
	}{
		{"set-nx-px", func(key string) []string { return []string{"SET", key, "v", "NX", "PX", "60000"} }},
		{"lua-set", eval(`return redis.call('SET', KEYS[1], 'v', 'NX', 'PX', 60000)`)},
		{"lua-time-set", eval(`local t = redis.call('TIME') return redis.call('SET', KEYS[1], 'v', 'NX', 'PX', 60000)`)},
		{"claim-script", eval(claimScript)},
	} {
		// Each its own keys: the claims' hashes are not the SETs' strings.
		cmd := x.cmd("idem:engine:" + x.name + ":__rand_int__")
		b.Run(x.name, func(b *testing.B) { redisBenchmark(b, cmd...) })
	}
}

// redisBenchmark runs redis-benchmark's command cmd (its __rand_int__ a
// random number below 10^8) with 50 clients, unpipelined, b.N requests
// (at least 10,000), against the test server, and reports its rate.
func redisBenchmark(b *testing.B, cmd ...string) {
	o, err := redis.ParseURL(testURL(b))
	if err != nil {
		b.Fatal(err)
	}
	path, err := exec.LookPath("redis-benchmark")
	if err != nil {
		b.Skip("redis-benchmark is not installed")
	}
	host, port, err := net.SplitHostPort(o.Addr)
	if err != nil {
		b.Fatal(err)
	}
	n := max(b.N, 10000)
	args := []string{"-h", host, "-p", port, "--dbnum", strconv.Itoa(o.DB), "-c", strconv.Itoa(callers),
		"-n", strconv.Itoa(n), "-r", "100000000", "-P", "1", "-q"}
	if o.Password != "" {
		args = append(args, "-a", o.Password)
	}
	run := exec.Command(path, append(args, cmd...)...)
	b.ResetTimer()
	out, err := run.CombinedOutput()
	b.StopTimer()
	if err != nil {
		b.Fatalf("redis-benchmark: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`([0-9.]+) requests per second`).FindAllSubmatch(out, -1)
	if len(m) == 0 {
		b.Fatalf("redis-benchmark said:\n%s", out)
	}
	rps, _ := strconv.ParseFloat(string(m[len(m)-1][1]), 64)
	b.ReportMetric(rps, "ops/s")
	b.ReportMetric(1e9/rps, "ns/op")
}

// callers is the number of concurrent callers of the benchmarks.
const callers = 50

// benchStore returns a store under a fresh prefix on a client of its own
// with one connection per caller.
func benchStore(b *testing.B) *Store {
	b.Helper()
	o, err := redis.ParseURL(testURL(b))
	if err != nil {
		b.Fatal(err)
	}
	o.PoolSize = callers
	o.MinIdleConns = callers
	o.PipelinePoolSize = callers
	o.ContextTimeoutEnabled = true
	client := redis.NewClient(o)
	b.Cleanup(func() { client.Close() })
	s := New(client, WithPrefix(newPrefix(b)))
	if err := s.Ping(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// runCallers runs body from callers goroutines and reports ops/s (and,
// with perOp keys per operation, keys/s).
func runCallers(b *testing.B, perOp int, body func(pb *testing.PB, keys *keyGen)) {
	runCallersN(b, callers, perOp, body)
}

// runCallersN is runCallers with n callers (at most callers: the store's
// pool has that many connections). It also reports this process's CPU
// time per op, which, unlike the rate, hardly changes when other processes
// share the machine.
func runCallersN(b *testing.B, n, perOp int, body func(pb *testing.PB, keys *keyGen)) {
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
		if perOp > 1 {
			b.ReportMetric(float64(b.N*perOp)/s, "keys/s")
		}
	}
}

// benchRequest is a claim of the benchmarks; each sets Key and, as a
// caller does for every claim, a new AttemptID.
func benchRequest() store.ClaimRequest {
	return store.ClaimRequest{Owner: "bench", Correlation: "bench", Policy: store.AtLeastOnce, Lease: 30 * time.Second, Retention: time.Hour}
}

// BenchmarkClaim: Claim of a new key, one script, one round trip.
func BenchmarkClaim(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	runCallers(b, 1, func(pb *testing.PB, keys *keyGen) {
		r := benchRequest()
		for pb.Next() {
			r.Key, r.AttemptID = keys.next(), store.NewAttemptID()
			if cr, err := s.Claim(ctx, r); err != nil || !cr.Acquired {
				b.Errorf("Claim(%q): acquired %v, %v", r.Key, cr.Acquired, err)
				return
			}
		}
	})
}

// BenchmarkClaimComplete: Claim then Finish (completed) of a new key, one
// pair per op: two scripts, two round trips.
func BenchmarkClaimComplete(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	result := []byte("result")
	runCallers(b, 1, func(pb *testing.PB, keys *keyGen) {
		r := benchRequest()
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
}

// BenchmarkDo: Ledger.Do of a new key with a no-op fn (a claim and a
// completion), each call's own round trips ("plain") or sharing them with
// the calls made at the same time ("coalesced", idem.WithCoalescing(64):
// concurrent claims go as one pipeline, and so do completions), at 8 and
// 50 callers.
func BenchmarkDo(b *testing.B) {
	for _, mode := range []string{"plain", "coalesced"} {
		for _, n := range []int{8, callers} {
			b.Run(fmt.Sprintf("%s/callers=%d", mode, n), func(b *testing.B) {
				opts := []idem.Option{idem.WithLogger(slog.New(slog.DiscardHandler)), idem.WithRetention(time.Hour)}
				if mode == "coalesced" {
					opts = append(opts, idem.WithCoalescing(64))
				}
				l := idem.New(benchStore(b), opts...)
				ctx := context.Background()
				fn := func(context.Context) ([]byte, error) { return []byte("result"), nil }
				runCallersN(b, n, 1, func(pb *testing.PB, keys *keyGen) {
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

// BenchmarkClaimBatch10: ClaimBatch of 10 new keys, one pipeline per op.
func BenchmarkClaimBatch10(b *testing.B) {
	const size = 10
	s := benchStore(b)
	ctx := context.Background()
	runCallers(b, size, func(pb *testing.PB, keys *keyGen) {
		reqs := make([]store.ClaimRequest, size)
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
			for _, r := range res {
				if !r.Acquired {
					b.Errorf("ClaimBatch: %q not acquired", r.Record.Key)
					return
				}
			}
		}
	})
}

// BenchmarkRawSetNX: SET key v NX PX 60000 of a new key through the same
// client, for the cost of go-redis and of this process beside
// redis-benchmark's figure.
func BenchmarkRawSetNX(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	runCallers(b, 1, func(pb *testing.PB, keys *keyGen) {
		for pb.Next() {
			if err := s.client.SetNX(ctx, s.rkey(keys.next()), "v", time.Minute).Err(); err != nil {
				b.Errorf("SET NX: %v", err)
				return
			}
		}
	})
}

// BenchmarkConformance runs idemtest's benchmarks on the store.
func BenchmarkConformance(b *testing.B) {
	h := harness(b, nil)
	h.New = func(t testing.TB) store.Store { return benchStore(t.(*testing.B)) }
	idemtest.BenchmarkStore(b, h)
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
