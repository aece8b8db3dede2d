// Package sqlitestore is idem's embedded default [store.Store]: the records
// live in one SQLite database file, through modernc.org/sqlite (pure Go, no
// cgo). It needs nothing to run beside the program.
//
//	store, err := sqlitestore.Open(ctx, "idem.db")
//	if err != nil { ... }
//	defer store.Close()
//	l := idem.New(store)
//
// A [*Store] also implements [store.BatchClaimer] (ClaimBatch: many claims in
// one transaction), [store.BatchFinisher] (FinishBatch: many finishing
// writes in one transaction) and [store.TxStore] for *sql.Tx, so [idem.DoTx] can run
// the caller's own writes in the same transaction as the claim and the
// completion (see below). [Store.DB] gives access to the database, for
// tables of the program's own in the same file.
//
// # Durability
//
// The database runs in WAL mode with synchronous=FULL: a claim, completion
// or any other write is acknowledged to its caller only once it is in the
// write-ahead log and the log has been synced to disk, so every
// acknowledged write survives a process crash, an operating system crash
// and a power loss. [WithSynchronous]([SyncNormal]) syncs only at
// checkpoints instead; then a power loss (never a process crash) can lose
// the last commits.
//
// # Group commit
//
// A sync costs far more than the work of a write (a disk does a few
// thousand syncs a second). So every write of a Store goes through one
// writer goroutine, which owns one connection: it takes all the operations
// queued since its last commit (up to [WithMaxBatch], default 1024), runs
// them in one BEGIN IMMEDIATE ... COMMIT, and answers each caller after the
// COMMIT. 64 concurrent callers share about one sync per batch instead of
// paying one each; a single caller waits for its own sync as it would
// anyway. [Store.Stats] counts operations and commits.
//
// Operations in a batch are independent: one whose outcome is an error
// (ErrLeaseLost, a corrupt record) does not affect the others; if a
// statement fails, the writer rolls the transaction back, answers that
// operation with the error and runs the others again. If the COMMIT fails,
// every operation of the batch gets the error: none is reported done
// unless it is durable.
//
// Most of an operation's work happens before it reaches the writer, in the
// caller's goroutine and concurrently with other callers: the decision
// (acquired, duplicate, busy, stale fence...) by the record state machine
// that every idem store shares, and the encoding of the record to write.
// The writer only runs the resulting write, which is conditional on the
// record it was decided on: an INSERT ... ON CONFLICT DO NOTHING for a key
// that had none, an UPDATE ... WHERE version = ? otherwise (every row
// carries a version that changes with each write, also one made outside
// the store). If the record was not that one, the writer decides again
// inside its transaction. Either way every write is one atomic conditional
// write, as the Store contract requires. So:
//
//   - A claim of a new key is one INSERT. While many claims find their key
//     already recorded (a flood of duplicate deliveries), claims read the
//     record first instead, on a pool of read-only connections (WAL readers
//     run beside the writer), and a duplicate or a busy key is answered
//     from that read without the writer.
//   - Finish and Extend of an attempt this process claimed decide on the
//     record the claim wrote (no read), by its fence and attempt id, and
//     are one UPDATE; if another process changed the record meanwhile (a
//     takeover), the UPDATE finds another version and the writer decides
//     on the current record.
//   - An outcome that writes nothing is decided only on a read or inside
//     the writer's transaction.
//
// # Several processes
//
// Any number of processes (and Stores) may open the same file at once.
// SQLite's file lock serializes their writers: a writer waits for the lock
// up to [WithBusyTimeout] (default 10 s), then fails with SQLITE_BUSY. The
// lock is not fair: under constant load from several processes, one may get
// most of the turns. Readers never wait for writers. The file must be on a
// local file system (SQLite's locks do not work over NFS and similar).
//
// # Attempts and fences
//
// Every row keeps the id of its latest attempt (the column attempt_id), so
// a Finish or Extend applies only while the attempt it names holds the
// key, and a caller whose answer was lost can tell by Get whether its
// claim landed. An abandon clears the column (the attempt ends once); the
// journal keeps the id. Rows written before schema version 3 have no
// attempt id: no attempt of a new build can finish or extend them, so an
// in_progress one lapses and is taken over or resolved as usual.
//
// A new record's first fence is [store.FirstFence] of the clock and a
// floor: the highest fence of any record deleted from the file (by Delete,
// Sweep, or a DELETE from outside the store, through a trigger), kept in
// the one-row table idem_fence_floor. The INSERT of a new record is
// conditional on the floor too, and SQLite serializes writers across
// processes, so the floor is exact: a key deleted or swept and claimed
// again gets a fence above every fence it had, whatever the clocks do. A
// claim decides its fence before the writer with the highest floor this
// process has seen; if the file's floor is higher, the writer decides
// again in its transaction. Later claims of a record count on from its
// fence, also once it expired.
//
// A process of a build from before schema version 3 refuses to open a
// migrated file, but one that opened it before goes on writing rows
// without attempt ids and new records from fence 1, below the floor: let
// such processes finish before relying on either.
//
// # Time
//
// SQLite has no clock of its own, so leases and retention run on the
// clock of each process ([WithClock], default [time.Now]). Processes that
// share a file are on the same host and so agree on the time. Times are
// stored as unix microseconds, so records carry microsecond precision.
//
// # Transactions (DoTx)
//
// [Store.InTx] runs in the group-commit writer's transaction, in a
// savepoint of its own: it claims the key and calls fn with the *sql.Tx.
// The program's writes in fn and the key's completion commit together (with
// the rest of the batch, under one sync), or roll back together when fn
// fails (the key is then as it was; the batch's other operations still
// commit): an effect on the program's own tables happens exactly once,
// whatever crashes.
//
//	res, err := idem.DoTx(ctx, l, idem.Key("credit", orderID),
//		func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
//			_, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + ? WHERE id = ?`, amount, id)
//			return nil, err
//		})
//
// fn runs on the writer's goroutine, so every other write waits: keep fn
// short, make its reads and writes through tx, never call tx.Commit or
// tx.Rollback, and never call the store from fn (that deadlocks: the call
// waits for the writer, which waits for fn).
//
// [Store.WriteTx] runs any unit of work that way (a savepoint of the
// writer's next transaction, answered after its COMMIT): queue/sqlqueue
// uses it (sqlqueue.WithGroupCommit) so that a queue in the store's file
// shares the ledger's commits.
//
// # Schema
//
// The store keeps its records in the table idem_records (one row per key;
// times in unix microseconds; the journal as JSON, or empty when it is the
// one entry the row's own columns say: a key's first attempt and its
// outcome, see [WithImplicitJournal]; the latest attempt's correlation id
// in the column correlation and its attempt id in attempt_id), the fence
// floor in idem_fence_floor, and its schema version in idem_migrations.
// Open applies the embedded migrations in one transaction, so two
// processes opening a fresh file at once take turns. Other tables in the
// file are the program's own.
//
// # Defaults
//
// WAL mode; synchronous=FULL ([WithSynchronous]); batches of up to 1024
// operations ([WithMaxBatch]); a busy timeout of 10 s ([WithBusyTimeout]);
// 4 read connections ([WithReadConns]); the clock [time.Now] ([WithClock]);
// no logging ([WithLogger]).
package sqlitestore
