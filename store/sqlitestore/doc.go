// Package sqlitestore is idem's embedded default store: the ledger lives
// in one SQLite database file, through modernc.org/sqlite (pure Go, no
// cgo), and needs nothing to run beside the program. Use it for a single
// host, or several processes on one host; use pgstore, redisstore or
// dynamostore when hosts must share a ledger.
//
//	store, err := sqlitestore.Open(ctx, "idem.db")
//	if err != nil {
//		return err
//	}
//	defer store.Close()
//	ledger := idem.New(store)
//
// The package's examples run a Ledger on a file and idem.DoTx on a
// table of the program's own. [Store.DB] gives access to the database, for
// such tables in the same file; queue/sqlqueue keeps its queues there too
// (sqlqueue.WithGroupCommit).
//
// # Guarantees
//
// The database runs in WAL mode with synchronous=FULL: a claim, completion
// or any other write is acknowledged to its caller only once it is in the
// write-ahead log and the log has been synced to disk, so every
// acknowledged write survives a process crash, an operating system crash
// and a power loss. Every write is one atomic conditional write: of two
// claims of a free key exactly one succeeds, and an attempt's Finish or
// Extend applies only while its fence and attempt id still hold the key
// (otherwise [store.ErrLeaseLost]). A key deleted or swept and claimed
// again gets a fence above every fence it had, whatever the clocks do.
//
// Writes share commits: one writer goroutine runs all the operations
// queued since its last commit in one transaction and answers each caller
// after the COMMIT, so 64 concurrent callers share about one sync instead
// of paying one each. One operation's error does not affect the others of
// its batch; if the COMMIT fails, every operation of the batch gets the
// error: none is reported done unless it is durable. [Store.Stats] counts
// operations and commits. Do not add idem.WithCoalescing on top.
//
// Any number of processes (and Stores) may open the same file at once.
// SQLite's file lock serializes their writers: a writer waits for the lock
// up to [WithBusyTimeout], then fails with SQLITE_BUSY. The lock is not
// fair: under constant load from several processes, one may get most of
// the turns. Readers never wait for writers. The file must be on a local
// file system (SQLite's locks do not work over NFS and similar). Leases
// and retention run on each process's clock ([WithClock]); processes that
// share a file are on the same host and so agree on the time.
//
// # Transactions (DoTx)
//
// A [*Store] implements [store.TxStore] for *sql.Tx: idem.DoTx claims
// the key, runs fn with a transaction, and commits fn's writes and the
// key's completion together (under the same sync as the rest of the
// batch), or rolls both back when fn fails: an effect on the program's own
// tables happens exactly once, whatever crashes.
//
//	res, err := idem.DoTx(ctx, ledger, idem.Key("credit", orderID),
//		func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
//			_, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + ? WHERE id = ?`, amount, id)
//			return nil, err
//		})
//
// fn runs on the writer's goroutine, so every other write waits: keep fn
// short, make its reads and writes through tx, never call tx.Commit or
// tx.Rollback, and never call the store from fn (that deadlocks: the call
// waits for the writer, which waits for fn). [Store.WriteTx] runs any
// other unit of work in the writer's next transaction.
//
// # Options and defaults
//
//   - [WithSynchronous]: [SyncFull] by default; [SyncNormal] syncs only at
//     checkpoints, and a power loss (never a process crash) can then lose
//     the last commits.
//   - [WithBusyTimeout]: how long a writer waits for another process's
//     lock, default 10 s.
//   - [WithMaxBatch]: operations per commit, default 1024
//     ([DefaultMaxBatch]).
//   - [WithReadConns]: read-only connections, default 4.
//   - [WithMigrate]: create and migrate the file at Open (default true).
//   - [WithClock]: default [time.Now]. [WithLogger]: default no logging.
//
// docs/stores.md in the repository explains the writer and how it decides
// before writing, fences and their floor, upgrades from files before
// schema version 3, and the schema:
// https://github.com/idemkit/idem/blob/main/docs/stores.md#sqlitestore-sqlite-the-embedded-default
package sqlitestore
