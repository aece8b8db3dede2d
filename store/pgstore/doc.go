// Package pgstore keeps idem's ledger in a PostgreSQL table, through pgx
// v5: one row per key, every call one SQL statement and one round trip,
// leases and retention on the server's clock. Use it when the program
// already has PostgreSQL, when several hosts share one ledger, or to run
// idem.DoTx on the program's own tables there.
//
//	s, err := pgstore.Open(ctx, "postgres://app@db:5432/app?sslmode=verify-full")
//	if err != nil {
//		return err
//	}
//	defer s.Close()
//	ledger := idem.New(s)
//
// The package's examples show a Ledger, DoTx with pgx (Store.InTx) and
// with database/sql (SQL), and a sweeper (Store.Sweep).
//
// [Open] makes a connection pool of its own from a URL (or keyword/value
// pairs); [New] uses the caller's *pgxpool.Pool. Both create or update the
// table unless [WithMigrate](false) says otherwise. A Store is safe for
// concurrent use by many goroutines, and any number of processes may share
// a table: the database serializes them, row by row.
//
// # Guarantees
//
// A claim, a completion and every other write is one statement, decided on
// the key's latest committed row: of two claims of a claimable key exactly
// one succeeds, and an attempt's Finish or Extend applies only while its
// fence and attempt id still hold the key (otherwise [store.ErrLeaseLost]).
// A duplicate of a completed key only reads: no lock, no WAL, no flush.
// Every time is the server's, so workers with skewed clocks agree on every
// lease; times are kept to the microsecond.
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
// # Transactions
//
// [Store.InTx] implements [store.TxStore] for [pgx.Tx]: the claim, fn's
// writes through the transaction, and the completion commit together
// (see idem.DoTx), under READ COMMITTED. For database/sql code, [SQL]
// returns a [SQLStore], which implements store.TxStore for *sql.Tx over
// the same pool. A concurrent claim of the key waits for the transaction.
//
// # Keeping the table bounded
//
// Expired rows count as absent but stay until deleted: run `idem sweep`,
// or [Store.Sweep] in a loop until it returns 0, every minute or
// continuously. Sweepers in several processes share the work and never
// delay claims, and a call costs what it deletes, not what the table
// holds. The table's size is claim rate × retention (idem.WithRetention):
// retention is the knob, and must cover the senders' retry horizon.
//
// # Options and defaults
//
//   - [WithSchema], [WithTable] (or the URL parameters idem_schema and
//     idem_table, which the idem command's --store understands): the
//     table, by default idem_records ([DefaultTable]) in the first schema
//     of the search_path. Several ledgers can share a database in
//     tables of their own.
//   - [WithMigrate]: apply the embedded migrations at Open (default true);
//     with false, call [Store.Migrate] from a deployment step.
//   - [WithImplicitJournal]: default true; set false only while builds
//     from before schema version 3 still use the table.
//   - Open's pool uses READ COMMITTED unless the URL says otherwise.
//
// docs/stores.md in the repository explains the table, the claim
// statement, fences, upgrades from older builds, vacuum and sizing at a
// billion keys a month, and measured figures:
// https://github.com/idemkit/idem/blob/main/docs/stores.md#pgstore-postgresql
package pgstore
