// Package sqsqueue connects a queue.Consumer to Amazon SQS (standard and
// FIFO queues) through aws-sdk-go-v2's service/sqs client. A [Queue] is
// both a [queue.Source] and a [queue.Publisher] for one queue URL.
//
//	client := sqs.NewFromConfig(cfg)
//	q, err := sqsqueue.Open(ctx, client, queueURL, sqsqueue.Options{})
//	_, err = q.Publish(ctx, queue.Outgoing{Body: body, GroupID: "customer-7", DedupID: "order:8891"})
//	c, err := queue.NewConsumer(q, ledger, keyOf, handle)
//
// The package's example publishes to a FIFO queue, receives and acks.
// Open reads the queue's attributes (its visibility timeout and redrive
// policy) once.
//
// # Guarantees
//
// SQS delivers at least once; the consumer's ledger makes the handler's
// effect happen once per key. A receipt handle is only good while the
// message is invisible, so a Delivery whose visibility (from its Receive
// or last Extend) has passed sends nothing: its Ack, Retry, Extend and
// DeadLetter return an error wrapping [ErrStaleReceipt], the message comes
// back, and the ledger replays it as done.
//
// FIFO queues drop a second send with the same dedup id within 5 minutes;
// Publish reports [queue.Published.Duplicate] for the sends this Queue
// made itself (SQS does not say; duplicates of another process's sends are
// dropped all the same, but reported as false). Standard queues have no
// publish-side dedup: Outgoing.DedupID is ignored there. SQS carries text:
// a body or attribute that is not UTF-8 of the characters SQS accepts is
// refused ([ErrBadBody], [ErrBadAttribute]); encode binary payloads first.
//
// # Options that matter
//
// [Options]' zero value is valid:
//
//   - Visibility: default the queue's VisibilityTimeout. A queue.Consumer's
//     default handler timeout is a sixth of it, at most 30 s.
//   - WaitTime: the long poll, default 20 s.
//   - DeadLetterURL: where DeadLetter(reason) sends a copy (with the reason
//     in [ReasonAttribute]); default the queue's redrive policy target. Set
//     the policy's maxReceiveCount above the consumer's max receives, so
//     the redrive policy is the backstop.
//   - AckTimeout: default 30 s. Acks that arrive together share one
//     DeleteMessageBatch; [AckAll] batches explicitly.
//
// docs/brokers.md in the repository gives the whole mapping to SQS calls,
// how a Delivery decides that its receipt is stale, and how duplicates on
// publish are recognised:
// https://github.com/idemkit/idem/blob/main/docs/brokers.md#sqsqueue-amazon-sqs
package sqsqueue
