package lambdasqs_test

import (
	"context"
	"encoding/json"
	"log"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/lambdasqs"
	"github.com/idemkit/idem/store/sqlitestore"
)

// A Lambda function that sends each order's receipt once, however often
// SQS delivers the message. (A real function keeps its ledger in a shared
// store, such as PostgreSQL or DynamoDB; SQLite keeps the example short.)
func Example() {
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, "/tmp/idem.db")
	if err != nil {
		log.Fatal(err)
	}
	key := func(m queue.Message) (idem.OperationKey, error) {
		var order struct {
			ID string `json:"order_id"`
		}
		if err := json.Unmarshal(m.Body, &order); err != nil {
			return idem.OperationKey{}, err
		}
		return idem.Key("receipt", order.ID), nil
	}
	send := func(ctx context.Context, m queue.Message) ([]byte, error) {
		return []byte("sent"), nil // the effect: send the receipt
	}
	c, err := queue.NewConsumer(lambdasqs.Source(), idem.New(store), key, send)
	if err != nil {
		log.Fatal(err)
	}
	lambda.Start(lambdasqs.Handler(c))
}
