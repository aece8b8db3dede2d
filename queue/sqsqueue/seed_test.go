package sqsqueue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/queuetest"
	"github.com/idemkit/idem/queue/sqsqueue"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/dynamostore"
)

// TestSeed000 runs the receipts worker's three checks on production parts: an
// SQS queue (standard, and FIFO) and the dedupe ledger in a DynamoDB table
// (dynalite), whose conditional write is what two racing consumers meet.
// The conformance suite runs the same checks on a memstore ledger.
func TestSeed000(t *testing.T) {
	ep := testenv.Require(t, testenv.DynamoDB, "the receipts checks on SQS with a DynamoDB ledger (dynalite)")
	ddb := dynamodb.New(dynamodb.Options{Region: "us-east-1", BaseEndpoint: aws.String(ep),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "x", SecretAccessKey: "x"}, nil
		})})
	// A table per check, like a worker's one "email-sends" table: each check
	// starts from an empty ledger.
	newTable := func(t *testing.T) store.Store {
		table := "email-sends-" + randomID()
		if err := dynamostore.CreateTable(context.Background(), ddb, table); err != nil && !errors.Is(err, dynamostore.ErrTTLUnsupported) {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ddb.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
		})
		return dynamostore.New(ddb, table)
	}
	for _, fifo := range []bool{false, true} {
		name := "standard"
		if fifo {
			name = "fifo"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := client(t)
			queuetest.RunSeed(t, queuetest.Harness{
				New: func(t *testing.T, visibility time.Duration) (queue.Source, queue.Publisher) {
					url, _ := newQueue(t, c, queueSpec{fifo: fifo, visibility: visibility})
					q := open(t, c, url, sqsqueue.Options{})
					if fifo {
						return q, ownGroups{q}
					}
					return q, q
				},
				Store: newTable,
			})
		})
	}
}
