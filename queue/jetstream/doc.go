// Package jetstream adapts a NATS JetStream stream and durable pull consumer
// to the queue interfaces ([queue.Source], [queue.Delivery],
// [queue.Publisher]), so a [queue.Consumer] runs its handler once per
// operation key whatever the stream redelivers.
//
//	// idemjs is this package; js is a github.com/nats-io/nats.go/jetstream.JetStream.
//	src, err := idemjs.NewSource(ctx, js, idemjs.SourceConfig{Stream: "ORDERS",
//		Consumer: "receipts", DeadLetterSubject: "orders.dead-letter"})
//	pub, err := idemjs.NewPublisher(js, "orders")
//	_, err = pub.Publish(ctx, queue.Outgoing{Body: body, DedupID: "order-8891"})
//	c, err := queue.NewConsumer(src, ledger, keyOf, handle)
//
// The stream, the dead-letter stream and the durable pull consumer (explicit
// acks) are set up with the JetStream API beforehand; see the example.
// Servers 2.9 and later are supported.
//
// # Mapping
//
//   - Publish sends to a subject the stream captures and waits for the
//     stream's PubAck. Outgoing.DedupID becomes the Nats-Msg-Id header; a
//     publish the stream drops as a duplicate inside its Duplicates window
//     (server default 2 minutes) returns Published.Duplicate true and the
//     sequence of the message already held. This is a cheap first line; the
//     consumer's ledger is the mechanism. Attributes become headers; a name
//     beginning Nats- (any case) is refused, as the server reads those as
//     instructions.
//   - Message.Attributes are the message's headers less those beginning
//     Nats- (any case): Nats-Msg-Id is Message.DedupID, and the server's
//     other headers (Nats-Stream-Source, ...) are read through
//     [Delivery.Raw]. So a received message publishes again as it came.
//   - Message.ID is the stream sequence (decimal), stable across
//     redeliveries. ReceiveCount is the delivery's NumDelivered, never
//     lower than one more than the count this Source last handed out for
//     the same sequence (some servers restart the count). Published is the
//     time the stream stored the message; FirstReceived is zero (JetStream
//     does not say).
//   - Ack is a double ack (the server confirms it). Retry is -NAK with the
//     delay, Extend is +WPI (InProgress), which resets the ack wait to its
//     configured length whatever the requested duration, and DeadLetter
//     publishes a copy to the dead-letter subject and then terminates the
//     original (+TERM). Every one of them is sent as a request and returns
//     only when the server has answered, so a lost connection gives an
//     error, never a false settle.
//   - [Source.Visibility] is the consumer's AckWait (the server's default:
//     30 s). A queue.Consumer's default handler timeout is a sixth of it,
//     at most 30 s.
//
// # Late extensions
//
// The server's answer to +WPI does not say whether the delivery was still
// held, and it applies to whichever delivery of the message the server
// holds now. So once the ack wait bought by the receipt or the last Extend
// has passed, Extend sends nothing and returns an error wrapping
// [ErrAckWaitExpired]: the message may be in another receiver's hands, and
// the ledger then finds its key busy. [Delivery.Extend] says more.
//
// # Not supported
//
// JetStream has no FIFO groups: Outgoing.GroupID is ignored and
// Message.GroupID is always empty. It has no delayed first delivery
// either: Publish returns an error wrapping [queue.ErrUnsupported] for a
// non-zero Outgoing.Delay rather than delivering at once. Retry with a
// delay is supported.
//
// # MaxDeliver
//
// Leave the consumer's MaxDeliver unset (unlimited, the server default) to
// let queue.Consumer's WithMaxReceives decide, which is the simpler setup.
// A consumer with MaxDeliver > 0 stops redelivering a message after that
// many deliveries. The adapter makes sure such a message ends in the
// dead-letter subject rather than sitting in the stream unseen: Retry on the
// last allowed delivery dead-letters it instead (reason "jetstream: max
// deliveries (N) reached: retry refused"), and while a Source is open it
// listens to the server's max-deliveries advisory for its consumer (sent
// when the ack wait of the last delivery has expired and the consumer pulls
// again) and moves the message named by the advisory to the dead-letter
// subject, deleting it from a work-queue stream. An advisory sent while no
// Source is open is lost; the message then stays in the stream (nothing is
// deleted) but is not redelivered.
package jetstream
