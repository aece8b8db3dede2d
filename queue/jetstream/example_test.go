package jetstream_test

import (
	"context"
	"log"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	idemjs "github.com/idemkit/idem/queue/jetstream"
	"github.com/idemkit/idem/store/memstore"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A consumer of a JetStream work queue whose receipts are sent once per
// order, whatever the stream redelivers. The stream, its dead-letter stream
// and the durable pull consumer are set up once, with the JetStream API.
func Example() {
	ctx := context.Background()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	_, _ = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders"},
		Retention: jetstream.WorkQueuePolicy, Duplicates: 2 * time.Minute})
	_, _ = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "ORDERS_DL", Subjects: []string{"orders.dead-letter"}})
	_, _ = js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "receipts",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 3 * time.Minute})

	src, err := idemjs.NewSource(ctx, js, idemjs.SourceConfig{Stream: "ORDERS", Consumer: "receipts",
		DeadLetterSubject: "orders.dead-letter"})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	pub, _ := idemjs.NewPublisher(js, "orders")
	// The dedup id makes a republish inside the stream's window a no-op.
	if _, err := pub.Publish(ctx, queue.Outgoing{Body: []byte("order-8891 user-7"), DedupID: "order-8891"}); err != nil {
		log.Fatal(err)
	}

	byOrder := func(m queue.Message) (idem.OperationKey, error) {
		order, user, _ := strings.Cut(string(m.Body), " ")
		return idem.Key("receipt", order, user), nil
	}
	c, err := queue.NewConsumer(src, idem.New(memstore.New()), byOrder,
		func(ctx context.Context, m queue.Message) ([]byte, error) {
			return []byte("sent"), nil // send the receipt
		})
	if err != nil {
		log.Fatal(err)
	}
	_ = c.Run(ctx) // until ctx is done
}
