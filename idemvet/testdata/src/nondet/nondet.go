// Package nondet holds nondetkey's fixtures.
package nondet

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/idemkit/idem"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/ksuid"
)

type event struct {
	ID      string `json:"id"`
	OrderID string `json:"order_id"`
}

// forward is the seed's webhook receiver forwarding onto a FIFO queue
// (ported from TypeScript): the group id is right, the dedup id is new on
// every call.
func forward(ctx context.Context, c *sqs.Client, queueURL string, ev event) error {
	payload, _ := json.Marshal(ev)
	_, err := c.SendMessage(ctx, &sqs.SendMessageInput{
		QueueUrl:               aws.String(queueURL),
		MessageBody:            aws.String(string(payload)),
		MessageGroupId:         aws.String(ev.ID),
		MessageDeduplicationId: aws.String(fmt.Sprintf("%d-%f", time.Now().UnixMilli(), rand.Float64())), // want `SQS MessageDeduplicationId is derived from time.Now \(line 41\), which differs on every call`
	})
	return err
}

// forwardFixed is the seed's fix: the operation, not the delivery.
func forwardFixed(ctx context.Context, c *sqs.Client, queueURL string, ev event) error {
	payload, _ := json.Marshal(ev)
	_, err := c.SendMessage(ctx, &sqs.SendMessageInput{
		QueueUrl:               aws.String(queueURL),
		MessageBody:            aws.String(string(payload)),
		MessageGroupId:         aws.String(ev.ID),
		MessageDeduplicationId: aws.String(ev.ID),
	})
	return err
}

func batchEntry(body string) types.SendMessageBatchRequestEntry {
	id := uuid.NewString()
	return types.SendMessageBatchRequestEntry{
		Id:                     aws.String("0"),
		MessageBody:            aws.String(body),
		MessageDeduplicationId: &id, // want `MessageDeduplicationId is derived from uuid.NewString \(line 59\)`
	}
}

func assigned(in *sqs.SendMessageInput) {
	stamp := strconv.FormatInt(time.Now().UnixNano(), 10)
	in.MessageDeduplicationId = aws.String("job-" + stamp) // want `derived from time.Now`
}

func keys(ctx context.Context, l *idem.Ledger, ev event) {
	// Generated inside the handler instead of derived from the request.
	key := idem.Key("receipt", uuid.New().String()) // want `idem.Key is derived from uuid.New`
	l.Do(ctx, key, nil)

	id := uuid.Must(uuid.NewRandom())
	l.Do(ctx, idem.RawKey(id.String()), nil) // want `idem.RawKey is derived from uuid.NewRandom`

	var b strings.Builder
	b.WriteString(ev.OrderID)
	b.WriteString(time.Now().Format(time.RFC3339))
	l.Do(ctx, idem.Key("receipt", b.String()), nil) // want `derived from time.Now`

	// Good: the business identifiers.
	l.Do(ctx, idem.Key("receipt", ev.OrderID), nil)
	// Good: a name-based uuid is the same for the same name.
	l.Do(ctx, idem.Key("receipt", uuid.NewSHA1(uuid.NameSpaceURL, []byte(ev.OrderID)).String()), nil)
	// Good: a uuid parsed from the request.
	u, _ := uuid.Parse(ev.ID)
	l.Do(ctx, idem.Key("receipt", u.String()), nil)
}

type job struct {
	OrderID string
	Queued  time.Time
}

func fieldSensitive(ctx context.Context, l *idem.Ledger, orderID string) {
	j := job{OrderID: orderID, Queued: time.Now()}
	l.Do(ctx, idem.Key("ship", j.OrderID), nil)       // good: the time is in another field
	l.Do(ctx, idem.Key("ship", j.Queued.Unix()), nil) // want `derived from time.Now`
}

var published int64

func counters(ctx context.Context, l *idem.Ledger, items []string) {
	n := atomic.AddInt64(&published, 1)
	l.Do(ctx, idem.Key("publish", n), nil) // want `derived from a counter \(atomic.AddInt64\)`
	seq++
	l.Do(ctx, idem.Key("publish", seq), nil) // want `derived from the counter seq`
	// Good: a position inside one business object is part of its identity.
	for i := range items {
		l.Do(ctx, idem.Key("line", items[i], i), nil)
	}
}

var seq int

func brokers(ctx context.Context, js nats.JetStreamContext, js2 jetstream.JetStream, m *nats.Msg, ev event) {
	js.Publish("orders", nil, nats.MsgId(ksuid.New().String()))                             // want `nats.MsgId is derived from ksuid.New`
	js2.Publish(ctx, "orders", nil, jetstream.WithMsgID(fmt.Sprint(time.Now().UnixNano()))) // want `jetstream.WithMsgID is derived from time.Now`
	m.Header.Set("Nats-Msg-Id", uuid.NewString())                                           // want `the Nats-Msg-Id header is derived from uuid.NewString`
	js.Publish("orders", nil, nats.MsgId(ev.ID))                                            // good
	m.Header.Set("Nats-Msg-Id", ev.ID)                                                      // good
	m.Header.Set("Trace-Id", uuid.NewString())                                              // good: not a key
}

func client(req *http.Request, ev event) {
	req.Header.Set("Idempotency-Key", uuid.NewString())    // want `the Idempotency-Key header is derived from uuid.NewString`
	req.Header.Set("Idempotency-Key", "order-"+ev.OrderID) // good
}

func tasks(ev event) []*asynq.Task {
	now := time.Now()
	payload, _ := json.Marshal(ev)
	return []*asynq.Task{
		asynq.NewTask("email", payload, asynq.TaskID(fmt.Sprintf("email:%s:%d", ev.ID, now.Unix()))), // want `asynq.TaskID is derived from time.Now`
		asynq.NewTask("email", []byte(now.String()), asynq.Unique(time.Hour)),                        // want `the payload of an asynq.Unique task is derived from time.Now`
		asynq.NewTask("email", payload, asynq.TaskID("email:"+ev.ID)),                                // good
		asynq.NewTask("email", []byte(now.String())),                                                 // good: no uniqueness
	}
}

// SendArgs are River job args unique by their "unique" fields.
type SendArgs struct {
	OrderID string    `json:"order_id" river:"unique"`
	At      time.Time `json:"at" river:"unique"`
	Note    time.Time `json:"note"`
}

func riverArgs(orderID string) []SendArgs {
	return []SendArgs{
		{OrderID: orderID, At: time.Now()},   // want `River unique arg At is derived from time.Now`
		{OrderID: orderID, Note: time.Now()}, // good: Note is not part of uniqueness
	}
}

// Limit: a key built by a helper in another function is not followed.
func helperKey() string { return uuid.NewString() }

func limits(ctx context.Context, l *idem.Ledger) {
	l.Do(ctx, idem.Key("x", helperKey()), nil)
}

func snsPublish(msg string) *sns.PublishInput {
	return &sns.PublishInput{Message: &msg, MessageDeduplicationId: aws.String(uuid.NewString())} // want `SNS MessageDeduplicationId is derived from uuid.NewString`
}
