// Package deliveryid holds deliveryid's fixtures.
package deliveryid

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/hibiken/asynq"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/webhook"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/riverqueue/river"
)

type receipt struct {
	OrderID string `json:"orderId"`
	UserID  string `json:"userId"`
}

// The seed's key table, ported: {sqsMessageId} is useless,
// receipt:{orderId}:{userId} is good.
func lambdaWorker(ctx context.Context, l *idem.Ledger, ev events.SQSEvent) (events.SQSEventResponse, error) {
	var resp events.SQSEventResponse
	for _, record := range ev.Records {
		l.Do(ctx, idem.Key(record.MessageId), nil) // want `idem.Key is built from the broker's id events.SQSMessage.MessageId`
		var job receipt
		if err := json.Unmarshal([]byte(record.Body), &job); err != nil {
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: record.MessageId})
			continue
		}
		l.Do(ctx, idem.Key("receipt", job.OrderID, job.UserID), nil) // good
	}
	return resp, nil
}

func sdkWorker(ctx context.Context, l *idem.Ledger, c *sqs.Client, out *sqs.ReceiveMessageOutput) {
	for _, m := range out.Messages {
		id := aws.ToString(m.MessageId)
		l.Do(ctx, idem.RawKey("email:"+id), nil) // want `idem.RawKey is built from the broker's id types.Message.MessageId`
		// Good: a bridge forwards the received id as the downstream dedup
		// id, so a redelivery of this message is dropped downstream.
		c.SendMessage(ctx, &sqs.SendMessageInput{MessageBody: m.Body, MessageDeduplicationId: m.MessageId})
	}
}

func rabbit(ctx context.Context, l *idem.Ledger, d amqp.Delivery) {
	l.Do(ctx, idem.Key("tag", d.DeliveryTag), nil) // want `built from the broker's id amqp091-go.Delivery.DeliveryTag`
	l.Do(ctx, idem.Key("msg", d.MessageId), nil)   // good: the publisher's id
}

func jet(ctx context.Context, l *idem.Ledger, m *nats.Msg, jm jetstream.Msg) {
	meta, _ := m.Metadata()
	l.Do(ctx, idem.Key("seq", strconv.FormatUint(meta.Sequence.Stream, 10)), nil) // want `built from the broker's id nats.go.SequencePair.Stream`
	jmeta, _ := jm.Metadata()
	seq := jmeta.Sequence.Consumer
	l.Do(ctx, idem.Key("seq", fmt.Sprint(seq)), nil) // want `built from the broker's id jetstream.SequencePair.Consumer`
}

func idemQueue(m queue.Message) (idem.OperationKey, error) {
	return idem.Key("mail", m.ID), nil // want `built from the broker's id queue.Message.ID`
}

func idemQueueGood(m queue.Message) (idem.OperationKey, error) {
	return idem.Key("mail", m.Attributes["order-id"]), nil
}

type sendArgs struct{ OrderID string }

func riverWorker(ctx context.Context, l *idem.Ledger, job *river.Job[sendArgs]) {
	l.Do(ctx, idem.Key("send", job.ID), nil)           // want `built from the broker's id rivertype.JobRow.ID`
	l.Do(ctx, idem.Key("send", job.Args.OrderID), nil) // good
}

func asynqWorker(ctx context.Context, l *idem.Ledger) {
	id, _ := asynq.GetTaskID(ctx)
	l.Do(ctx, webhook.Key("tasks", id), nil) // want `webhook.Key is built from the broker's id asynq.GetTaskID`
}
