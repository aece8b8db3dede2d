package queue_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/memqueue"
	"github.com/idemkit/idem/store/memstore"
)

// A receipts worker: the key is the order and user, not the
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

// The same receipts worker with typed messages: each body is decoded once
// into a Job, which gives the key; the handler gets the Job and its key. A body
// that is not a Job, or a Job without an order, is dead-lettered with the
// reason; the handler never sees it.
func ExampleNewTypedConsumer() {
	type Job struct {
		OrderID string `json:"order_id"`
		UserID  string `json:"user_id"`
	}
	q := memqueue.New()
	ledger := idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler)))
	key := func(j Job) (idem.OperationKey, error) {
		if j.OrderID == "" {
			return idem.OperationKey{}, errors.New("the job has no order_id")
		}
		return idem.Key("receipt", j.OrderID, j.UserID), nil
	}
	sent := make(chan Job, 10)
	send := func(ctx context.Context, k idem.OperationKey, j Job) ([]byte, error) {
		// k (receipt/42/alice) is the idempotency key to give the mailer.
		sent <- j
		return []byte("msg-id-1"), nil
	}
	c, err := queue.NewTypedConsumer(q, ledger, queue.JSON[Job], key, send, queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, body := range []string{
		`{"order_id":"42","user_id":"alice"}`,
		`{"order_id":"42","user_id":"alice"}`, // the producer retried
		`{"order_id":`,                        // cut short
		`{"user_id":"bob"}`,                   // no order
	} {
		q.Publish(ctx, queue.Outgoing{Body: []byte(body)})
	}
	ds, _ := q.Receive(ctx, 10)
	c.HandleBatch(ctx, ds)
	close(sent)
	for j := range sent {
		fmt.Println("sent receipt for order", j.OrderID, "to", j.UserID)
	}
	var reasons []string // sorted: the batch's messages run concurrently
	for _, d := range q.DeadLetters() {
		reasons = append(reasons, d.Reason)
	}
	slices.Sort(reasons)
	for _, r := range reasons {
		fmt.Println("dead letter:", r)
	}
	// Output:
	// sent receipt for order 42 to alice
	// dead letter: undecodable: no operation key: decoding: unexpected end of JSON input
	// dead letter: undecodable: no operation key: key of the decoded value: the job has no order_id
}
