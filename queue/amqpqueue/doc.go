// Package amqpqueue adapts a RabbitMQ queue (AMQP 0-9-1, through
// github.com/rabbitmq/amqp091-go) to the queue interfaces ([queue.Source],
// [queue.Delivery], [queue.Publisher]), so that a [queue.Consumer] runs its
// handler once per operation key whatever RabbitMQ redelivers.
//
//	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
//	cfg := amqpqueue.Config{Queue: "orders", Quorum: true} // dead letters: "orders.dead-letter"
//	err = amqpqueue.Declare(ctx, conn, cfg)
//	src, err := amqpqueue.NewSource(ctx, conn, cfg)
//	pub, err := amqpqueue.NewPublisher(conn, cfg)
//	c, err := queue.NewConsumer(src, ledger, keyOf, handle)
//
// The package's examples show this in full, and a Source and Publisher that
// dial again after a lost connection ([NewSourceDial], [NewPublisherDial]).
//
// # Guarantees
//
// Publish uses publisher confirms and the mandatory flag: it returns only
// once the broker has confirmed the message, and an unroutable message is
// an error, not a silent drop. Ack, Retry and DeadLetter each end with a
// synchronous round trip, so a dead connection gives an error, never a
// false ack; a publish whose confirm had not arrived returns an error (the
// message may or may not be stored). A message received on a channel that
// has since closed cannot be settled: the broker delivers it again, and
// the ledger makes that a replay.
//
// RabbitMQ has no publish-side dedup: Outgoing.DedupID is carried in a
// header (Message.DedupID) but two publishes with the same id are two
// messages, both delivered. The consumer's ledger is the only line against
// duplicates: key messages by a business id, not by [queue.MessageIDKey].
//
// # Options that matter
//
//   - [Config]: Quorum (quorum queues give exact receive counts; classic
//     queues count redeliveries up to 2), the dead-letter exchange and
//     routing key (default: the queue's name + ".dead-letter", declared by
//     [Declare]), and Prefetch (default 32).
//   - Connections: [NewSource] and [NewPublisher] use the caller's
//     connection and stop working when it closes; [NewSourceDial] and
//     [NewPublisherDial] dial a new one (through a [DialFunc] such as
//     [DialURL]) on the next call after a loss. amqp091-go's own recovery
//     (amqp.Config.Recovery) is refused with [ErrConfig].
//   - Delays (Retry with a delay, Outgoing.Delay) go through delay queues,
//     rounded up to a power of two milliseconds, at most [MaxDelay].
//
// RabbitMQ has no visibility timeout: [Source.Visibility] is 0, Extend
// only checks that the channel still holds the message, and an unacked
// message returns to the queue when its channel closes or after the
// broker's consumer_timeout (30 minutes by default). It has no FIFO
// groups: Outgoing.GroupID is ignored.
//
// docs/brokers.md in the repository gives the whole mapping (ids, receive
// counts, delay queues, dead letters) and what each constructor does when
// a channel or a connection closes:
// https://github.com/idemkit/idem/blob/main/docs/brokers.md#amqpqueue-rabbitmq
package amqpqueue
