// Package testredis opens a Redis ledger store for tests and benchmarks
// that leaves nothing behind.
package testredis

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/queue/queuetest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/redisstore"
)

// Open opens a redisstore on the server url names, under a key prefix of
// its own whose keys are deleted when tb ends.
func Open(tb testing.TB, url string) *redisstore.Store {
	tb.Helper()
	s, err := redisstore.Open(context.Background(), url, redisstore.WithPrefix("idemt:bench:"+strconv.FormatInt(time.Now().UnixNano(), 36)+":"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx := context.Background()
		c := s.Client()
		for cursor := uint64(0); ; {
			keys, next, err := c.Scan(ctx, cursor, s.Prefix()+"*", 1000).Result()
			if err != nil {
				tb.Logf("cleanup of %s*: %v", s.Prefix(), err)
				break
			}
			if len(keys) > 0 {
				c.Unlink(ctx, keys...)
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
		s.Close()
	})
	return s
}

// Ledgers are the Redis ledgers of the queue adapters' consume benchmarks
// (issue 4: the ledger on Redis against the consumer without it):
// redisstore, and redisstore with calls coalesced (idem.WithCoalescing).
// The benchmark that opens one is skipped without IDEM_TEST_REDIS.
func Ledgers() []queuetest.Ledger {
	open := func(b *testing.B) store.Store {
		return Open(b, testenv.Require(b, testenv.Redis, "the benchmark with the ledger on Redis"))
	}
	return []queuetest.Ledger{
		{Name: "redis", Open: open},
		{Name: "redis-coalesced", Open: open, Options: []idem.Option{idem.WithCoalescing(64)}},
	}
}
