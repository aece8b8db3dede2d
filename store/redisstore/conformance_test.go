package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/store"
	"github.com/redis/go-redis/v9"
)

// harness runs the conformance suite on stores under prefixes of their own
// on the test server. With clocks, each test's stores share a clock offset
// that Advance moves; without, they use the server's clock as it is.
func harness(t testing.TB, clocks *testClocks) idemtest.Harness {
	testURL(t)
	h := idemtest.Harness{
		New: func(t testing.TB) store.Store { return newTestStore(t, clocks) },
		Corrupt: func(t testing.TB, s store.Store, key string) {
			rs := s.(*Store)
			if err := testClient(t).HSet(context.Background(), rs.rkey(key), "st", "bogus").Err(); err != nil {
				t.Fatalf("corrupting %q: %v", key, err)
			}
		},
		Unreachable: func(t testing.TB) store.Store {
			s := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, DialTimeout: time.Second}))
			s.own = true
			return s
		},
		Parallelism: 25, // 50 goroutines on 2 CPUs
		// A network round trip under a loaded CI run can outlast a third of
		// the default 300 ms lease (an extension timed out after one
		// injected failure, and the lease was rightly given up).
		HeartbeatLease: time.Second,
	}
	if clocks != nil {
		h.Advance = clocks.advance
		h.Locator = func(t testing.TB) string { return withPrefixURL(t, newPrefix(t)) }
		h.Open = func(loc string) (store.Store, error) { return Open(context.Background(), loc) }
	}
	return h
}

// TestConformance runs the suite with a clock the tests advance, and the
// tests of separate processes (on the real clock, through Open).
func TestConformance(t *testing.T) {
	idemtest.TestStore(t, harness(t, new(testClocks)))
}

// TestConformanceRealClock runs the suite on the server's clock as it is:
// the suite sleeps through short leases and retentions, and Redis's own
// expiry (PEXPIREAT) runs alongside the scripts' checks.
func TestConformanceRealClock(t *testing.T) {
	if testing.Short() {
		t.Skip("sleeps through leases; skipped with -short")
	}
	idemtest.TestStore(t, harness(t, nil))
}
