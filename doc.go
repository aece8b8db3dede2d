// Package idem makes side effects happen once in systems that deliver at
// least once.
//
// Queues redeliver, webhook senders retry, workers die between "sent" and
// "recorded", users click twice. idem names each operation (send order
// 8891's receipt to user 7) by a key built from business identifiers,
// identical on every retry, and keeps one durable record per key.
// [Ledger.Do] claims the key, runs fn, records fn's result, and replays that
// result to every later call for the key:
//
//	st, err := sqlitestore.Open(ctx, "idem.db") // memstore.New() in tests
//	if err != nil {
//		return err
//	}
//	ledger := idem.New(st)
//
//	key := idem.Key("receipt", orderID, userID) // "receipt:8891:7"
//	res, err := ledger.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
//		id, err := mailer.Send(ctx, key.String(), receipt) // ctx ends if the key is lost
//		return []byte(id), err
//	})
//
// [Run] does the same with a typed result stored as JSON. [DoTx] runs the
// claim, your own writes and the completion in one SQL transaction, so an
// effect in the store's own database happens exactly once. In a queue
// consumer, an HTTP API or a webhook receiver, packages queue, httpidem and
// webhook call Do for you.
//
// # Errors to switch on
//
// Do either runs fn, replays a completed key (Result.Replayed, with the
// stored Result.Value), or says why it did neither:
//
//	switch {
//	case err == nil: // done: fn ran now, or earlier (res.Replayed)
//	case errors.Is(err, idem.ErrInProgress): // another attempt holds the key: retry later
//	case errors.Is(err, idem.ErrIndeterminate): // an AtMostOnce attempt lapsed: someone must decide
//	case errors.Is(err, idem.ErrMismatch): // the key was reused for a different request
//	case errors.Is(err, idem.ErrFailed): // failed for good earlier (see Permanent)
//	case errors.Is(err, idem.ErrLeaseLost): // this attempt lost the key while fn ran
//	case errors.As(err, new(*idem.StoreError)): // the store did not answer: nothing is known
//	default: // fn's own error, recorded as the policy says
//	}
//
// A [*StoreError] is never an outcome: the operation may or may not have
// run, and the key is left to its lease and policy. fn says what its error
// means by wrapping it: [Permanent] (never retry) or [NotDone] (nothing
// happened; retry).
//
// # Policies
//
// No ordering of "send" and "record" is safe in every case, because they are
// not one atomic operation. The policy says which failure you would rather
// explain when a worker dies after the effect and before its record:
//
//   - [AtLeastOnce] (the default): the lease lapses and the next call takes
//     over and runs fn again (Result.Takeover): the effect may repeat.
//   - [AtMostOnce]: the effect is never repeated by itself; the key is left
//     indeterminate for a [ReconcileFunc] or an operator (`idem ls --stuck`,
//     `idem resolve`).
//   - [WithReconcile]: on a takeover, a hook asks the provider whether the
//     effect happened before fn runs again.
//   - [DoTx]: no window at all, when the effect lives in the store's database.
//
// # Options that matter
//
// For the Ledger ([New]) or one call ([Ledger.Do]): [WithPolicy],
// [WithLease] (how long a claim holds the key, default 30 s; heartbeats
// extend it while fn runs) and [WithRetention] (how long a finished record
// is remembered, default 7 days: it must cover the senders' retry horizon).
// Per call: [Fingerprint] (catch a key reused for another request),
// [WithReconcile], [WithCorrelationID]. Per Ledger: [WithLogger],
// [WithOwner], and on a network store under load [WithCoalescing].
//
// # Logs, metrics and traces
//
// Each call logs one line (see [WithLogger] for the levels: one INFO line
// per effect run, duplicates and busy keys at DEBUG); [ContextWithLogger]
// gives one operation a logger of its own. [WithObserver] attaches an
// [Observer] that is told of every call, and of what the queue consumers,
// webhook Receivers and httpidem middleware built on the Ledger do, for
// metrics and traces. fn reads its own attempt, and the fence to pass
// downstream, with [AttemptFromContext].
//
// # Stores
//
// store/sqlitestore is the embedded, durable default; store/memstore keeps
// records in memory for tests; store/pgstore, store/redisstore and
// store/dynamostore keep them in PostgreSQL, Redis and DynamoDB. Every store
// passes the conformance suite in package idemtest. Records keep a short
// journal of attempts, from which `idem explain KEY` tells whether two
// effects came from a takeover after a crash, from overlapping attempts, or
// from a record that expired too soon.
//
// # How it works
//
// A claim is one atomic conditional write. Every claim increments the key's
// fence, and every write that ends an attempt must present it, so an attempt
// that lost its lease (a long GC pause, a partition) cannot overwrite its
// successor's record: its writes get [ErrLeaseLost]. Each attempt also has an
// id of its own, so a store answer lost in a timeout is not read as a crash:
// a claim that landed unseen is given back, and a finishing write is sent
// again until the store answers. The fence is also a good idempotency key to
// pass downstream (key + ":" + fence; fn finds it with
// [AttemptFromContext]). docs/design.md in the repository
// explains leases, fences, lost answers and every guarantee:
// https://github.com/idemkit/idem/blob/main/docs/design.md
//
// This package imports only the standard library.
package idem
