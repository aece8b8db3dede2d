package httpidem

import (
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/idemkit/idem/internal/problem"
)

// Defaults used by [New] when no option says otherwise.
const (
	// DefaultMaxKeyLen is the longest Idempotency-Key accepted, in bytes
	// (Stripe's limit).
	DefaultMaxKeyLen = 255
	// DefaultMaxBody is the largest request body the middleware reads to
	// fingerprint the request (1 MiB).
	DefaultMaxBody = 1 << 20
	// DefaultMaxResponse is the largest response body kept for replay
	// (128 KiB). It keeps a record below DynamoDB's 400 KB item limit.
	DefaultMaxResponse = 128 << 10
	// DefaultRetention is how long a finished request is remembered (24 h,
	// as Stripe does).
	DefaultRetention = 24 * time.Hour
	// DefaultRetryAfter is the Retry-After sent with 409 (request in
	// progress) and 503 (store unavailable).
	DefaultRetryAfter = time.Second
	// DefaultNamespace is the first part of every operation key the
	// middleware builds.
	DefaultNamespace = "http"
	// DefaultProblemBase is the prefix of the problem type URIs; the type is
	// the base followed by one of the Problem* names, e.g.
	// "https://github.com/idemkit/idem/blob/main/docs/problems.md#httpidem-key-missing",
	// the section of docs/problems.md that documents it. The IETF draft
	// registers no problem types, so these are this package's.
	DefaultProblemBase = problem.TypeBase + "httpidem-"
)

// DefaultReplayHeaders are the response headers kept and replayed when
// [WithReplayHeaders] is not given. Content-Encoding is among them because
// the body is replayed byte for byte: without it, a compressed body cannot
// be read. So are the headers a replayed status needs to mean what it
// meant: Allow (405), WWW-Authenticate (401), Retry-After (a 503 kept
// with [WithStoreServerErrors], a 3xx), Content-Range (206, 416), and
// Content-Disposition (a download). None is a credential or a framing
// header.
var DefaultReplayHeaders = []string{
	"Allow", "Cache-Control", "Content-Disposition", "Content-Encoding", "Content-Language",
	"Content-Location", "Content-Range", "Content-Type", "ETag", "Expires", "Last-Modified",
	"Link", "Location", "Retry-After", "Vary", "WWW-Authenticate",
}

// neverReplayed are headers that are never kept, even when listed in
// WithReplayHeaders: credentials and cookies belong to one exchange, and the
// framing headers would be wrong on a replay (a replay may omit the body).
var neverReplayed = map[string]bool{
	"Set-Cookie": true, "Set-Cookie2": true, "Authorization": true, "Proxy-Authorization": true,
	"Cookie": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true,
	"Trailer": true, "Keep-Alive": true, "Upgrade": true, "Proxy-Authenticate": true,
	HeaderReplayed: true, HeaderBodyOmitted: true, HeaderRetention: true,
}

// ScopeFunc returns the scope a request's key belongs to: the tenant, user
// or API principal that the server (not the client) knows. Keys are looked
// up per scope, so a key sent by tenant A never replays tenant B's response
// (the IETF draft's "composite lookup key"). It runs after the key is parsed
// and before the body is read.
//
// An error, or an empty scope, stops the request with 500 (problem type
// "scope-failed"; the error is logged, never sent). Authenticate before the
// middleware, so that the function cannot fail for an anonymous caller (a
// 401 from authentication is then never recorded, as with Stripe). Return a
// constant such as "global" to share one scope on purpose.
type ScopeFunc func(r *http.Request) (string, error)

// Option configures a [Middleware] in [New].
type Option func(*config)

type config struct {
	required          bool
	methods           map[string]bool
	scope             ScopeFunc
	namespace         string
	maxKeyLen         int
	bare              bool
	validate          func(key string) error
	maxBody           int64
	bodyTimeout       time.Duration
	maxResponse       int
	storeServerErrors bool
	replayHeaders     map[string]bool
	fpHeaders         []string
	canonicalJSON     bool
	retention         time.Duration
	lease             time.Duration
	busyWait          time.Duration
	retryAfter        time.Duration
	problemBase       string
	log               *slog.Logger
}

func defaultConfig() config {
	c := config{
		methods:     map[string]bool{http.MethodPost: true, http.MethodPatch: true},
		namespace:   DefaultNamespace,
		maxKeyLen:   DefaultMaxKeyLen,
		bare:        true,
		maxBody:     DefaultMaxBody,
		maxResponse: DefaultMaxResponse,
		retention:   DefaultRetention,
		retryAfter:  DefaultRetryAfter,
		problemBase: DefaultProblemBase,
	}
	c.replayHeaders = headerSet(DefaultReplayHeaders)
	return c
}

func headerSet(names []string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		n = http.CanonicalHeaderKey(strings.TrimSpace(n))
		if n != "" && !neverReplayed[n] {
			m[n] = true
		}
	}
	return m
}

// WithRequired makes the key mandatory on protected methods: a request
// without one gets 400 (problem type "key-missing") and the handler does not
// run. Default false: a request without a key passes through unrecorded.
// Use one Middleware per route (or group of routes) to require the key on
// some routes only.
func WithRequired(required bool) Option {
	return func(c *config) { c.required = required }
}

// WithMethods sets the methods the middleware protects (default POST and
// PATCH, as the IETF draft targets). Requests with other methods pass
// through untouched, key or not. Method names are case-sensitive, as in
// HTTP.
func WithMethods(methods ...string) Option {
	return func(c *config) {
		c.methods = make(map[string]bool, len(methods))
		for _, m := range methods {
			c.methods[m] = true
		}
	}
}

// WithScope sets the function that scopes keys to a tenant or principal;
// see [ScopeFunc]. Default: no scope, every client shares one key space
// (fine for a single-tenant API, wrong for anything else).
func WithScope(f ScopeFunc) Option {
	return func(c *config) { c.scope = f }
}

// WithNamespace sets the first part of the operation keys (default
// [DefaultNamespace], "http"), to keep two applications that share one
// store apart. Empty values are ignored.
func WithNamespace(ns string) Option {
	return func(c *config) {
		if ns != "" {
			c.namespace = ns
		}
	}
}

// WithMaxKeyLen sets the longest key accepted, in bytes after unescaping
// (default [DefaultMaxKeyLen], 255). Longer keys get 400 ("key-invalid").
// Non-positive values are ignored.
func WithMaxKeyLen(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.maxKeyLen = n
		}
	}
}

// WithBareKeys sets whether an unquoted key is accepted (default true); see
// [ParseKey]. With false, only an RFC 9651 sf-string is accepted, as the
// IETF draft requires.
func WithBareKeys(allow bool) Option {
	return func(c *config) { c.bare = allow }
}

// WithKeyValidator adds a check on the parsed key (a UUID format, a minimum
// length for entropy). An error gets 400 ("key-invalid"); its text is not
// sent to the client.
func WithKeyValidator(f func(key string) error) Option {
	return func(c *config) { c.validate = f }
}

// WithMaxBody sets the largest request body read to fingerprint a keyed
// request (default [DefaultMaxBody], 1 MiB). The middleware reads the whole
// body before it claims the key, and hands the handler a copy; a larger
// body gets 413 ("body-too-large") without claiming the key or running the
// handler. Non-positive values are ignored.
func WithMaxBody(n int64) Option {
	return func(c *config) {
		if n > 0 {
			c.maxBody = n
		}
	}
}

// WithBodyTimeout bounds the time to read a keyed request's body, through
// [http.ResponseController.SetReadDeadline] (default 0: only the server's
// ReadTimeout applies). The body is read before the key is claimed, so a
// slow client never holds a key; a timeout gets 408 ("body-timeout") and
// the connection is closed. The deadline replaces the server's read
// deadline while the body is read, and is cleared once it has been read.
func WithBodyTimeout(d time.Duration) Option {
	return func(c *config) { c.bodyTimeout = d }
}

// WithMaxResponse sets the largest response body kept for replay (default
// [DefaultMaxResponse], 128 KiB). A larger response is streamed to the
// client in full, and the key is recorded anyway with the status and the
// replayed headers but no body, so a retry never runs the handler again: it
// gets the status, the headers, an empty body, Idempotent-Replayed: true and
// Idempotency-Body-Omitted: true. Keep it below the store's record limit
// (DynamoDB: 400 KB). Non-positive values are ignored.
func WithMaxResponse(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.maxResponse = n
		}
	}
}

// WithStoreServerErrors sets whether a 5xx response from the handler is
// recorded and replayed like any other (true, as Stripe does) or not
// recorded (default false): the key is released, the client gets the 5xx,
// and a retry with the same key runs the handler again. Under an
// [idem.AtMostOnce] ledger, an unrecorded 5xx leaves the key indeterminate
// instead (the handler may have done its effect), and retries get 500
// ("outcome-unknown") until the key is resolved.
func WithStoreServerErrors(store bool) Option {
	return func(c *config) { c.storeServerErrors = store }
}

// WithReplayHeaders sets the response headers kept and replayed (default
// [DefaultReplayHeaders]). Set-Cookie, Authorization and the framing headers
// (Content-Length, Transfer-Encoding, Connection, Trailer) are never kept,
// even when listed.
func WithReplayHeaders(names ...string) Option {
	return func(c *config) { c.replayHeaders = headerSet(names) }
}

// WithFingerprintHeaders adds request headers to the fingerprint (default:
// none). A retry whose listed headers differ gets 422 ("key-reused").
func WithFingerprintHeaders(names ...string) Option {
	return func(c *config) {
		c.fpHeaders = nil
		for _, n := range names {
			c.fpHeaders = append(c.fpHeaders, http.CanonicalHeaderKey(n))
		}
	}
}

// WithCanonicalJSON sets whether a JSON body (Content-Type application/json
// or */*+json) is fingerprinted in its RFC 8785 canonical form (JCS:
// members sorted, no insignificant whitespace, strings and numbers written
// one way, so 1.0, 1e0 and 1 are one number) rather than as its raw bytes
// (default false). With it, a client that re-serialises the same object
// with its keys in another order is not refused with 422, and the body's
// part of the fingerprint is what any RFC 8785 library computes. A body
// that is not I-JSON — not valid JSON, strings that are not valid Unicode
// (bytes that are not UTF-8, lone surrogate escapes), an object whose
// member names repeat ({"amount":100,"amount":5}, which decoders read
// differently) — or with a number a double does not hold exactly as written
// (9007199254740993, which RFC 8785 would round into another request's
// number) is fingerprinted raw. Records written by a version that
// canonicalised JSON otherwise are still recognised: see "Fingerprints
// across the RFC 8785 upgrade" in the package documentation.
func WithCanonicalJSON(canonical bool) Option {
	return func(c *config) { c.canonicalJSON = canonical }
}

// WithRetention sets how long a finished request is remembered (default
// [DefaultRetention], 24 h). A retry after that runs the handler again. The
// middleware advertises it on every response to a keyed request, in the
// Idempotency-Retention header (seconds), and [Middleware.Retention]
// returns it for API documentation. Non-positive values are ignored.
func WithRetention(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.retention = d
		}
	}
}

// WithLease sets the lease of the handler's claim (default: the ledger's,
// see [idem.WithLease]). The ledger extends the lease while the handler
// runs; the lease only bounds how long a crashed server blocks the key.
func WithLease(d time.Duration) Option {
	return func(c *config) { c.lease = d }
}

// WithBusyWait makes a request that finds its key in progress wait up to d
// for the first request to finish, then answer as a replay (or run the
// handler, if the first request's key was released). Default 0: answer 409
// ("request-in-progress") at once.
func WithBusyWait(d time.Duration) Option {
	return func(c *config) { c.busyWait = d }
}

// WithRetryAfter sets the Retry-After of a 409 (request in progress) and a
// 503 (store unavailable) (default [DefaultRetryAfter], 1 s; rounded up to
// whole seconds). A 409 never advertises more than the running lease's
// remaining time.
func WithRetryAfter(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.retryAfter = d
		}
	}
}

// WithProblemBase sets the prefix of problem type URIs (default
// [DefaultProblemBase]).
func WithProblemBase(base string) Option {
	return func(c *config) {
		if base != "" {
			c.problemBase = base
		}
	}
}

// WithLogger sets the logger for what clients are not told: store errors,
// scope errors, records that cannot be decoded (default [slog.Default]). A
// logger in the request's context ([idem.ContextWithLogger]) takes its
// place for that request.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.log = l
		}
	}
}
