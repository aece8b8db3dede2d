// Package store is what a store author implements and may reuse: the
// [Store] interface with its request and result types, the [Record] it
// keeps per key, the record's state machine (the Apply functions and
// [Slot]) for stores that read a record and write it back in one atomic
// step of their own, and the journal's codec.
//
// Users of idem do not need this package: they make a store with a
// driver's constructor (sqlitestore.Open, memstore.New, pgstore.New, ...)
// and hand it to idem.New. The package idemtest holds the conformance
// suite every Store must pass.
//
// # The record's life
//
//	           Claim                     Finish(completed)
//	(absent) ─────────▶ in_progress ───────────────────▶ completed ──retention──▶ (absent)
//	   ▲                 │   │   │      Finish(failed)
//	   │ Finish(released)│   │   └──────────────────────▶ failed ────retention──▶ (absent)
//	   └───── released ◀─┘   │
//	                         │ the lease passes without an end
//	                         ▼
//	                       lapsed (derived on every read, never written)
//
// A lapsed attempt is taken over by the next claim when the record's
// policy is [AtLeastOnce] (or the claim sets [ClaimRequest.TakeLapsed]);
// under [AtMostOnce] it stays until someone resolves it.
//
// # Attempts and fences
//
// Every claim carries an attempt id ([ClaimRequest.AttemptID], made with
// [NewAttemptID]: unguessable, unique across processes and record lives)
// and gets a fence. Every write that ends or extends the attempt
// ([Store.Finish], [Store.Extend], [Store.Resolve] with conditions) names
// both, and a store checks them in the same atomic step that writes: an
// attempt that no longer holds the key gets [ErrLeaseLost], whatever
// happened meanwhile (a takeover, a delete and a new claim, its own earlier
// finish, an operator's decision). The journal keeps each attempt's id, so
// a caller whose write's answer was lost can read the key and see whether
// the write landed ([Record.EntryOf]).
//
// A key's fences never repeat, across deletes, sweeps and expiry, so a
// downstream system that keeps the highest fence it saw refuses every
// stale writer. A new record's first fence is [FirstFence] of the store's
// clock (microseconds since 1970) and a floor the store may keep; every
// later claim or resolution adds one. Stores differ in the clock they
// read and what, if anything, they keep as a floor: memstore keeps one per
// shard, sqlitestore an exact floor in a table, pgstore and redisstore
// read the server's clock, dynamostore the client's (docs/stores.md in the
// repository says, store by store, when a fence could repeat).
//
// # Writing a store
//
// Implement [Store] with one atomic conditional write per call (a
// transaction, a conditional update, a script), deciding each outcome with
// the Apply functions so that every store answers alike; add
// [BatchClaimer], [BatchFinisher] or [TxStore] where the backend can do
// better than one call at a time; and pass idemtest.TestStore. Errors:
// [ErrLeaseLost], [ErrNotFound] and [*CorruptError] are answers; anything
// else is a store error, which the Ledger never reads as an outcome.
// docs/design.md in the repository explains the contract:
// https://github.com/idemkit/idem/blob/main/docs/design.md
//
// This package imports only the standard library.
package store

import "time"

// DefaultRetention is the retention of a [ResolveRequest] that names none, and
// the idem Ledger's default retention.
const DefaultRetention = 7 * 24 * time.Hour
