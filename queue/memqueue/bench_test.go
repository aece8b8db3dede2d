package memqueue_test

import (
	"testing"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/memqueue"
	"github.com/idemkit/idem/queue/queuetest"
)

// BenchmarkConsume measures the Consumer's own cost per message on a
// queue in memory with the ledger in memory: no network, no disk.
//
//	go test -run '^$' -bench Consume -benchtime 100000x ./queue/memqueue/
func BenchmarkConsume(b *testing.B) {
	queuetest.BenchmarkConsume(b, func(*testing.B) (queue.Source, queue.Publisher) {
		q := memqueue.New()
		return q, q
	})
}
