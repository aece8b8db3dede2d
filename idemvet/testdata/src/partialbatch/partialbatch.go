// Package partialbatch holds partialbatch's fixtures.
package partialbatch

import (
	"context"
	"fmt"

	"github.com/aws/aws-lambda-go/events"
)

func send(ctx context.Context, body string) error { return nil }

func handler(ctx context.Context, ev events.SQSEvent) error { // want `this SQS batch handler returns only error: one failed record makes the whole batch come back`
	for _, rec := range ev.Records {
		if err := send(ctx, rec.Body); err != nil {
			return fmt.Errorf("record %s: %w", rec.MessageId, err)
		}
	}
	return nil
}

var literal = func(ctx context.Context, ev *events.SQSEvent) error { // want `returns only error`
	return send(ctx, ev.Records[0].Body)
}

// Good: the failed records are reported one by one.
func partial(ctx context.Context, ev events.SQSEvent) (events.SQSEventResponse, error) {
	var resp events.SQSEventResponse
	for _, rec := range ev.Records {
		if err := send(ctx, rec.Body); err != nil {
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: rec.MessageId})
		}
	}
	return resp, nil
}

// Good: never fails the batch.
func neverFails(ctx context.Context, ev events.SQSEvent) error {
	return nil
}
