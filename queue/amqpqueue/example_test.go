package amqpqueue_test

import (
	"context"
	"log"
	"strings"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/amqpqueue"
	"github.com/idemkit/idem/store/memstore"
	amqp "github.com/rabbitmq/amqp091-go"
)

// A consumer of a RabbitMQ quorum queue whose receipts are sent once per
// order. RabbitMQ delivers both copies of a message published twice; the
// ledger, keyed by the order, runs the effect for the first and replays it
// for the second.
func Example() {
	ctx := context.Background()
	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	cfg := amqpqueue.Config{Queue: "orders", Quorum: true} // dead letters go to "orders.dead-letter"
	if err := amqpqueue.Declare(ctx, conn, cfg); err != nil {
		log.Fatal(err)
	}
	src, err := amqpqueue.NewSource(ctx, conn, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	pub, _ := amqpqueue.NewPublisher(conn, cfg)
	defer pub.Close()
	if _, err := pub.Publish(ctx, queue.Outgoing{Body: []byte("order-8891 user-7")}); err != nil {
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

// A Source and a Publisher that dial again when the connection is lost (a
// broker restart, a dropped network): the Consumer's receive backoff paces
// the attempts, and a message handled but not acked before the loss comes
// back as a replay. Each owns, and closes, the connections it dials.
func ExampleNewSourceDial() {
	ctx := context.Background()
	dial := amqpqueue.DialURL("amqp://guest:guest@127.0.0.1:5672/")
	cfg := amqpqueue.Config{Queue: "orders", Quorum: true}
	src, err := amqpqueue.NewSourceDial(ctx, dial, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	pub, _ := amqpqueue.NewPublisherDial(dial, cfg)
	defer pub.Close()
	if _, err := pub.Publish(ctx, queue.Outgoing{Body: []byte("order-8891 user-7")}); err != nil {
		log.Print(err) // not stored, or not confirmed: publish again
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
	_ = c.Run(ctx) // until ctx is done, across lost connections
}
