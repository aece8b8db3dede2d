package lambdasqs

import (
	"context"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/idemkit/idem/queue"
)

// Handler returns a Lambda handler for SQS events that runs c over each
// event's records with [queue.Consumer.HandleBatch] and reports the
// records not done in the response's BatchItemFailures. Handlers run under
// the invocation's context with its deadline moved earlier by the margin
// ([WithMargin]), so the handler timeout and the ledger's lease end before
// Lambda stops the function. It never returns an error: a record that
// could not be handled is reported as a failure.
func Handler(c *queue.Consumer, opts ...Option) func(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
	var cfg config
	cfg.margin = DefaultMargin
	for _, o := range opts {
		o(&cfg)
	}
	return func(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
		b := newBatch(ev, cfg)
		if dl, ok := ctx.Deadline(); ok {
			m := max(0, min(cfg.margin, time.Until(dl)/10))
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, dl.Add(-m))
			defer cancel()
		}
		c.HandleBatch(ctx, b.Deliveries())
		return b.Response(), nil
	}
}

// Source returns a [queue.Source] for [queue.NewConsumer] in a Lambda
// function, where messages arrive as events rather than by receiving: its
// Receive blocks until its context is done, and its Visibility is 0
// (Lambda bounds the work by the invocation's deadline instead). Use the
// Consumer with [Handler], not with Run.
func Source() queue.Source { return eventSource{} }

type eventSource struct{}

func (eventSource) Receive(ctx context.Context, _ int) ([]queue.Delivery, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (eventSource) Visibility() time.Duration { return 0 }
