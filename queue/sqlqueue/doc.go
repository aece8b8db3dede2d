// Package sqlqueue is a durable queue in SQL: in SQLite, in the same file as
// the ledger of store/sqlitestore (idem's embedded default), and in
// PostgreSQL. It implements [queue.Source], [queue.Delivery] and
// [queue.Publisher], and [queue.TxPublisher] for *sql.Tx (SQLite) and
// pgx.Tx (PostgreSQL), so that a message can be published in the same
// transaction as the ledger's claim and completion ([idem.DoTx]).
//
//	store, err := sqlitestore.Open(ctx, "idem.db")
//	...
//	queues, err := sqlqueue.NewSQLite(ctx, store.DB(), sqlqueue.WithGroupCommit(store))
//	...
//	defer queues.Close()
//	orders, err := queues.Queue("orders", sqlqueue.WithVisibility(time.Minute))
//	_, err = orders.Publish(ctx, queue.Outgoing{Body: body, DedupID: orderID})
//	c, err := queue.NewConsumer(orders, idem.New(store), keyOf, handle)
//
// On PostgreSQL, [NewPostgres] takes a pgxpool.Pool (a pgstore.Store's
// Pool(), or the program's own). A queue needs no creating:
// [SQLite.Queue] and [Postgres.Queue] name one; all queues of a database
// share three tables, created by the handle's migrations.
//
// # Delivery
//
// Receive picks up to max visible messages, oldest visible first, and hides
// them for the visibility timeout ([WithVisibility], default 30 s). Ack,
// Retry, Extend and DeadLetter act only while the delivery's receipt is
// still the message's: a delivery whose visibility lapsed, and whose
// message another receiver got, gets [ErrReceiptExpired] and changes
// nothing. Retry(delay) hides the message for delay (0: visible at once;
// at most 100 years) and clears the receipt. DeadLetter moves it to the
// dead letters with the reason (its first 4,096 bytes) in one transaction. The receive count starts at 1 and grows with every receive;
// Redrive resets it to 0. On PostgreSQL any number of receivers in any
// number of processes never hold the same message at once, and a publish
// wakes them (LISTEN/NOTIFY).
//
// # FIFO groups
//
// A message with a GroupID is handed out only while no earlier message of
// its group (a lower id) is still in the queue: received and not settled,
// delayed, or waiting; nor while another message of its group is in
// flight (a redriven message keeps its id, and on PostgreSQL a publish
// may commit after a later one). So a group is worked through one message
// at a time, in publish order; a Retry keeps the message at the head of its
// group (and blocks the group until it is acked or dead-lettered); other
// groups and ungrouped messages are not held up. A group's next message
// becomes visible when its head is acked or dead-lettered. However many
// messages wait behind groups in flight, a receive does not walk them.
//
// On PostgreSQL, grouped messages need READ COMMITTED transactions
// (pgstore's DoTx uses it; [NewPostgres] refuses a pool that defaults to
// another level). A PublishTx into several groups may meet another writer
// of the same groups and be aborted with a deadlock error (SQLSTATE 40P01),
// as may a PublishTx under REPEATABLE READ or SERIALIZABLE (40001): retry
// the transaction; nothing is lost.
//
// # Dedup
//
// A publish with a dedup id (Outgoing.DedupID; or, under
// [WithContentDedup], the SHA-256 of the body) that the queue has seen
// inside its dedup window ([WithDedupWindow], default
// [DefaultDedupWindow]: the ledger's default retention of 7 days, where SQS
// fixes 5 minutes) inserts nothing and returns the first message's id with
// Duplicate set, whether or not that message has been consumed since. The
// first publish after the window inserts a new message and starts a new
// window. Broker dedup is a first line only: the consumer's ledger is what
// makes the effect happen once.
//
// # Input
//
// Both backends take the same input. A body may hold any bytes. A queue's
// name (1 to 200 bytes), a message's group id, dedup id and attributes
// must be UTF-8 without NUL bytes: anything else is refused with
// [ErrBadName] or [ErrBadMessage], and nothing is published. So is a delay
// over 100 years.
//
// # SQLite
//
// Give the handle the store with [WithGroupCommit](store), as above: the
// queue's writes then commit together with the ledger's, under one sync of
// the write-ahead log, and a consumer does a few thousand messages a second
// at its defaults (more with [queue.WithConcurrency] and
// [queue.WithBatchSize]; docs/benchmarks.md). Do not add
// [idem.WithCoalescing] to a ledger on sqlitestore: its writer already
// shares commits, and batching on top costs it.
//
// Do not call Publish (or any other method of a handle on the store's
// file) from inside an [idem.DoTx] function: the function runs on the
// store's writer (and holds the write lock), which Publish would wait for
// (with WithGroupCommit and the function's context, it fails with
// sqlitestore.ErrOnWriter instead). Use PublishTx with the function's
// transaction.
//
// # PostgreSQL: the fused path
//
// Give the handle the ledger's store with [WithLedger](store), a
// pgstore.Store on the same database:
//
//	st, err := pgstore.New(ctx, pool)
//	queues, err := sqlqueue.NewPostgres(ctx, pool, sqlqueue.WithLedger(st))
//	c, err := queue.NewConsumer(orders, idem.New(st), keyOf, handle)
//
// A consumer whose ledger is on that store then claims the keys of a
// received batch in the receive's transaction, and commits each handled
// message's completion with its ack, batched with the other handlers':
// a batch costs one commit for its receive and claims, and its messages
// share the commits of their completions and acks, where the separate
// path commits the receive, the claims, the completions and the acks
// apart. Everything else is as without it. The consumer takes the path by itself when the
// ledger's store is the handle's; [WithLedger] is the one switch, because
// only the caller knows that the two share a database.
//
// On SQLite the same option, [WithLedger](store) with the sqlitestore.Store
// of the file (it implies [WithGroupCommit] with it), makes a receive and
// its claims one unit of the store's writer, and each completion and its
// ack another, shared by the handlers that finish meanwhile.
//
// # Housekeeping
//
// Expired dedup ids behave as absent; [SQLite.Sweep] and [Postgres.Sweep]
// delete them (a SQLite handle also sweeps 1,000 a minute on its own).
// [SQLiteQueue.Stats] and [SQLite.Stats] count ready, in-flight, delayed and
// dead-lettered messages and the oldest message's age; [SQLiteQueue.Redrive]
// moves dead letters back, oldest first, and [SQLiteQueue.RedriveMessage]
// one chosen by its id (the PostgreSQL queue has the same). The idem
// command does all three: `idem queue stats`, `idem queue redrive [--id]`,
// and the console of `idem serve`.
//
// # Defaults
//
// Visibility 30 s; dedup window 7 days; content dedup off; poll interval
// 1 s; migrations on; PostgreSQL schema: the search_path's first; SQLite
// clock: [time.Now]; no logging.
//
// docs/sqlqueue.md in the repository explains the tables, the held messages
// of FIFO groups and their triggers, PostgreSQL's locks and isolation, and
// the SQLite writer.
package sqlqueue
