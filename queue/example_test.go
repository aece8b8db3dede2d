package queue_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/memqueue"
	"github.com/idemkit/idem/store/memstore"
)

// A receipts worker (seed 000): the key is the order and user, not the
// broker's message id, so a producer's retry and a broker's redelivery are
// one operation. The second copy of order 42 is acked without a second mail.
func ExampleConsumer() {
	q := memqueue.New()
	ledger := idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler)))
	key := func(m queue.Message) (idem.OperationKey, error) {
		order, user, ok := strings.Cut(string(m.Body), " ")
		if !ok {
			return idem.OperationKey{}, fmt.Errorf("want \"<order> <user>\", got %q", m.Body)
		}
		return idem.Key("receipt", order, user), nil
	}
	sent := make(chan string, 10)
	send := func(ctx context.Context, m queue.Message) ([]byte, error) {
		sent <- string(m.Body)
		return []byte("msg-id-1"), nil
	}
	c, err := queue.NewConsumer(q, ledger, key, send, queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	q.Publish(ctx, queue.Outgoing{Body: []byte("42 alice")})
	q.Publish(ctx, queue.Outgoing{Body: []byte("42 alice")}) // the producer retried

	run, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- c.Run(run) }()
	for {
		if ready, held := q.Len(); ready+held == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	stop()
	<-done
	close(sent)
	for s := range sent {
		fmt.Println("sent receipt for", s)
	}
	// Output: sent receipt for 42 alice
}
