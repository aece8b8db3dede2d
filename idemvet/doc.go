// Package idemvet holds static checks, built on
// golang.org/x/tools/go/analysis, for the mistakes that make
// at-least-once delivery unsafe: keys that cannot recognise a repeat and
// handlers that tell the sender "done" when they are not.
//
// The checks, each its own [analysis.Analyzer] so that a driver can turn
// it on or off by name:
//
//   - nondetkey ([NondetKey]): a dedup or idempotency key derived from
//     time.Now, math/rand, crypto/rand, a uuid/ksuid/xid/ulid generator
//     or a shared counter. A repeat of the same operation gets a new key.
//   - deliveryid ([DeliveryID]): a broker's delivery or message id (SQS
//     MessageId, AMQP DeliveryTag, JetStream sequence, River job id,
//     asynq task id, queue.Message.ID) used as an operation key. A
//     redelivery keeps it, a republished copy of the same request does
//     not.
//   - bodyhash ([BodyHash]): a hash of a whole payload used as a key. Two
//     legitimately identical requests collide, and a sender that varies
//     a field between retries defeats it.
//   - swallowed ([Swallowed]): an HTTP or Lambda handler that only logs
//     an error and then answers with success, which switches off the
//     sender's retries.
//   - partialbatch ([PartialBatch]): an events.SQSEvent handler that
//     returns only error, so one failed record redelivers the whole
//     batch.
//   - unusedallow ([UnusedAllow]): an //idem:allow comment that silences
//     nothing, names no check, or gives no reason.
//
// A key position ("sink") is recognised by package path and name through
// go/types: idem.Key and idem.RawKey parts, webhook.Key, SQS
// SendMessageInput and SendMessageBatchRequestEntry
// MessageDeduplicationId, nats.MsgId, jetstream.WithMsgID, a Nats-Msg-Id
// or Idempotency-Key header set with Header.Set or Header.Add, asynq.TaskID
// and River job args fields tagged river:"unique". A value reaches a sink
// by intra-procedural def-use flow: assignments to local and package
// variables (flow-insensitive), struct fields, composite literals,
// conversions, string concatenation and a fixed list of standard library
// and SDK functions that pass their argument through (fmt.Sprintf,
// strconv, strings, hex, base64, aws.String, ...). A value that crosses a
// call to any other function is not followed: the checks miss a key built
// by a helper, and in exchange they do not guess.
//
// A finding is silenced by a comment on its line or on the line before:
//
//	//idem:allow CHECK reason
//
// Such a comment that silences nothing is itself reported (unusedallow).
//
// The analyzers import no client library: a program that does not use
// SQS, NATS, RabbitMQ, asynq or River pays nothing for their checks.
package idemvet
