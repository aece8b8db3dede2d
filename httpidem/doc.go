// Package httpidem is net/http middleware for the Idempotency-Key request
// header (IETF draft-ietf-httpapi-idempotency-key-header), with Stripe's
// behaviour where the draft is silent. A client sends a unique key with a
// POST; if the response is lost and the client retries with the same key,
// the handler does not run again: the client gets the first response,
// replayed, with Idempotent-Replayed: true.
//
//	l := idem.New(store)
//	m := httpidem.New(l, httpidem.WithScope(tenantOf), httpidem.WithRequired(true))
//	mux.Handle("POST /charges", m.Handler(charges))
//
// Requests are recorded in an [idem.Ledger], so the middleware works on
// every store.Store, and one store can serve several servers: the first
// request to claim a key runs the handler, under the ledger's lease and
// heartbeat.
//
// # What a request gets
//
//   - Method not protected (anything but POST and PATCH; [WithMethods]):
//     passed through, key or not.
//   - No key: passed through and not recorded, or 400 "key-missing" when
//     the route requires one ([WithRequired]).
//   - A malformed key: 400 "key-invalid", before the store is touched. The
//     key must be an RFC 9651 sf-string ("..."; see [ParseKey]); a bare key
//     is accepted too unless [WithBareKeys](false). Also refused: an empty
//     key, a key over 255 bytes ([WithMaxKeyLen]), non-ASCII bytes (so a key
//     that is not UTF-8 never reaches the store), several Idempotency-Key
//     field lines, a key the [WithKeyValidator] function refuses.
//   - A body over 1 MiB ([WithMaxBody]): 413; a body that does not arrive
//     in time: 408 ([WithBodyTimeout], or the server's ReadTimeout); a body
//     that cannot be read: 400. The body is read before the key is claimed,
//     so none of these claims it, and a slow client never holds a key.
//   - A new key: the handler runs and its response streams to the client as
//     it is written. When the handler returns, the response is recorded
//     (status, the headers of [WithReplayHeaders], the body) for
//     [WithRetention] (24 h), unless its status is not kept: 408, 409, 423,
//     425, 429 (the handler says it did not act) and 5xx (unless
//     [WithStoreServerErrors]). A response that is not kept releases the
//     key: the client gets the handler's response, and a retry runs the
//     handler again.
//   - A finished key, same request: the recorded status, headers and body,
//     byte for byte, with Idempotent-Replayed: true. The handler does not
//     run.
//   - A key used with a different request: 422 "key-reused", also while
//     the first request is still running, and after it crashed (its lease
//     lapsed: only a retry of the same request takes the key over; a
//     response that was not kept, which released the key, lets any
//     request run). "The same
//     request" means the same method, route pattern (when a ServeMux routed
//     the request before the middleware), escaped path, query (keys
//     sorted), media type and parameters of Content-Type, headers named by
//     [WithFingerprintHeaders], and body (byte for byte, or as RFC 8785
//     canonical JSON with [WithCanonicalJSON]). So a key reused on another route or
//     method is refused, not replayed.
//   - A key whose first request is still running: 409 "request-in-progress"
//     with Retry-After (1 s; [WithRetryAfter]); or, with [WithBusyWait], the
//     request waits for the first one and is answered as a replay.
//   - The store cannot be reached: 503 "store-unavailable" with
//     Retry-After. The handler does not run (fail closed).
//   - The same key under another scope ([WithScope]: tenant, user): a
//     separate key. A key from tenant A never replays tenant B's response,
//     and B is never told that A used it.
//
// Every response to a keyed request on a protected method carries
// Idempotency-Retention: the retention in seconds (the draft asks servers
// to publish their expiry policy).
//
// Errors are application/problem+json (RFC 9457) with type
// [DefaultProblemBase] + one of the Problem* constants (the section of
// docs/problems.md that documents it), a fixed title, and a detail that
// never repeats the key, the body or an internal error.
//
// # Edge cases
//
// Responses over [WithMaxResponse] (128 KiB): the client gets the whole
// response, and the key is recorded with the status and headers but no
// body, so a retry never runs the handler again: it gets the status, the
// headers, an empty body, Idempotent-Replayed: true and
// Idempotency-Body-Omitted: true. A text/event-stream response is recorded
// the same way, and so is a response the client stopped taking midway (a
// write to it failed: what the handler wrote after is unknown, and the
// part the client took is not the whole body). Flushing is passed through (http.Flusher and
// http.ResponseController work on the writer the handler gets) and does not
// by itself stop the body from being kept. A handler that hijacks the
// connection records the key as not replayable: retries get 422
// "response-not-kept". Trailers and 1xx responses are passed through and
// not kept.
//
// The handler's context is the request's, cancelled when the client goes
// away or when the ledger's heartbeat finds the lease lost. If the handler
// then returns without writing anything, nothing is recorded and the key
// is released: a retry runs the handler again. The client gets 500
// "outcome-unknown", without the headers the handler set for the answer it
// did not give (a Content-Encoding would make the problem unreadable). If it wrote a response
// anyway (the work was done), that response is recorded as usual, so a
// retry gets it. A handler whose work must finish whatever the client does
// should run it under [context.WithoutCancel].
//
// A handler that panics: the key is released and the panic goes on to
// net/http. The write that records the response is retried while the store
// fails, within [idem.Ledger.FinishTimeout], and the response is sent once
// it is recorded. A store that stays down for that whole window: the client
// keeps the handler's response; the key stays claimed until its lease
// lapses, and a retry after that runs the handler again. That is the ledger's at-least-once policy;
// under an [idem.AtMostOnce] ledger the key becomes indeterminate instead
// and retries get 500 "outcome-unknown" until an operator resolves it.
//
// Resolving such a key: `idem resolve KEY --not-done` releases it, and the
// next retry runs the handler. `idem resolve KEY --done` says the effect
// happened; the middleware has no response to replay for it (whatever
// --result holds is the operator's note, not a response), so retries get
// 422 "response-not-kept", as after a hijack, and the handler does not run
// again. The key to resolve is the operation key below (see `idem ls
// --stuck`).
//
// # Libraries
//
// Besides the standard library and idem, httpidem imports one library:
// github.com/dunglas/httpsfv parses the Idempotency-Key field as an RFC 9651
// Item ([ParseKey]). It implements RFC 9651 (and 8941) whole, passes the HTTP
// WG's structured-field-tests, is fuzzed, has no dependencies and is
// maintained (v1.1.2, September 2026). It replaced httpidem's own parser,
// which the tests keep as the reference FuzzParseKeyHTTPSFV compares it
// with: they accept and refuse the same inputs and return the same keys,
// except a byte-sequence parameter whose base64 lacks its "=" padding
// ("k";p=:AQI:), which httpsfv refuses and the old parser accepted, as RFC
// 9651 §4.2.7 says parsers SHOULD. The draft defines no parameter, so no
// client sends one; a refused key gets 400 key-invalid, never a wrong key.
// Its cost: about 100 ns and 3 allocations more per keyed request, under
// 1% of the middleware's overhead on a new key (BenchmarkOverhead, within
// its noise).
//
// RFC 8785 canonical JSON ([WithCanonicalJSON]) is written here, with the
// standard library, rather than imported from a JCS library
// (github.com/cyberphone/json-canonicalization, github.com/gowebpki/jcs):
// httpidem takes one library, it is 250 lines, and its refusals (numbers a
// double does not hold, lone surrogates, repeated names) are the
// fingerprint's, not a library's. It is tested with RFC 8785's samples and
// Appendix B numbers, vendored in testdata/jcs, and fuzzed (FuzzJCS). It
// is a little faster than the form it replaced (BenchmarkCanonicalJSON).
//
// # Fingerprints across the RFC 8785 upgrade
//
// [WithCanonicalJSON] canonicalises JSON bodies per RFC 8785 (JCS),
// implemented in this package with the standard library and checked against
// RFC 8785's published samples and Appendix B numbers (testdata/jcs). It
// used to use a form of its own (encoding/json's: numbers as written,
// members sorted by UTF-8 bytes, U+2028 escaped, a trailing newline), so the
// fingerprint of every JSON body it canonicalises changed. Records carry
// their request's fingerprint, so without care a retry of a request made
// before the upgrade would look like another request and get 422
// key-reused. The middleware keeps the old canonical form
// (legacyCanonicalJSON, unchanged) for that: when the ledger answers
// [idem.ErrMismatch] to a request whose old fingerprint differs from its
// new one, it asks again under the old fingerprint. A record written
// before the upgrade is thus matched as it was (replayed, busy, or taken
// over if its attempt lapsed); a different request mismatches both and
// still gets 422. The second store call happens only on a mismatch, only
// with WithCanonicalJSON, and never runs the handler twice: the first call
// ran nothing. Matching the old fingerprint means "the same request" as the
// old version meant it (1.0 and 1 differed), which is no looser than
// before. An attempt that takes over an old record keeps its old
// fingerprint, so that key is matched the old way until it expires.
// Records written after the upgrade carry the RFC 8785 fingerprint. The
// fallback can go once every record written before the upgrade has
// expired ([WithRetention], 24 h by default; an indeterminate record stays
// until an operator resolves it).
//
// The stored result is compact binary (a version byte, flags, status,
// header lines and body); a result without the version byte is an
// operator's (see above), and one with it that does not decode gets 500
// "record-unreadable". The key is idem.Key("http", scope, key), or
// idem.Key("http", key) without a scope function ([WithNamespace] changes
// "http").
package httpidem
