package httpidem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
)

// Header names the middleware reads and writes.
const (
	// HeaderKey is the request header carrying the key.
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is set to "true" on every replayed response (Stripe's
	// marker; IETF httpapi issue #46).
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderBodyOmitted is set to "true" on a replay whose body was not
	// kept (over the response size limit, an event stream, or a response
	// the client stopped taking: a write to it failed, so what the handler
	// wrote after is unknown).
	HeaderBodyOmitted = "Idempotency-Body-Omitted"
	// HeaderRetention advertises, in seconds, how long the server remembers
	// a key (the draft asks servers to publish it and defines no header for
	// it; IETF httpapi issue #35). Sent on every response to a keyed request
	// on a protected method.
	HeaderRetention = "Idempotency-Retention"
)

// ErrEmptyScope is logged when a [ScopeFunc] returns an empty scope without
// an error.
var ErrEmptyScope = errors.New("httpidem: scope function returned an empty scope")

// Middleware makes POST and PATCH handlers idempotent under the
// Idempotency-Key request header. Make one with [New]; wrap handlers with
// [Middleware.Handler]. It is safe for concurrent use.
type Middleware struct {
	l         *idem.Ledger
	cfg       config
	ret       string // retention in seconds, for HeaderRetention
	retention idem.CallOption
	lease     idem.CallOption // nil: the ledger's
}

// New returns a Middleware that records requests in l. See the package
// documentation for what it answers when, and the options for the defaults.
func New(l *idem.Ledger, opts ...Option) *Middleware {
	c := defaultConfig()
	for _, o := range opts {
		o(&c)
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	m := &Middleware{l: l, cfg: c, ret: strconv.FormatInt(int64(c.retention/time.Second), 10), retention: idem.WithRetention(c.retention)}
	if c.lease > 0 {
		m.lease = idem.WithLease(c.lease)
	}
	return m
}

// Retention returns how long a finished request is remembered (see
// [WithRetention]), for the API's documentation.
func (m *Middleware) Retention() time.Duration { return m.cfg.retention }

// Handler returns next wrapped in the middleware.
//
// With an [idem.Observer] on the ledger, each request on a protected
// method that carries an Idempotency-Key is a RequestStart (Method, and
// Route: the ServeMux pattern that routed the request to the middleware,
// as with mux.Handle(pattern, m.Handler(h)); empty when the middleware
// wraps the mux. The ledger's call and the handler run under the context
// it returns) and a RequestEnd with the
// Status answered and an Outcome: the ledger's ("executed", "replayed",
// "released" for a response not recorded, "busy", "mismatch",
// "indeterminate", "store-error", "lease-lost"), or "refused" for a
// request answered before its claim. Reason is the problem type answered,
// if any ([ProblemKeyInvalid], [ProblemBodyTooLarge], …).
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if obs := m.l.Observer(); obs != nil && m.cfg.methods[r.Method] && len(r.Header[HeaderKey]) > 0 {
			m.serveObserved(obs, w, r, next)
			return
		}
		m.serve(w, r, next)
	})
}

// serveObserved is serve between a RequestStart and a RequestEnd.
func (m *Middleware) serveObserved(obs idem.Observer, w http.ResponseWriter, r *http.Request, next http.Handler) {
	started := time.Now()
	ctx := obs.Observe(r.Context(), idem.Event{Kind: idem.RequestStart, Method: r.Method, Route: r.Pattern, Started: started})
	if ctx != nil && ctx != r.Context() {
		r = r.WithContext(ctx)
	}
	sw := &statusWriter{ResponseWriter: w}
	out := m.serve(sw, r, next)
	e := idem.Event{Kind: idem.RequestEnd, Method: r.Method, Route: r.Pattern, Outcome: out.outcome, Reason: sw.problem,
		Status: sw.status, Fence: out.res.Fence, Attempt: out.res.Attempt, Takeover: out.res.Takeover, Err: out.err,
		Started: started, Duration: time.Since(started)}
	if out.key.String() != "" {
		e.Key, e.KeyHashed = m.l.ObservedKey(out.key.String())
	}
	obs.Observe(r.Context(), e)
}

// statusWriter notes the status and the problem type answered, for a
// RequestEnd event.
type statusWriter struct {
	http.ResponseWriter
	status  int
	problem string
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// served is what serve did with a request, for its RequestEnd.
type served struct {
	outcome string
	key     idem.OperationKey
	res     idem.Result
	err     error
}

// outcomeOf names, as the ledger's OpEnd does, what a call that returned
// err came to; ran: the handler ran.
func outcomeOf(res idem.Result, err error, ran bool) string {
	var se *idem.StoreError
	switch {
	case err == nil && res.Replayed:
		return "replayed"
	case err == nil:
		return "executed"
	case errors.Is(err, idem.ErrLeaseLost):
		return "lease-lost"
	case errors.As(err, &se):
		return "store-error"
	case ran:
		return "released"
	case errors.Is(err, idem.ErrInProgress):
		return "busy"
	case errors.Is(err, idem.ErrMismatch):
		return "mismatch"
	case errors.Is(err, idem.ErrIndeterminate):
		return "indeterminate"
	case errors.Is(err, idem.ErrFailed):
		return "failed"
	}
	return "store-error" // the request's context ended during the claim
}

// errNotKept is returned from the ledger's fn for a response that is not
// recorded (a 5xx, or a transient 4xx), so that the ledger releases the key.
var errNotKept = errors.New("httpidem: response not recorded")

// errNoAnswer is returned from fn when the handler wrote nothing and its
// context was done (the client went away, or the lease was lost): nothing
// is known to have happened, so nothing is recorded.
var errNoAnswer = errors.New("httpidem: handler interrupted before it answered")

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) served {
	refused := served{outcome: "refused"}
	if !m.cfg.methods[r.Method] {
		next.ServeHTTP(w, r)
		return served{}
	}
	lines := r.Header[HeaderKey]
	if len(lines) == 0 {
		if m.cfg.required {
			m.writeProblem(w, http.StatusBadRequest, ProblemKeyMissing, "This endpoint requires an Idempotency-Key header.", 0)
			return refused
		}
		next.ServeHTTP(w, r)
		return served{}
	}
	w.Header().Set(HeaderRetention, m.ret)
	key, err := m.parseKey(lines)
	if err != nil {
		m.writeProblem(w, http.StatusBadRequest, ProblemKeyInvalid, detailOf(err), 0)
		return refused
	}
	opKey, ok := m.operationKey(w, r, key)
	if !ok {
		return refused
	}
	refused.key = opKey
	body, ok := m.readBody(w, r)
	if !ok {
		return refused
	}
	opts := make([]idem.CallOption, 0, 3)
	opts = append(opts, idem.Fingerprint(m.fingerprint(r, body)), m.retention)
	if m.lease != nil {
		opts = append(opts, m.lease)
	}

	var c *capture
	fn := func(ctx context.Context) ([]byte, error) {
		c = &capture{rw: w, m: m, max: m.cfg.maxResponse, before: w.Header().Clone()}
		r2 := r.WithContext(ctx)
		r2.Body = io.NopCloser(bytes.NewReader(body)) // fresh for each run (a busy wait may run it)
		next.ServeHTTP(c, r2)
		return m.outcome(ctx, r2, c)
	}
	res, err := m.l.Do(r.Context(), opKey, fn, opts...)
	if c == nil && errors.Is(err, idem.ErrMismatch) {
		// The key may hold a record written before canonical JSON became
		// RFC 8785's, under the fingerprint of the old canonical form (see
		// the package documentation): the same request, if it matches.
		if legacy, ok := m.legacyFingerprint(r, body); ok {
			opts[0] = idem.Fingerprint(legacy)
			res, err = m.l.Do(r.Context(), opKey, fn, opts...)
		}
	}
	if m.cfg.busyWait > 0 {
		deadline := time.Now().Add(m.cfg.busyWait)
		for wait := 5 * time.Millisecond; c == nil && errors.Is(err, idem.ErrInProgress) && time.Now().Add(wait).Before(deadline); wait = min(2*wait, 100*time.Millisecond) {
			if !sleep(r.Context(), wait) {
				break
			}
			res, err = m.l.Do(r.Context(), opKey, fn, opts...)
		}
	}
	out := served{outcome: outcomeOf(res, err, c != nil), key: opKey, res: res, err: err}
	if c != nil {
		m.afterHandler(w, r, c, err)
		return out
	}
	if err == nil {
		m.replay(w, r, res)
		return out
	}
	m.refuse(w, r, err)
	return out
}

// sleep waits d, or until ctx is done; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// parseKey checks the field lines and parses the key.
func (m *Middleware) parseKey(lines []string) (string, error) {
	if len(lines) > 1 {
		return "", fmt.Errorf("%w: sent on %d field lines (send exactly one)", ErrKeyInvalid, len(lines))
	}
	key, err := ParseKey(lines[0], m.cfg.bare)
	if err != nil {
		return "", err
	}
	if len(key) > m.cfg.maxKeyLen {
		return "", fmt.Errorf("%w: longer than %d bytes", ErrKeyInvalid, m.cfg.maxKeyLen)
	}
	if m.cfg.validate != nil {
		if err := m.cfg.validate(key); err != nil {
			return "", fmt.Errorf("%w: refused by the server's key format (%w)", ErrKeyInvalid, errHidden{err})
		}
	}
	return key, nil
}

// errHidden keeps a validator's text out of the detail sent to the client.
type errHidden struct{ err error }

func (e errHidden) Error() string { return "see the API's documentation" }
func (e errHidden) Unwrap() error { return e.err }

// detailOf is the client-facing detail of a key error: ParseKey's reasons
// never contain the value.
func detailOf(err error) string {
	return strings.TrimPrefix(err.Error(), "httpidem: ")
}

// operationKey resolves the scope and builds the ledger key. On failure it
// has answered the request.
func (m *Middleware) operationKey(w http.ResponseWriter, r *http.Request, key string) (idem.OperationKey, bool) {
	if m.cfg.scope == nil {
		return idem.Key(m.cfg.namespace, key), true
	}
	scope, err := m.cfg.scope(r)
	if err == nil && scope == "" {
		err = ErrEmptyScope
	}
	if err != nil {
		m.logger(r).ErrorContext(r.Context(), "httpidem: scope function failed; request refused", slog.Any("error", err), slog.String("path", r.URL.Path))
		m.writeProblem(w, http.StatusInternalServerError, ProblemScopeFailed, "", 0)
		return idem.OperationKey{}, false
	}
	k := idem.Key(m.cfg.namespace, scope, key)
	if err := k.Err(); err != nil {
		m.logger(r).ErrorContext(r.Context(), "httpidem: scope and key make an invalid operation key", slog.Any("error", err), slog.Int("scope_len", len(scope)))
		m.writeProblem(w, http.StatusBadRequest, ProblemKeyInvalid, "Idempotency-Key is too long for this server.", 0)
		return idem.OperationKey{}, false
	}
	return k, true
}

// readBody reads the whole request body, up to MaxBody, before the key is
// claimed. On failure it has answered the request.
func (m *Middleware) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, true
	}
	var rc *http.ResponseController
	if m.cfg.bodyTimeout > 0 {
		rc = http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(m.cfg.bodyTimeout)); err != nil {
			rc = nil // not supported by this writer: the server's ReadTimeout applies
		}
	}
	rd := http.MaxBytesReader(w, r.Body, m.cfg.maxBody)
	var buf bytes.Buffer
	if r.ContentLength > 0 && r.ContentLength <= m.cfg.maxBody {
		buf.Grow(int(r.ContentLength))
	}
	_, err := buf.ReadFrom(rd)
	if err == nil {
		if rc != nil {
			_ = rc.SetReadDeadline(time.Time{})
		}
		return buf.Bytes(), true
	}
	// The rest of the body will not be read: the deadline stays, and the
	// connection is closed after the answer.
	w.Header().Set("Connection", "close")
	var tooBig *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &tooBig):
		m.writeProblem(w, http.StatusRequestEntityTooLarge, ProblemBodyTooLarge,
			fmt.Sprintf("Requests with an Idempotency-Key may have a body of at most %d bytes.", m.cfg.maxBody), 0)
	case errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		m.writeProblem(w, http.StatusRequestTimeout, ProblemBodyTimeout, "", 0)
	default:
		m.writeProblem(w, http.StatusBadRequest, ProblemBodyUnreadable, "", 0)
	}
	return nil, false
}

// outcome decides, after the handler returned, what the ledger records.
func (m *Middleware) outcome(ctx context.Context, r *http.Request, c *capture) ([]byte, error) {
	switch {
	case c.hijacked:
		return (&response{flags: flagHijacked}).encode(), nil
	case c.status == 0:
		if ctx.Err() != nil {
			// The client left or the lease was lost, and the handler gave
			// up without answering: nothing known to be done.
			return nil, errNoAnswer
		}
		// The handler returned without writing: net/http sends 200 with no
		// body, and that is what is recorded.
		c.WriteHeader(http.StatusOK)
	}
	if !m.keeps(c.status) {
		if c.status < 500 {
			// 408, 409, 423, 425, 429: the handler says it did not act.
			return nil, idem.NotDone(fmt.Errorf("%w: status %d", errNotKept, c.status))
		}
		return nil, fmt.Errorf("%w: status %d", errNotKept, c.status)
	}
	res := c.result()
	return res.encode(), nil
}

// keeps reports whether a response with status is recorded for replay.
func (m *Middleware) keeps(status int) bool {
	switch {
	case status >= 500:
		return m.cfg.storeServerErrors
	case status == http.StatusRequestTimeout, status == http.StatusConflict, status == http.StatusLocked,
		status == http.StatusTooEarly, status == http.StatusTooManyRequests:
		return false
	}
	return true
}

// afterHandler finishes a request whose handler ran: its response stands,
// whatever the store said after it.
func (m *Middleware) afterHandler(w http.ResponseWriter, r *http.Request, c *capture, err error) {
	switch {
	case err == nil, errors.Is(err, errNotKept):
		if err != nil {
			var se *idem.StoreError
			if errors.As(err, &se) {
				m.logger(r).ErrorContext(r.Context(), "httpidem: releasing an unrecorded response failed; the key waits for its lease", slog.Any("error", err))
			}
		}
	case errors.Is(err, errNoAnswer):
		if !c.committed {
			c.restoreHeaders()
			m.writeProblem(w, http.StatusInternalServerError, ProblemOutcomeUnknown, "The request was interrupted; retry it with the same Idempotency-Key.", 0)
		}
	default:
		// The store failed to record the outcome, or the lease was lost:
		// the client has (or gets) the handler's response; a retry may run
		// the handler again once the lease lapses (at least once).
		m.logger(r).ErrorContext(r.Context(), "httpidem: the handler ran but its response was not recorded", slog.Any("error", err), slog.String("path", r.URL.Path))
	}
}

// replay answers with a stored response.
func (m *Middleware) replay(w http.ResponseWriter, r *http.Request, res idem.Result) {
	resp, err := decodeResponse(res.Value)
	switch {
	case errors.Is(err, errNotRecorded):
		// Resolved as done by an operator (idem resolve --done): done, and
		// no response kept, as after a hijack.
		m.notKept(w)
		return
	case err != nil:
		m.logger(r).ErrorContext(r.Context(), "httpidem: stored response cannot be decoded; handler not run", slog.Any("error", err), slog.Int64("fence", res.Fence))
		m.writeProblem(w, http.StatusInternalServerError, ProblemRecordUnreadable, "", 0)
		return
	case resp.flags&flagHijacked != 0:
		m.notKept(w)
		return
	}
	resp.replay(w)
}

// notKept answers a retry of a key that is done but whose response cannot
// be replayed: its handler hijacked the connection, or an operator resolved
// the key as done.
func (m *Middleware) notKept(w http.ResponseWriter) {
	m.writeProblem(w, http.StatusUnprocessableEntity, ProblemResponseNotKept,
		"The first request with this Idempotency-Key was done, but its response was not kept and cannot be replayed.", 0)
}

// refuse answers a request whose handler did not run.
func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, err error) {
	var ip *idem.InProgressError
	switch {
	case errors.As(err, &ip):
		m.writeProblem(w, http.StatusConflict, ProblemInProgress,
			"The first request with this Idempotency-Key has not finished; retry the same request later.",
			min(m.cfg.retryAfter, max(ip.RetryAfter, time.Second)))
	case errors.Is(err, idem.ErrMismatch):
		m.writeProblem(w, http.StatusUnprocessableEntity, ProblemKeyReused,
			"This Idempotency-Key was already used with a different request (method, path, query, content type or body).", 0)
	case errors.Is(err, idem.ErrIndeterminate):
		m.writeProblem(w, http.StatusInternalServerError, ProblemOutcomeUnknown,
			"An earlier request with this Idempotency-Key did not finish, and its outcome is being reconciled.", 0)
	case errors.Is(err, idem.ErrInvalidKey):
		m.writeProblem(w, http.StatusBadRequest, ProblemKeyInvalid, "Idempotency-Key is too long for this server.", 0)
	default:
		// A store error (or the request's context ended during the claim,
		// or a key failed by another writer): nothing ran.
		m.logger(r).ErrorContext(r.Context(), "httpidem: claim failed; handler not run", slog.Any("error", err), slog.String("path", r.URL.Path))
		m.writeProblem(w, http.StatusServiceUnavailable, ProblemStoreUnavailable,
			"Nothing was done; retry with the same Idempotency-Key.", m.cfg.retryAfter)
	}
}

// logger is the logger for r's lines: the one r's context carries
// ([idem.ContextWithLogger]), else [WithLogger]'s.
func (m *Middleware) logger(r *http.Request) *slog.Logger {
	return idem.LoggerFromContext(r.Context(), m.cfg.log)
}
