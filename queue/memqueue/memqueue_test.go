package memqueue_test

import (
	"testing"
	"time"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/memqueue"
	"github.com/idemkit/idem/queue/queuetest"
)

func TestConformance(t *testing.T) {
	queuetest.Run(t, queuetest.Harness{
		New: func(t *testing.T, vis time.Duration) (queue.Source, queue.Publisher) {
			q := memqueue.New(memqueue.WithVisibility(vis))
			return q, q
		},
		DeadLetters: func(t *testing.T, src queue.Source) []queuetest.DeadLetter {
			var out []queuetest.DeadLetter
			for _, d := range src.(*memqueue.Queue).DeadLetters() {
				out = append(out, queuetest.DeadLetter{Message: d.Message, Reason: d.Reason})
			}
			return out
		},
		Features: queuetest.Features{FIFO: true, DedupWindow: true, Delay: true, RetryDelay: true, DeadLetter: true},
	})
}
