package sqsqueue_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqsqueue"
)

// Open a FIFO queue, publish with a dedup id, receive and ack. (The client
// here points at a local emulator; in production, build it from
// config.LoadDefaultConfig.)
func Example() {
	ctx := context.Background()
	client := sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String("http://127.0.0.1:9324"),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test"}, nil
		}),
	})
	q, err := sqsqueue.Open(ctx, client, "http://127.0.0.1:9324/123456789012/orders.fifo", sqsqueue.Options{
		DeadLetterURL: "http://127.0.0.1:9324/123456789012/orders-dlq.fifo",
	})
	if err != nil {
		log.Fatal(err)
	}
	p, err := q.Publish(ctx, queue.Outgoing{Body: []byte(`{"order":8891}`), GroupID: "customer-7", DedupID: "order:8891"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("published", p.ID, "duplicate:", p.Duplicate)

	ds, err := q.Receive(ctx, 10)
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range ds {
		m := d.Message()
		fmt.Printf("%s: %s (receive %d, group %s)\n", m.ID, m.Body, m.ReceiveCount, m.GroupID)
		if err := d.Ack(ctx); errors.Is(err, sqsqueue.ErrStaleReceipt) {
			log.Printf("ack came after the visibility timeout; %s may be delivered again", m.ID)
		}
	}
}
