// Package pgstore is an [store.Store] kept in a PostgreSQL table, through
// pgx v5: one row per key, every call one SQL statement and one round
// trip, leases and retention on the server's clock.
//
//	s, err := pgstore.Open(ctx, "postgres://app@db:5432/app?sslmode=verify-full")
//	if err != nil { ... }
//	defer s.Close()
//	l := idem.New(s, idem.WithLease(30*time.Second), idem.WithRetention(7*24*time.Hour))
//
// [Open] makes a connection pool of its own from a URL (or keyword/value
// pairs); [New] uses the caller's *pgxpool.Pool. Both create or update the
// table unless [WithMigrate](false) says otherwise. The table is
// idem_records in the first schema of the search_path; [WithSchema] and
// [WithTable] (or the URL parameters idem_schema and idem_table, which the
// idem command's --store understands) choose another, so that several
// ledgers can share a database.
//
// A Store is safe for concurrent use by many goroutines, and any number of
// processes may share a table: the database serializes them, row by row.
//
// # Migrations
//
// The schema is embedded in the package as numbered SQL files and applied
// in one transaction under pg_advisory_xact_lock, keyed by the schema and
// table names, so that processes starting together apply each migration
// once. A table named t has its applied versions in t_migrations. An
// up-to-date database costs one read at Open. Deployments that migrate in
// a step of their own open with WithMigrate(false) and call
// [Store.Migrate] from that step; a call on a missing table then fails
// with an error wrapping [ErrNoTable].
//
// The table (see the migrations directory):
//
//	key text COLLATE "C" PRIMARY KEY       byte order, as Go compares strings
//	status, policy text                    checked on every read
//	fence bigint, attempt integer
//	attempt_id text                        the latest attempt's id; empty once abandoned
//	owner, fingerprint, reason text, result bytea
//	lease_until, expires_at, created_at, updated_at timestamptz
//	journal jsonb                          []store.JournalEntry, its json names;
//	                                       NULL: implicit (below)
//	correlation text                       the latest attempt's correlation id
//	index (expires_at)                     Sweep
//	index (key) WHERE status = 'in_progress'   List(Stuck): `idem ls --stuck`
//	autovacuum at 2% dead rows; vacuum_truncate = false (see below)
//
// Migration 004 added attempt_id. Rows written before it have an empty one
// (no attempt id) and no ids in their journals: no attempt of this build
// can finish or extend them, since every attempt has an id, so an attempt
// that was running during the upgrade lapses, and is taken over or
// resolved as usual. While older builds still write the table (a rolling
// upgrade), they claim and finish by fence alone: a new key's row they
// insert starts at fence 1 without an attempt id, which only their own
// attempts can end, and a claim of theirs leaves the row the attempt id
// of the attempt before it, whose fence no longer holds the key.
//
// # Time
//
// Every time comes from the server: the statements read
// statement_timestamp(), which is now() for a statement of its own and
// the start of the statement inside a transaction, so that the completion
// in [Store.InTx] records when fn ended rather than when the claim began.
// It is stable within a statement, so all the times one statement writes
// are the same instant. Workers with skewed clocks agree on every lease.
// Times are kept to the microsecond; durations are rounded up to it.
//
// # Claims
//
// A claim is one statement:
//
//	WITH ins AS (
//		INSERT INTO t SELECT <a new in_progress record, fence <now in µs>, attempt 1, $attempt_id>
//		WHERE NOT EXISTS (SELECT 1 FROM t WHERE key = $1 AND NOT <claimable>)
//		ON CONFLICT (key) DO UPDATE SET <fence+1, attempt+1, new attempt id, owner, lease,
//			journal: the lapsed entry marked, the new one appended, trimmed>
//		WHERE <claimable>: t.expires_at <= now OR t.status = 'released'
//			OR (t.status = 'in_progress' AND t.lease_until <= now
//			    AND (t.policy = 'at_least_once' OR $take_lapsed)
//			    AND (t.fingerprint = '' OR $fp = '' OR t.fingerprint = $fp))
//		RETURNING t.*, t.xmax = 0 AS inserted)
//	SELECT ..., true FROM ins
//	UNION ALL
//	SELECT ..., false, <claimable> FROM t WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM ins)
//
// The takeover and after-expiry marks are computed in the statement and
// kept in the new journal entry.
//
// A new key's first fence is the statement's clock in microseconds since
// 1970 ([store.FirstFence] with no floor): (extract(epoch from
// statement_timestamp()) * 1000000)::bigint. Every later claim of the row,
// expired or not, and every resolution adds one. The store keeps no floor
// of removed fences: a key deleted or swept and claimed anew starts at
// the clock, above every fence the old row had unless the old row counted
// past the clock, which takes the server's clock going back, or claims and
// resolutions of one key more than once a microsecond on average since
// its first claim.
//
// A new key's row has an implicit journal: NULL, meaning the one entry the
// row's columns say (its attempt, fence, owner, correlation id, start,
// lease and policy, and once it ended its status, end and reason). Its
// claim builds no jsonb and writes a row less than half the size; its
// heartbeats and its completion, failure or release keep the journal
// implicit, and nearly every key never has another. A statement that
// needs an entry the columns cannot say (a takeover, a second attempt, an
// abandon, a resolution) writes the journal out first. Builds from before
// schema version 3 cannot read an implicit journal: while one still uses
// the table, run the new build with [WithImplicitJournal](false).
//
// A key the statement's snapshot shows as not claimable (a duplicate of a
// completed or failed key, a busy or an indeterminate one) is not inserted
// at all: the statement only reads, takes no row lock, writes no WAL, and
// its commit waits for no flush, so duplicates are cheap and do not queue
// behind each other. (ON CONFLICT DO UPDATE locks the conflicting row even
// when its WHERE is false.)
//
// Concurrency, under READ COMMITTED (which the store's own transactions
// and, unless the URL says otherwise, the sessions of Open's pool use):
// the INSERT either inserts the key or finds the conflicting row, waits
// for a concurrent writer of it to commit or roll back, locks its latest
// committed version and evaluates the WHERE on that version. So a claim is
// always decided on the latest row, and of two claims of a claimable key
// exactly one succeeds: the second waits for the first and then sees its
// in_progress record. When the WHERE is false nothing is written and
// RETURNING is empty; the second SELECT then returns the row as found.
// That SELECT reads the statement's snapshot, taken before the wait, so
// it can be older than the version the WHERE rejected: a key another
// transaction inserted or claimed in between appears absent or still
// claimable. The statement returns, for that row, whether it is claimable
// by the same rule, and the store runs the claim again (with a new
// snapshot) in exactly those cases: the only second round trip, taken
// only under contention on the key (a few claims in a thousand when 16
// goroutines race for the same new keys, TestClaimRace). Any other row
// the snapshot returns is a true answer as of the statement's start (for
// example "busy" for a holder that completed a moment later).
//
// [Store.ClaimBatch] claims many keys in one such statement, with the
// requests as arrays (unnest), inserted in key order so that concurrent
// batches lock their rows in the same order and cannot deadlock. While
// recent batches were of new keys only (a moving average over about 16
// batches: at least three quarters had no key with a row), a batch starts
// with a plainer statement: INSERT ... ON CONFLICT (key) DO NOTHING of the
// new rows, which costs the server about what a bare insert of those rows
// does; it checks, locks and writes nothing for a key that has a row. The
// keys it did not insert then go through the full claim, a second
// statement and round trip, which makes such a batch slower than the full
// claim alone; so while more than a quarter of recent batches had a key
// with a row (duplicates, redeliveries), batches go straight to the full
// claim.
//
// # Finishing an attempt
//
// Finish (each outcome its own statement) and Extend are one UPDATE ...
// WHERE key = $1 AND fence = $2 AND attempt_id = $3 AND status =
// 'in_progress' AND <not expired>, which also records the outcome in the
// attempt's journal entry. An abandon also clears attempt_id, so that a
// second abandon (or any other ending) of the same attempt matches
// nothing. A concurrent takeover either commits first (the UPDATE, which
// re-checks its WHERE on the row's new version, matches nothing) or waits
// for it. When it matches nothing the attempt lost the key: a second
// statement, on this path only, marks the stale attempt's journal entry
// (the one with its fence and attempt id, not ended) with LateFinish (it
// was still running while a later attempt ran), and the call returns
// [store.ErrLeaseLost]; a Finish whose reason says the attempt never ran
// ([store.IsNotRun]) marks nothing. [Store.FinishBatch] completes many
// attempts in one statement (the other outcomes in a batch take one
// statement each).
//
// # Transactions
//
// [Store.InTx] implements [store.TxStore] for [pgx.Tx]: the claim, fn's
// writes through the transaction, and the completion commit together
// (see [idem.DoTx]). For database/sql code, [SQL] returns a [SQLStore],
// which implements store.TxStore for *sql.Tx over the same pool through
// pgx's stdlib driver. (One Go type cannot have both InTx methods, hence
// the second type.) The claimed row stays locked until the transaction
// ends, so a concurrent claim of the key waits for it.
//
// # Errors
//
// Every error that is not [store.ErrLeaseLost], [store.ErrNotFound] or a
// [*store.CorruptError] means the store could not answer, and callers
// never read it as an outcome: a statement whose connection was lost, or
// whose context was cancelled, may or may not have committed. pgx cancels
// the statement on the server when the context is cancelled, but one that
// completed first stands: the key is then claimed (or completed) by a
// caller that saw an error, exactly as if it had crashed, and its lease
// and policy decide what happens next. Calls on a closed store return an
// error wrapping [store.ErrClosed].
//
// A row whose status, policy or journal cannot be decoded is reported as a
// [*store.CorruptError] by every call that reads it (List fails as a
// whole), and claims never overwrite it until it expires. Owners,
// correlation ids, fingerprints, reasons and Resolve's by that PostgreSQL
// text cannot hold (NUL bytes, bytes that are not UTF-8) are stored with
// U+FFFD in their place; keys and attempt ids are stored exactly, and one
// that PostgreSQL refuses fails the call.
//
// # Keeping the table bounded at a billion keys a month
//
// At 10⁹ keys a month (about 385 claims a second on average) and seven
// days of retention, some 230 million records are live at once: with
// about 250 bytes of row and three index entries each, 80 to 100 GB. Each
// key is inserted once, updated at least once (its completion) and
// deleted once, so the table makes two dead row versions per key, about
// 800 a second. Two designs keep it bounded.
//
// Partitioning by expiry day, dropping a day's partition when it has
// passed, deletes for free. It is not what pgstore does, because it breaks
// the one thing the claim rests on: a single row per key, enforced by one
// unique index. PostgreSQL enforces uniqueness on a partitioned table only
// for indexes that include the partition key, so a key would be unique per
// day, not per table; a completion moves its row to another day (a delete
// and an insert, which ON CONFLICT cannot see across partitions); and two
// claims of the same key landing in two partitions are two records,
// executed twice. Partitioning by creation day has the same hole for a
// key claimed again after its old row's day; partitioning by key hash
// keeps the uniqueness but drops nothing.
//
// pgstore keeps one table and deletes expired rows continuously:
//
//   - [Store.Sweep] deletes at most n expired rows per call: DELETE ...
//     WHERE ctid = ANY (ARRAY(SELECT ctid ... WHERE expires_at <= now
//     ORDER BY expires_at LIMIT n FOR UPDATE SKIP LOCKED)). The sub-select
//     is a range scan of the expires_at index that stops at the first live
//     row, so a call costs O(n) whatever the table's size; each call is a
//     short transaction holding n row locks; rows a claim or another
//     sweeper holds are skipped, not waited for, so sweepers run in
//     parallel and never delay claims. Run `idem sweep` (or Sweep in a
//     loop until it returns 0) every minute or continuously: a sweeper
//     deleting 5,000 rows per call removes several hundred thousand rows a
//     second here (BenchmarkSweep), a thousand times the 385 a second
//     that 10⁹ keys a month expire at.
//   - Keys expire in about the order they were claimed, so the dead rows
//     are the oldest: vacuum returns their space to the free space map and
//     new claims reuse it; the table stays at the live rows plus the dead
//     rows of one vacuum cycle. The expires_at index grows at its right
//     end and is emptied at its left. The migration sets the table's
//     autovacuum_vacuum_scale_factor and autovacuum_analyze_scale_factor
//     to 0.02 (vacuum once 2% of the rows are dead, about 4.6 million
//     here, every hour and a half) instead of PostgreSQL's 20%, which
//     would let 46 million dead rows accumulate. At this rate also raise
//     autovacuum_vacuum_cost_limit (e.g. ALTER TABLE ... SET
//     (autovacuum_vacuum_cost_limit = 2000)) so one vacuum finishes well
//     within a cycle, and keep maintenance_work_mem large enough for one
//     cycle's dead row ids (6 bytes each: 28 MB here) so that each index
//     is scanned once per vacuum.
//   - Migration 002 sets vacuum_truncate = false: vacuum does not give
//     the emptied end of the table back to the file system (new claims
//     reuse it), so it never takes the ACCESS EXCLUSIVE lock that
//     truncation needs, a stall for every call on the table. To shrink
//     the file after a one-off spike, run VACUUM (TRUNCATE) by hand.
//   - A new table is planned afresh on every call while it is small, so
//     that no connection caches a plan that scans a table that has since
//     grown (see plans.go); cached plans take over once it is large.
//   - The size is claim rate × retention: retention is the knob. It must
//     cover the senders' retry horizon (webhook senders retry for about
//     three days), not much more.
//
// The indexes the sweep and `idem ls --stuck` need make every completion a
// non-HOT update (expires_at and status are indexed): each key costs two
// heap tuples and five index entries over its life. That is the price of
// a sweep and a stuck list that cost what they return, not what the table
// holds.
//
// # Performance
//
// Measured on a 2-core machine running both PostgreSQL 15
// (synchronous_commit=on) and the benchmark, in runs interleaved with
// pgbench's single-row INSERT ... ON CONFLICT DO NOTHING at the same
// number of clients (about 10,000 transactions a second at 8 and at 64
// clients): an unbatched claim+complete of a new key, two statements and
// two commits, ran at 0.3 to 0.6 times pgbench's rate at 8 clients
// (typically 0.35 to 0.45) and 0.3 to 0.5 times at 64, where the machine
// is CPU-bound; a claim alone at about pgbench's rate; a ClaimBatch of 10
// keys at 2.5 to 6 times pgbench's rate in keys (typically 3), and a
// ClaimBatch followed by a FinishBatch of the 10 at 1.2 to 3.3 times
// (typically 1.6); since batches of new keys start with the plain insert
// (above), the statement runs at 0.88 to 0.95 of a bare insert of the
// same rows, against 0.73 for the full claim, and ClaimBatch of 10 runs
// at 1.7 to 2.7 times River's InsertMany of 10 unique jobs (bench/). A
// duplicate (a claim of a completed key) only
// reads: about 8,000 a second from one goroutine. A Ledger made with
// [idem.WithCoalescing] sends its concurrent calls' claims as ClaimBatch
// statements and their completions as FinishBatch statements: at 64
// callers, 0.44 to 0.48 times pgbench's rate for a claim and a completion
// of each key, two to three times the unbatched figure. At 8 callers
// batches were too small to pay (164 against 131 client CPU-µs a key), so
// a Ledger does not coalesce below [idem.DefaultCoalescingFrom] calls at
// once. See bench_test.go for the commands.
package pgstore
