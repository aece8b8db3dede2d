// Package outbox is the transactional outbox: a message that must not be
// lost is written in the same transaction that changes the business data,
// and a [Relay] moves it to the broker at least once, with a dedup id, so
// that the broker's dedup window and the consumer's ledger make its effect
// happen once.
//
// Use it when a database change and a message must both happen or neither:
// a program that commits an order and then publishes "order placed" loses
// the message when it dies between the two, and one that publishes first
// announces an order that may never commit. In the outbox the message is a
// row in the application's own database, so it exists if and only if the
// change committed. The package's Relay example writes an order with its
// message and relays it.
//
// # Writing to the outbox
//
// The outbox is a queue of queue/sqlqueue in the application's database
// (SQLite or PostgreSQL). Write to it with the queue's PublishTx, inside
// the application's transaction: *sql.Tx on SQLite, pgx.Tx on PostgreSQL.
//
//	queues, err := sqlqueue.NewSQLite(ctx, db)            // db: the application's database (SQLite in WAL mode)
//	ob, err := queues.Queue("outbox", sqlqueue.WithVisibility(time.Minute))
//
//	tx, err := db.BeginTx(ctx, nil)
//	_, err = tx.ExecContext(ctx, `INSERT INTO orders(id, total) VALUES (?, ?)`, id, total)
//	_, err = outbox.PublishTx(ctx, ob, tx, idem.Key("order-placed", id),
//	    queue.Outgoing{Body: body, GroupID: customerID})
//	err = tx.Commit()                                   // both, or neither
//
// [PublishTx] is the queue's PublishTx that also sets the message's
// DedupID to its operation key and carries the key in the attribute
// [KeyAttribute], which the consumer at the target reads back with
// [MessageKey]. Without an operation key, call the queue's PublishTx
// directly; the relay then derives a dedup id from the outbox message and
// publishes it as the key too.
//
// On SQLite, open the queues on the application's database; when it is
// also the file of a store/sqlitestore ledger, pass
// sqlqueue.WithGroupCommit(store) as the queue's documentation says, and
// keep the application's transactions short: SQLite has one writer.
//
// # Relaying
//
//	relay, err := outbox.NewRelay(ob, target) // target: an SQS, JetStream, RabbitMQ or sqlqueue publisher
//	go relay.Run(ctx)
//
// [Relay.Run] relays until its context ends; [Relay.Drain] relays what is
// due and returns, for tests and cron-like jobs. Any number of relays may
// run on one outbox, in one process or many: the outbox hands each message
// to one of them at a time.
//
// # What the relay guarantees
//
// At least once: a message is acked in the outbox only after the target
// confirmed its publish. So a relay that dies, or loses its connection to
// the outbox, after the publish and before the ack, publishes the message
// again when it (or another relay) gets it back. Every publish of one
// outbox message carries the same dedup id (the message's own DedupID, or
// one derived from its outbox id; see [Relay]), so:
//
//   - a target with publish-side dedup drops the second copy inside its
//     window and answers Duplicate, which the relay counts as done: SQS FIFO
//     (5 minutes, MessageDeduplicationId), JetStream (the stream's
//     Duplicates window, Nats-Msg-Id; 2 minutes by default), sqlqueue (its
//     dedup window, 7 days by default);
//   - past the window, or on a target without dedup (RabbitMQ, SQS
//     standard), the second copy is delivered, and the consumer's ledger
//     (queue.Consumer keyed by the operation key, [MessageKey]) runs its
//     effect once.
//
// Broker dedup is the cheap first line; the consumer's ledger is the
// mechanism. Order: the messages of a FIFO group (Outgoing.GroupID) reach
// the target one at a time in the order they were written, on targets that
// keep a group's order (SQS FIFO, sqlqueue); see [Relay] for failures,
// delays and dead letters.
//
// # Options
//
// [NewRelay] takes: [WithConcurrency] (8 publishes at once; a FIFO group
// takes one slot), [WithBatchSize] (10 messages a receive),
// [WithPublishTimeout] (30 s a publish), [WithBackoff] (1 s doubling to 5
// minutes, with jitter), [WithMaxReceives] (default 0: no limit, so a
// broker outage of any length loses nothing), [WithPermanentErrors]
// (publish errors that dead-letter at once, besides [queue.ErrRefused]),
// [WithDedupPrefix] ("outbox:"; give each outbox relaying into a shared
// target a prefix of its own), [WithExtendEvery] (a third of the outbox's
// visibility), [WithShutdownTimeout] (30 s), [WithLogger] (default
// slog.Default) and [WithObserver] (none: the relay has no ledger to take
// one from; give it the observer your ledgers have, e.g. otelidem's, to
// count published and refused messages and the relay's lag).
// docs/usage.md in the repository walks through an outbox:
// https://github.com/idemkit/idem/blob/main/docs/usage.md#publishing-from-your-own-transaction-the-outbox
package outbox
