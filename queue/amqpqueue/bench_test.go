package amqpqueue

import (
	"testing"

	"github.com/idemkit/idem/internal/testredis"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/queuetest"
)

// BenchmarkConsume measures the consume rate of b.N messages published
// beforehand (to a classic or a quorum queue, prefetch 32), through
// queue.Consumer (concurrency 8 and 32, batches of 10, a handler that does
// nothing)// memory (the consumer's own cost, the ledger nearly free), and a plain
// receive-and-ack loop of as many workers on the same Source (no consumer, no
// ledger). Target of the issue: the Redis ledger costs at most 30% of the
// rate without it.
//
//	IDEM_TEST_AMQP=amqp://guest:guest@127.0.0.1:5672/ IDEM_TEST_REDIS=redis://127.0.0.1:6379/0 \
//		go test -run '^$' -bench Consume -benchtime 5000x -count 3 ./queue/amqpqueue/
func BenchmarkConsume(b *testing.B) {
	amqpURL(b)
	for _, quorum := range []bool{false, true} {
		name := "classic"
		if quorum {
			name = "quorum"
		}
		b.Run(name, func(b *testing.B) {
			queuetest.BenchmarkConsume(b, func(b *testing.B) (queue.Source, queue.Publisher) {
				f := newFixture(b, quorum)
				return f.source(b, f.conn), f.publisher(b, f.conn)
			}, testredis.Ledgers()...)
		})
	}
}
