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
// This package imports only the standard library.
package store

import "time"

// DefaultRetention is the retention of a [Resolution] that names none, and
// the idem Ledger's default retention.
const DefaultRetention = 7 * 24 * time.Hour
