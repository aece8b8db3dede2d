package jetstream

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/queuetest"
)

// TestConformance runs the queue conformance suite against JetStream: a
// work-queue stream with a dedup window, a durable pull consumer whose ack
// wait is the suite's visibility, and a dead-letter stream.
func TestConformance(t *testing.T) {
	url := natsURL(t)
	var mu sync.Mutex
	fixtures := map[queue.Source]*fixture{}
	queuetest.Run(t, queuetest.Harness{
		New: func(t *testing.T, visibility time.Duration) (queue.Source, queue.Publisher) {
			_, js := connect(t, url)
			f := newFixture(t, js, fixtureOpts{ackWait: visibility})
			src := f.source(t, js)
			mu.Lock()
			fixtures[src] = f
			mu.Unlock()
			return src, f.publisher(t, js)
		},
		DeadLetters: func(t *testing.T, src queue.Source) []queuetest.DeadLetter {
			mu.Lock()
			f := fixtures[src]
			mu.Unlock()
			var out []queuetest.DeadLetter
			for _, m := range f.deadLetters(t) {
				attrs := map[string]string{}
				for k, v := range m.Header {
					attrs[k] = v[0]
				}
				rc, _ := strconv.Atoi(m.Header.Get(HeaderDeadLetterDeliveries))
				out = append(out, queuetest.DeadLetter{
					Message: queue.Message{ID: m.Header.Get(HeaderDeadLetterSequence), Body: m.Data, Attributes: attrs,
						ReceiveCount: rc, Published: m.Time},
					Reason: m.Header.Get(HeaderDeadLetterReason),
				})
			}
			return out
		},
		Features: queuetest.Features{DedupWindow: true, RetryDelay: true, DeadLetter: true, LoadMessages: 10_000},
	})
}
