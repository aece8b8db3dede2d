// Package httpidem is net/http middleware for the Idempotency-Key request
// header (IETF draft-ietf-httpapi-idempotency-key-header), with Stripe's
// behaviour where the draft is silent. A client sends a unique key with a
// POST; if the response is lost and the client retries with the same key,
// the handler does not run again: the client gets the first response,
// replayed, with Idempotent-Replayed: true. Use it on endpoints whose
// handler has an effect a client may retry: payments, orders, bookings.
//
//	ledger := idem.New(store)
//	m := httpidem.New(ledger, httpidem.WithScope(tenantOf), httpidem.WithRequired(true))
//	mux.Handle("POST /charges", m.Handler(charges))
//
// The package's example (New) runs this with a retry and a request
// without a key. Requests are recorded in an [idem.Ledger], so the
// middleware works on every store, and one store can serve several
// servers: the first request to claim a key runs the handler, under the
// ledger's lease and heartbeat.
//
// # What a request gets
//
//   - A new key: the handler runs, its response streams to the client, and
//     the response (status, headers of [WithReplayHeaders], body) is
//     recorded, unless its status says the handler did not act (408, 409,
//     423, 425, 429, and 5xx unless [WithStoreServerErrors]): that
//     releases the key, and a retry runs the handler again.
//   - A retry of the same request: the recorded response, byte for byte,
//     with Idempotent-Replayed: true. The handler does not run.
//   - The same key with a different request (method, route, path, query,
//     Content-Type, [WithFingerprintHeaders], body): 422 "key-reused".
//   - A key whose first request is still running: 409
//     "request-in-progress" with Retry-After, or a wait ([WithBusyWait]).
//   - The store cannot be reached: 503 "store-unavailable" with
//     Retry-After. The handler does not run (fail closed).
//   - No key: passed through unrecorded, or 400 "key-missing" with
//     [WithRequired]. A malformed key (see [ParseKey]): 400
//     "key-invalid". A body too large, too slow or unreadable: 413, 408,
//     400; the body is read before the key is claimed, so a slow client
//     never holds a key.
//   - Methods other than POST and PATCH ([WithMethods]) pass through.
//
// Errors are application/problem+json (RFC 9457) with type
// [DefaultProblemBase] + one of the Problem* constants, a fixed title, and
// a detail that never repeats the key, the body or an internal error.
// Every response to a keyed request carries Idempotency-Retention.
//
// # Crashes, cancellations and store errors
//
// A handler that panics, or whose context ends (the client went away, or
// the ledger lost the lease) before it wrote anything, releases the key: a
// retry runs it again, and the cancelled client gets 500
// "outcome-unknown". A response that was written is recorded whatever
// happens to the client. The write that records a response is retried
// while the store fails, within [idem.Ledger.FinishTimeout]; a store that
// stays down longer, or a server that crashes, leaves the key claimed
// until its lease lapses, and a retry then runs the handler again (under
// an [idem.AtMostOnce] ledger the key becomes indeterminate instead, for
// `idem resolve`). A handler whose work must finish whatever the client
// does should run it under [context.WithoutCancel]. Responses over
// [WithMaxResponse], event streams and hijacked connections are recorded
// without a body to replay (docs/httpidem.md says what retries get).
//
// # Options and defaults
//
//   - [WithScope]: a tenant or user per request, so that one tenant's key
//     never replays another's response. Default: no scope.
//   - [WithRequired]: default false (a request without a key passes).
//   - [WithRetention]: how long a response is replayed, default 24 h
//     ([DefaultRetention]); [WithLease]: default the ledger's.
//   - [WithMaxBody] 1 MiB, [WithMaxResponse] 128 KiB, [WithBodyTimeout]
//     (default: the server's ReadTimeout only), [WithRetryAfter] 1 s,
//     [WithBusyWait] 0, [WithMaxKeyLen] 255 bytes, [WithBareKeys] true.
//   - [WithCanonicalJSON]: compare JSON bodies as RFC 8785 canonical JSON
//     (default false: byte for byte).
//   - [WithReplayHeaders] (default [DefaultReplayHeaders]),
//     [WithKeyValidator], [WithNamespace] ("http"), [WithProblemBase],
//     [WithLogger].
//
// docs/httpidem.md in the repository gives the whole contract request by
// request, the edge cases (large and streamed responses, hijacks,
// resolving a stuck key), what is stored under which operation key, the
// libraries httpidem uses, and how fingerprints from before the RFC 8785
// change still match:
// https://github.com/idemkit/idem/blob/main/docs/httpidem.md
package httpidem
