package httpidem

import (
	"net/http"
	"time"

	"github.com/idemkit/idem/internal/problem"
)

// Problem types: the last part of the "type" member of the
// application/problem+json (RFC 9457) bodies the middleware sends, after the
// base set by [WithProblemBase]. Titles are fixed; the detail never repeats
// the key, the body, or an error's text.
const (
	// 400: the route requires a key and the request has none.
	ProblemKeyMissing = "key-missing"
	// 400: the key is not an sf-string (nor an accepted bare key), is
	// empty, too long, sent on several field lines, or refused by the
	// validator.
	ProblemKeyInvalid = "key-invalid"
	// 422: the key was already used with another request (method, path,
	// query, content type or body differ).
	ProblemKeyReused = "key-reused"
	// 409: the first request with this key is still running; retry the same
	// request after Retry-After.
	ProblemInProgress = "request-in-progress"
	// 503: the store could not be reached; nothing ran. Retry after
	// Retry-After with the same key.
	ProblemStoreUnavailable = "store-unavailable"
	// 413: the request body is over [WithMaxBody]; nothing ran.
	ProblemBodyTooLarge = "body-too-large"
	// 408: the request body did not arrive in time; nothing ran.
	ProblemBodyTimeout = "body-timeout"
	// 400: the request body could not be read; nothing ran.
	ProblemBodyUnreadable = "body-unreadable"
	// 500: the scope function failed; nothing ran.
	ProblemScopeFailed = "scope-failed"
	// 500: an earlier attempt with this key started and its outcome is
	// unknown ([idem.ErrIndeterminate] under an AtMostOnce ledger), or the
	// handler was interrupted before it answered. The handler is not run
	// again until an operator resolves the key (`idem resolve`).
	ProblemOutcomeUnknown = "outcome-unknown"
	// 422: the key is done but has no response to replay: the handler
	// hijacked the connection, or an operator resolved the key as done
	// (`idem resolve KEY --done`). Use a new key to do it again.
	ProblemResponseNotKept = "response-not-kept"
	// 500: the stored response is in the middleware's format but cannot be
	// decoded; the handler is not run again.
	ProblemRecordUnreadable = "record-unreadable"
)

var problemTitles = map[string]string{
	ProblemKeyMissing:       "Idempotency-Key is missing",
	ProblemKeyInvalid:       "Idempotency-Key is invalid",
	ProblemKeyReused:        "Idempotency-Key is already used",
	ProblemInProgress:       "A request is outstanding for this Idempotency-Key",
	ProblemStoreUnavailable: "Idempotency store unavailable",
	ProblemBodyTooLarge:     "Request body too large",
	ProblemBodyTimeout:      "Request body timed out",
	ProblemBodyUnreadable:   "Request body unreadable",
	ProblemScopeFailed:      "Idempotency scope unavailable",
	ProblemOutcomeUnknown:   "Outcome of an earlier request with this Idempotency-Key is unknown",
	ProblemResponseNotKept:  "Response for this Idempotency-Key was not kept",
	ProblemRecordUnreadable: "Stored response for this Idempotency-Key is unreadable",
}

// writeProblem answers with an RFC 9457 problem document. retryAfter > 0
// adds Retry-After (whole seconds, rounded up).
func (m *Middleware) writeProblem(w http.ResponseWriter, status int, kind, detail string, retryAfter time.Duration) {
	if sw, ok := w.(*statusWriter); ok {
		sw.problem = kind // for the RequestEnd event
	}
	problem.Write(w, status, m.cfg.problemBase+kind, problemTitles[kind], detail, nil, retryAfter)
}
