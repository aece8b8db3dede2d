// Package lambdasqs runs a queue.Consumer as an AWS Lambda function fed by
// an SQS event source mapping, answering with a partial batch response
// (ReportBatchItemFailures) so that one bad record does not send nine good
// ones around again.
//
//	c, err := queue.NewConsumer(lambdasqs.Source(), ledger, key, handle)
//	if err != nil {
//		log.Fatal(err)
//	}
//	lambda.Start(lambdasqs.Handler(c))
//
// The package's example is a whole function. Keep the ledger in a store
// every instance of the function shares (store/dynamostore,
// store/pgstore): each invocation may run in a new instance. The event
// source mapping must have FunctionResponseTypes
// ["ReportBatchItemFailures"]; without it Lambda ignores the response and
// one failure makes the whole batch visible again, successes included.
//
// # What each settle does
//
// Each record becomes a [queue.Delivery]:
//
//   - Ack: the record succeeded; Lambda deletes it.
//   - Retry(delay), or no settle at all: the record is reported in
//     BatchItemFailures and comes back after the queue's visibility
//     timeout; with [WithRetryDelay] (for example an sqsqueue.Queue's
//     ChangeVisibility), Retry first sets the message's visibility to delay,
//     so the consumer's backoff holds in Lambda too.
//   - DeadLetter(reason): with [WithDeadLetter] (for example an
//     sqsqueue.Queue's SendDeadLetter), a copy with the reason goes to the
//     dead-letter queue and the record counts as succeeded, so Lambda
//     deletes it; if the send fails the record is reported failed. Without
//     it, the record is reported failed and SQS's redrive policy moves it
//     to the dead-letter queue after maxReceiveCount receives, without the
//     reason.
//   - Extend: nothing to do. The invocation's deadline bounds the work:
//     [Handler] ends handlers and the ledger's leases before it. Set the
//     queue's visibility timeout above the function timeout (AWS
//     recommends six times). The [Source]'s visibility is 0, so a
//     queue.Consumer's default handler timeout is the 30 s
//     queue.DefaultHandlerTimeout, cut short by the invocation's deadline.
//
// On a FIFO queue, once a record of a message group is reported failed,
// every later record of that group in the batch is reported failed too,
// whatever happened to it, as Lambda requires to keep the group's order
// (the Consumer already hands them back unrun).
package lambdasqs
