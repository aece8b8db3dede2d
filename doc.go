// Package idem makes side effects happen once in systems that deliver at
// least once.
//
// Queues redeliver, webhook senders retry, workers die between "sent" and
// "recorded", users click twice. An operation (send order 8891's receipt to
// user 7) is named by a key built from business identifiers, identical on
// every retry:
//
//	key := idem.Key("receipt", orderID, userID) // "receipt:8891:7"
//
// [Ledger.Do] claims the key in a [store.Store] with one atomic conditional write,
// runs fn under a lease that heartbeats extend, records fn's result, and
// replays that result to every later call for the key:
//
//	res, err := ledger.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
//		return send(ctx)
//	})
//
// # Outcomes
//
// A call either runs fn (Result.Replayed false), replays a completed key
// (Replayed true), or returns an error that says why it did neither:
// [ErrInProgress] (another attempt holds the key: retry later),
// [ErrIndeterminate] (an AtMostOnce attempt lapsed; someone must decide),
// [ErrMismatch] (the key was reused for a different request, see
// [Fingerprint]), [ErrFailed] (failed for good with [Permanent]),
// [ErrLeaseLost] (this attempt lost its lease while running), or a
// [*StoreError] (the store could not answer). A store error is never an
// outcome: the operation may or may not have run, and the key is left to its
// lease and policy.
//
// # Leases and fences
//
// A claim holds the key for a lease (default 30 s), extended about every
// third of it while fn runs. A holder that crashes stops extending; once its
// lease lapses the key is decided by the claim's [Policy]. Every successful
// claim increments the key's fence, and every write that ends an attempt must
// present it, so an attempt that lost its lease (a long GC pause, a
// partition) cannot overwrite its successor's record: its writes get
// [ErrLeaseLost], and its fn's context is cancelled when a heartbeat notices.
// Fences never repeat for a key: a record's first fence comes from the
// store's clock (in microseconds), so one deleted (`idem delete`), swept or
// expired and claimed anew starts above every fence it had.
//
// Every attempt also has an identity of its own, made before its claim is
// sent, which every write ending or extending the attempt names: so a
// store whose answer was lost (a timeout, a cut connection) is not read as
// a crash. A claim that landed without its answer reaching the caller is
// found by that identity and given back at once (fn did not run), and a
// write that ends an attempt is sent again, with backoff, until the store
// answers or the call's finish timeout passes.
// When heartbeats cannot reach the store until the lease runs out, fn's
// context is cancelled as well; what fn returns is still recorded under its
// fence if the store, read again, still shows this attempt holding the key
// (and the store takes it unless another attempt took the key meanwhile).
// The fence is also a good idempotency key to pass downstream
// (key + ":" + fence) to providers that deduplicate.
//
// # Policies
//
// No ordering of "send" and "record" is safe in every case, because they are
// not one atomic operation. [AtLeastOnce] (the default) repeats an effect
// whose attempt crashed before recording it; [AtMostOnce] never repeats it
// and leaves the key indeterminate for a [ReconcileFunc] or an operator
// (`idem resolve`). When the effect lives in the store's own database,
// [DoTx] removes the window altogether.
//
// # Stores
//
// store/sqlitestore is the embedded, durable default; store/memstore keeps
// records in memory for tests. Every store passes the conformance suite in
// package idemtest. Records keep a short journal of attempts, from which
// `idem explain KEY` tells whether two effects came from a takeover after a
// crash, from overlapping attempts, or from a record that expired too soon.
//
// This package imports only the standard library.
package idem
