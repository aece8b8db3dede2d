package main

import (
	"context"
	"sync"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/memqueue"
)

// batchPublisher is implemented by queues that publish many messages in
// one call.
type batchPublisher interface {
	PublishBatch(ctx context.Context, ms []queue.Outgoing) ([]queue.Published, error)
}

// publisherFunc returns how the run publishes a batch to p: in one call
// where p can, else one Publish per message from up to conc goroutines.
func publisherFunc(p queue.Publisher, conc int) func(ctx context.Context, ms []queue.Outgoing) error {
	if bp, ok := p.(batchPublisher); ok {
		return func(ctx context.Context, ms []queue.Outgoing) error {
			_, err := bp.PublishBatch(ctx, ms)
			return err
		}
	}
	return func(ctx context.Context, ms []queue.Outgoing) error {
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			first error
			next  = make(chan queue.Outgoing)
		)
		for range min(conc, len(ms)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for m := range next {
					if _, err := p.Publish(ctx, m); err != nil {
						mu.Lock()
						if first == nil {
							first = err
						}
						mu.Unlock()
					}
				}
			}()
		}
		for _, m := range ms {
			next <- m
		}
		close(next)
		wg.Wait()
		return first
	}
}

const memQueueName = "queue/memqueue"

// newMemQueue returns queue/memqueue: the in-memory reference queue, for a
// run that measures the ledger and the consumer without a durable queue.
func newMemQueue() idemQueue {
	q := memqueue.New()
	return idemQueue{name: memQueueName, src: q, publish: publisherFunc(q, 1), close: func() error { return nil }}
}
