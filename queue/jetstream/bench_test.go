package jetstream

import (
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testredis"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/queuetest"
)

// BenchmarkConsume measures the consume rate of b.N messages published
// beforehand, through queue.Consumer (concurrency 8 and 32, batches of 10, a
// handler that does nothing) with the ledger on Redis (queuetest.BenchmarkConsume), the same consumer
// with the ledger in memory (the consumer's own cost, the ledger nearly
// free), and a plain receive-and-ack loop of as many workers on the same Source
// (no consumer, no ledger). Target of the issue: the Redis ledger costs at
// most 30% of the rate without it.
//
//	IDEM_TEST_NATS=nats://127.0.0.1:4222 IDEM_TEST_REDIS=redis://127.0.0.1:6379/0 \
//		go test -run '^$' -bench Consume -benchtime 5000x -count 3 ./queue/jetstream/
func BenchmarkConsume(b *testing.B) {
	url := natsURL(b)
	newQueue := func(b *testing.B) (queue.Source, queue.Publisher) {
		_, js := connect(b, url)
		f := newFixture(b, js, fixtureOpts{ackWait: time.Minute})
		return f.source(b, js), f.publisher(b, js)
	}
	queuetest.BenchmarkConsume(b, newQueue, redisLedgers()...)
}

// redisLedgers are the ledgers of the comparison: redisstore, and
// redisstore with calls coalesced (idem.WithCoalescing).
func redisLedgers() []queuetest.Ledger {
	open := func(b *testing.B) idem.Store {
		return testredis.Open(b, testenv.Require(b, testenv.Redis, "the benchmark with the ledger on Redis"))
	}
	return []queuetest.Ledger{
		{Name: "redis", Open: open},
		{Name: "redis-coalesced", Open: open, Options: []idem.Option{idem.WithCoalescing(64)}},
	}
}
