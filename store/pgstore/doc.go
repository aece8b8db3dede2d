// Package pgstore is an idem.Store kept in a PostgreSQL table (pgx v5):
// one row per key, every call one SQL statement, leases and retention on
// the server's clock.
//
// The package documentation is being completed; see the doc comments of
// [Open], [New], [Store.Claim] and [Store.InTx].
package pgstore
