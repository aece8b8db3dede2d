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
// Pool(), or the program's own).
//
// # Queues
//
// All queues of a database share three tables, created by the handle's
// migrations: idem_queue_messages (one row per message: the queue's name,
// body, attributes as JSON, group id, dedup id, when it becomes visible,
// its receive count, its current receipt, when it was first received and
// published), idem_queue_dead (dead letters, with the reason and when) and
// idem_queue_dedup (dedup id → first message id, until the window ends).
// A queue needs no creating: [SQLite.Queue] and [Postgres.Queue] name one.
//
// Both backends take the same input. A body may hold any bytes. A queue's
// name (1 to 200 bytes), a message's group id, dedup id and attributes
// must be UTF-8 without NUL bytes, which PostgreSQL text requires and JSON
// would otherwise change: anything else is refused with [ErrBadName] or
// [ErrBadMessage], and nothing is published. So is a delay over 100 years
// (a message must stay before 2200, see FIFO groups).
//
// # Delivery
//
// Receive picks up to max visible messages, oldest visible first, and in
// the same statement hides them for the visibility timeout
// ([WithVisibility], default 30 s), counts the receive and writes a fresh
// receipt. Ack, Retry, Extend and DeadLetter act only while the receipt is
// still the message's: a delivery whose visibility lapsed, and whose
// message another receiver got, gets [ErrReceiptExpired] and changes
// nothing. Retry(delay) hides the message for delay (0: visible at once;
// at most 100 years) and clears the receipt. DeadLetter moves the row to
// idem_queue_dead with the reason in one transaction; the reason's first
// 4,096 bytes are kept, with U+FFFD for bytes that are not UTF-8 and for
// NULs (a reason is often an error's text quoting the message, and
// PostgreSQL would refuse it). The receive count starts at 1 and grows
// with every receive; Redrive resets it to 0.
//
// # FIFO groups
//
// A message with a GroupID is handed out only while no earlier message of
// its group (a lower id) is still in the queue: received and not settled,
// delayed, or waiting; nor while another message of its group is in
// flight (a redriven message keeps its id, and on PostgreSQL a publish
// may commit after a later one). So a group is worked through one message at a time,
// in publish order; a Retry keeps the message at the head of its group
// (and blocks the group until it is acked or dead-lettered); other groups
// and ungrouped messages are not held up. A group's next message becomes
// visible when its head is acked or dead-lettered.
//
// The messages behind a group's head are held (migrations 003 and 004;
// 004 fixed a PostgreSQL trigger that hid for good the later messages of
// a group published several at a time in one transaction, and made them
// visible again: it locks the messages table while it runs, waiting for
// open transactions that published and making publishes and receives
// wait for it, once, for about the time of a scan of the table): their
// visibility time moves to the column held_visible_at and visible_at is
// set to 2200-01-01, so a receive, which reads the messages in order of
// visibility, never meets them, however many wait behind groups whose
// head is in flight (100,000 waiting: about 0.5 ms a receive on SQLite,
// 1.5 ms on PostgreSQL, where it walked them all before;
// docs/benchmarks.md). Triggers keep it so: a grouped insert holds the new
// message if its group has a lower id (or, a redriven message keeping its
// old id, holds the group's later ones), and the delete of a grouped
// message (ack, dead letter) gives the group's new lowest id its own
// visibility back: a delayed message stays delayed. A message in flight
// is never held; one that a redrive put a lower id before is held back by
// the receive's own checks. [Stats] counts a held message by its own
// visibility (Ready or Delayed), as before. Ungrouped messages pay
// nothing.
//
// On SQLite the triggers run inside the writer's transaction. On
// PostgreSQL the insert's trigger runs at the publishing transaction's
// commit (a PublishTx left open holds nothing up), and both triggers take
// a transaction-scoped advisory lock on the group, so that a publish and
// the delete of the message before it take turns for the microseconds of
// their commits; a grouped publish costs a few tens of µs more of server
// time. The triggers need READ COMMITTED (pgstore's DoTx uses it): under
// REPEATABLE READ or SERIALIZABLE a PublishTx into a group whose head was
// acked after the transaction's snapshot fails at its commit with a
// serialization error (SQLSTATE 40001, or 40P01 if the ack had not yet
// committed: retry the transaction), and a delete of a grouped message
// fails; [NewPostgres] refuses a pool whose transactions default to
// such a level, so the queue's own statements never run under one. A
// message's ack or dead letter takes one group's
// lock; PublishBatch and Redrive, which may write into several groups,
// take their groups' locks in one fixed order before they commit, so they
// cannot deadlock with each other. A PublishTx takes each group's lock at
// the caller's commit, in the order of its publishes, so a transaction
// that publishes into several groups may cross another writer of the
// same groups: PostgreSQL then aborts one of them with a deadlock error
// (SQLSTATE 40P01) that the caller retries; nothing is lost.
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
// # SQLite
//
// Every write of a [SQLite] handle (receives, settles, publishes) is
// group-committed. Given the store with [WithGroupCommit](store), as
// above, the handle writes through the store's own writer: each write is a
// unit of work (a savepoint) of the ledger's next transaction, so a
// Consumer's claim, completion and ack of many messages commit under one
// sync of the write-ahead log. Without it, the handle runs a writer of its
// own on one connection of the pool, which runs the calls queued since its
// last commit in one BEGIN IMMEDIATE ... COMMIT and takes SQLite's write
// lock by turns with the store's writer ([WithWriteLock](store.LockWrites)
// makes them hand it over directly instead of polling for it). Other
// processes on the same file wait for the lock up to the busy timeout.
// Durability is the pool's synchronous setting (sqlitestore: FULL).
//
// A Receive that finds nothing waits: a publish, Retry(0), redrive, or
// settle that frees a group's next message, through the same handle,
// wakes it at once; otherwise it looks again after 5 ms, doubling up to
// the poll interval ([WithPollInterval], default 1 s), with a read that
// takes no lock. Times are unix microseconds on the handle's clock
// ([WithClock]).
//
// Throughput follows the messages in flight: a Consumer's message waits
// for three commits in turn (its claim, its completion, its ack), each
// shared by every write queued meanwhile. With the Consumer's defaults (8
// handlers, batches of 10) a commit carries about three writes and the
// pipeline does a few thousand messages a second; with 256 handlers and
// batches of 128 ([queue.WithConcurrency], [queue.WithBatchSize]) it did
// 13,000 – 14,000 end to end on two cores (docs/benchmarks.md). Do not add
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
// # PostgreSQL
//
// Receive is one UPDATE over a SELECT ... FOR UPDATE SKIP LOCKED, so any
// number of receivers in any number of processes never hold the same
// message at once. Publishes, retries, redrives and dead letters NOTIFY
// the channel "idem_queue" (or "idem_queue.SCHEMA") with the queue's name
// (Publish just after its commit, folding concurrent publishes into one
// NOTIFY, so that publishers' commits need not take turns);
// each handle LISTENs on one connection of its own (taken out of the pool
// at its first Receive) and wakes its receivers. A receiver that finds
// nothing sleeps until a notification, until the next message of its
// queue falls due (a delay or visibility ending, read from the table), or
// for the poll interval, whichever comes first; if the LISTEN connection
// fails, receivers poll until it is back. Times are the server's.
//
// # Housekeeping
//
// Expired dedup ids behave as absent; [SQLite.Sweep] and [Postgres.Sweep]
// delete them (a SQLite handle also sweeps 1,000 a minute on its own).
// [SQLiteQueue.Stats] and [SQLite.Stats] count ready, in-flight, delayed and
// dead-lettered messages and the oldest message's age; [SQLiteQueue.Redrive]
// moves dead letters back. The idem command does both: `idem queue stats`
// and `idem queue redrive`.
//
// # Defaults
//
// Visibility 30 s; dedup window 7 days; content dedup off; poll interval
// 1 s; migrations on; PostgreSQL schema: the search_path's first; SQLite
// clock: [time.Now]; no logging.
package sqlqueue
