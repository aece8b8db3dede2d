package webhook

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
	"github.com/idemkit/idem/internal/problem"
	"github.com/idemkit/idem/queue"
)

// Defaults of a [Receiver], unless an [Option] says otherwise.
const (
	// DefaultMaxBody is the largest body a Receiver reads (1 MiB); a larger
	// one is answered 413.
	DefaultMaxBody = 1 << 20
	// DefaultBodyTimeout is how long a Receiver waits for the whole body
	// (10 s); a slower one (a slow-loris sender) is answered 408.
	DefaultBodyTimeout = 10 * time.Second
	// DefaultRetryAfter is the Retry-After, in seconds, of a 500.
	DefaultRetryAfter = 5
)

// The attributes of a captured message ([queue.Outgoing.Attributes]).
const (
	AttrSource      = "webhook-source"       // the Receiver's source name
	AttrEventID     = "webhook-event-id"     // the event id, from signed data
	AttrVerified    = "webhook-verified"     // "true": the signature was verified
	AttrTimestamp   = "webhook-timestamp"    // the signed timestamp (Unix seconds), when the scheme signs one
	AttrContentType = "webhook-content-type" // the request's Content-Type, when it has one
)

// ReplayedHeader marks an answer replayed to a duplicate delivery, as
// Stripe's API does.
const ReplayedHeader = "Idempotent-Replayed"

// Receiver is an [http.Handler] that accepts webhooks from one source: it
// verifies each request's signature, recognises the event by an id taken
// from signed data, and captures the event durably into a queue before it
// answers 2xx, so that a 2xx always means "taken responsibility", and a
// retried delivery never becomes a second message.
//
// For each request, in order:
//
//   - a method other than POST: 405 with Allow: POST;
//   - a body over the limit ([WithMaxBody], default 1 MiB): 413; a body not
//     read in time ([WithBodyTimeout], default 10 s): 408;
//   - a signature that does not verify, a stale or future timestamp: 401,
//     with an application/problem+json reason (never a secret);
//     authentic but without a usable event id: 400;
//   - an authentic handshake (the scheme is a [Handshaker]: Slack's
//     url_verification): 200 with the scheme's answer, nothing claimed or
//     captured;
//   - the operation key accept:<source>:<event id> ([Key]) is claimed in
//     the ledger and the event is captured (see [Publish] and [PublishTx]).
//     The message carries the raw body and the attributes AttrSource,
//     AttrEventID, AttrVerified, AttrTimestamp and AttrContentType; its
//     DedupID is the operation key, and so is its GroupID on a FIFO queue
//     that requires one (SQS FIFO; see [Publish]). The answer (200 and a
//     small JSON body)
//     is stored as the key's result;
//   - a duplicate of a captured event: the first answer again, status and
//     body, with Idempotent-Replayed: true (for a key an operator resolved
//     as done, 200 and the accepted body without its message_id);
//   - a duplicate while the first delivery is being captured: 409 with
//     Retry-After (seconds left on the first one's lease);
//   - the queue or the store failing: 500 with Retry-After, never 2xx. The
//     key is released (or left to its lease), so the sender's retry
//     captures the event.
//
// Serve it from an http.Server with a ReadHeaderTimeout: the Receiver bounds
// the body's arrival, the server must bound the headers'. With [Publish], a
// ledger made with idem.WithCache answers recent duplicates without a store
// round trip; with [PublishTx], a duplicate of a captured event is answered
// from the claim inside the transaction (one round trip either way).
//
// The body is verified and published as the raw bytes received; it is never
// parsed and re-serialized (schemes that take the id from the body parse a
// copy). The ledger's retention must cover the sender's retry horizon
// (Standard Webhooks retries for about 3 days; the default 7 days does).
type Receiver struct {
	source      string
	scheme      Scheme
	ledger      *idem.Ledger
	capture     Capture
	maxBody     int64
	bodyTimeout time.Duration
	now         func() time.Time
	log         *slog.Logger
}

// Option configures a [Receiver].
type Option func(*Receiver)

// WithMaxBody sets the largest body read (default [DefaultMaxBody]).
// Non-positive values are ignored.
func WithMaxBody(n int64) Option {
	return func(r *Receiver) {
		if n > 0 {
			r.maxBody = n
		}
	}
}

// WithBodyTimeout sets how long the body may take to arrive, from the
// moment the handler starts (default [DefaultBodyTimeout]). It needs a
// connection whose read deadline can be set (net/http's server); the
// server's own ReadTimeout still applies. Non-positive values are ignored.
func WithBodyTimeout(d time.Duration) Option {
	return func(r *Receiver) {
		if d > 0 {
			r.bodyTimeout = d
		}
	}
}

// WithClock sets the clock that signed timestamps are checked against
// (default [time.Now]).
func WithClock(now func() time.Time) Option {
	return func(r *Receiver) {
		if now != nil {
			r.now = now
		}
	}
}

// WithLogger sets the logger for rejected requests and capture failures
// (default [slog.Default]). The ledger logs each capture itself.
func WithLogger(l *slog.Logger) Option {
	return func(r *Receiver) {
		if l != nil {
			r.log = l
		}
	}
}

// NewReceiver returns a Receiver for webhooks from source (a name such as
// "stripe" or "github-acme": it scopes the keys, so two endpoints never
// share an event id), verified by scheme, deduplicated in l and captured by
// capture. Use a ledger under [idem.AtLeastOnce] (the default): a failed
// publish then releases the key for the sender's retry. Under
// [idem.AtMostOnce] a failed publish (whose message may or may not have
// been accepted) leaves the key indeterminate, and every retry is answered
// 500 until an operator resolves it: `idem resolve KEY --not-done` (the
// message is not in the queue) releases the key and the next retry captures
// the event; `idem resolve KEY --done` (it is) makes retries get 200 with
// the accepted body and no message_id (any --result is the operator's note,
// not an answer). KEY is [Key](source, event id).
//
// NewReceiver fails when an argument is missing or when capture cannot work
// with l's store (a [PublishTx] of a transaction type the store does not
// run).
func NewReceiver(source string, scheme Scheme, l *idem.Ledger, capture Capture, opts ...Option) (*Receiver, error) {
	switch {
	case source == "":
		return nil, errors.New("webhook: NewReceiver: empty source")
	case scheme == nil:
		return nil, errors.New("webhook: NewReceiver: nil scheme")
	case l == nil:
		return nil, errors.New("webhook: NewReceiver: nil ledger")
	case capture == nil:
		return nil, errors.New("webhook: NewReceiver: nil capture")
	}
	// The longest key a Receiver builds is the hashed one, for an id too
	// long to be spelled out: the source must leave room for it, or every
	// such event would be refused (500) forever.
	if err := Key(source, strings.Repeat("x", idem.MaxKeyLen+1)).Err(); err != nil {
		return nil, fmt.Errorf("webhook: NewReceiver: source: %w", err)
	}
	if err := capture.check(l); err != nil {
		return nil, err
	}
	r := &Receiver{source: source, scheme: scheme, ledger: l, capture: capture,
		maxBody: DefaultMaxBody, bodyTimeout: DefaultBodyTimeout, now: time.Now, log: slog.Default()}
	for _, o := range opts {
		o(r)
	}
	return r, nil
}

// Key returns the operation key under which a Receiver for source captures
// event id: accept:<source>:<id>, the parts escaped as [idem.Key] does (a ':'
// in the id cannot forge another source's key). An id so long that the key
// would pass [idem.MaxKeyLen] is replaced by its SHA-256:
// accept:<source>:sha256:<hex> (four parts, which no escaped id can
// produce), so it is still captured once.
func Key(source, id string) idem.OperationKey { return eventScopedKey("accept", source, id) }

// eventScopedKey is <step>:<source>:<id>, or <step>:<source>:sha256:<hex>
// when the id is too long for a key.
func eventScopedKey(step, source, id string) idem.OperationKey {
	k := idem.Key(step, source, id)
	if k.Err() != nil && source != "" && id != "" {
		sum := sha256.Sum256([]byte(id))
		k = idem.Key(step, source, "sha256", hex.EncodeToString(sum[:]))
	}
	return k
}

// The stored result of a capture, the answer: a 3-digit status followed by
// the body, a JSON object. That start (three digits, then '{') is the
// format's marker: a result without it was not written by a Receiver. It is
// an operator's, who resolved the key as done (idem resolve KEY --done
// [--result S]): empty or plain text, or a JSON note.
func encodeAnswer(status int, body []byte) []byte {
	return append([]byte(strconv.Itoa(status)), body...)
}

// decodeAnswer reads a stored answer. ours is false for a result without
// the format's marker; ok is false for one with it that cannot be read.
func decodeAnswer(b []byte) (status int, body []byte, ours, ok bool) {
	if len(b) < 4 || b[3] != '{' {
		return 0, nil, false, false
	}
	for _, c := range b[:3] {
		if c < '0' || c > '9' {
			return 0, nil, false, false
		}
	}
	st, _ := strconv.Atoi(string(b[:3]))
	if st < 200 || st > 599 {
		return 0, nil, true, false
	}
	return st, b[3:], true, true
}

type acceptedBody struct {
	Status    string `json:"status"`
	Source    string `json:"source"`
	EventID   string `json:"event_id"`
	MessageID string `json:"message_id,omitempty"`
}

// served is how a request was answered, for its WebhookEnd event.
type served struct {
	outcome, reason string
	status          int
	key             idem.OperationKey // the event's, once known
	err             error             // the capture's error
}

// ServeHTTP implements [http.Handler].
//
// With an [idem.Observer] on the ledger, each request is a WebhookStart
// (the capture runs under the context it returns, so the ledger's OpStart
// nests in it) and a WebhookEnd with the status answered and Outcome
// "captured", "replayed", "handshake" (an authentic handshake, answered
// without a capture) or "refused" with a Reason: "method",
// "too-large", "timeout", "unreadable", "signature" (the signature or the
// signed timestamp), "malformed" (authentic, without a usable event id),
// "busy", "mismatch", "indeterminate", "publish" (the queue refused the
// message), "store-error", "capture-failed" (another failure to capture),
// "misconfigured" or "answer-unreadable". A logger in the request's
// context ([idem.ContextWithLogger]) takes the place of [WithLogger]'s.
func (rc *Receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	obs := rc.ledger.Observer()
	if obs == nil {
		rc.serve(w, r)
		return
	}
	started := time.Now()
	ctx := obs.Observe(r.Context(), idem.Event{Kind: idem.WebhookStart, Source: rc.source, Method: r.Method, Started: started})
	if ctx != nil && ctx != r.Context() {
		r = r.WithContext(ctx)
	}
	out := rc.serve(w, r)
	e := idem.Event{Kind: idem.WebhookEnd, Source: rc.source, Method: r.Method, Outcome: out.outcome, Reason: out.reason, Status: out.status,
		Err: out.err, Started: started, Duration: time.Since(started)}
	if out.key.String() != "" {
		e.Key, e.KeyHashed = rc.ledger.ObservedKey(out.key.String())
	}
	obs.Observe(r.Context(), e)
}

func (rc *Receiver) serve(w http.ResponseWriter, r *http.Request) served {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return rc.problem(w, r, http.StatusMethodNotAllowed, "method-not-allowed", "Method not allowed", "webhooks are POSTed")
	}
	if r.ContentLength > rc.maxBody {
		return rc.problem(w, r, http.StatusRequestEntityTooLarge, "body-too-large", "Body too large",
			fmt.Sprintf("the body may be at most %d bytes", rc.maxBody))
	}
	ctl := http.NewResponseController(w)
	_ = ctl.SetReadDeadline(time.Now().Add(rc.bodyTimeout)) // ErrNotSupported outside net/http's server
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, rc.maxBody))
	_ = ctl.SetReadDeadline(time.Time{})
	if err != nil {
		var tooLarge *http.MaxBytesError
		var ne net.Error
		switch {
		case errors.As(err, &tooLarge):
			return rc.problem(w, r, http.StatusRequestEntityTooLarge, "body-too-large", "Body too large",
				fmt.Sprintf("the body may be at most %d bytes", rc.maxBody))
		case errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
			w.Header().Set("Connection", "close")
			return rc.problem(w, r, http.StatusRequestTimeout, "body-timeout", "Body too slow",
				fmt.Sprintf("the body must arrive within %v", rc.bodyTimeout))
		default:
			return rc.problem(w, r, http.StatusBadRequest, "body-unreadable", "Body unreadable", "the body could not be read")
		}
	}

	var ev Event
	if rs, ok := rc.scheme.(RequestScheme); ok {
		ev, err = rs.VerifyRequest(r, body, rc.now())
	} else {
		ev, err = rc.scheme.Verify(r.Header, body, rc.now())
	}
	if err != nil {
		if Unauthentic(err) {
			return rc.problem(w, r, http.StatusUnauthorized, "signature-invalid", "Signature invalid", err.Error())
		}
		return rc.problem(w, r, http.StatusBadRequest, "event-id-invalid", "Event id missing or invalid", err.Error())
	}
	if hs, ok := rc.scheme.(Handshaker); ok {
		if answer, ct, ok := hs.Handshake(body); ok {
			// Authentic, and not an event: answered, never claimed or
			// captured.
			rc.logger(r).LogAttrs(r.Context(), slog.LevelDebug, "webhook: handshake answered", slog.String("source", rc.source))
			w.Header().Set("Content-Type", ct)
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(answer)
			return served{outcome: "handshake", status: http.StatusOK}
		}
	}

	key := Key(rc.source, ev.ID)
	attrs := map[string]string{
		AttrSource:   rc.source,
		AttrEventID:  ev.ID,
		AttrVerified: "true",
	}
	if !ev.Timestamp.IsZero() {
		attrs[AttrTimestamp] = strconv.FormatInt(ev.Timestamp.Unix(), 10)
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		attrs[AttrContentType] = ct
	}
	// The dedup id names the operation, never the delivery.
	m := queue.Outgoing{Body: body, Attributes: attrs, DedupID: key.String()}
	accepted := func(messageID string) []byte {
		b, _ := json.Marshal(acceptedBody{Status: "accepted", Source: rc.source, EventID: ev.ID, MessageID: messageID})
		return b
	}
	res, err := rc.capture.capture(r.Context(), rc.ledger, key, m, func(p queue.Published) []byte {
		return encodeAnswer(http.StatusOK, accepted(p.ID))
	})
	if err != nil {
		out := rc.captureFailed(w, r, ev.ID, err)
		out.key, out.err = key, err
		return out
	}
	status, answer, ours, ok := decodeAnswer(res.Value)
	switch {
	case !ours:
		// Resolved as done by an operator (idem resolve --done): the event
		// is captured, and no message id was recorded.
		status, answer = http.StatusOK, accepted("")
	case !ok:
		rc.logger(r).ErrorContext(r.Context(), "webhook: the stored answer cannot be read", "source", rc.source, "event_id", ev.ID)
		out := rc.problem(w, r, http.StatusInternalServerError, "answer-unreadable", "Stored answer unreadable",
			"the event was captured but its stored answer cannot be read")
		out.key = key
		return out
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	out := served{outcome: "captured", status: status, key: key}
	if res.Replayed {
		h.Set(ReplayedHeader, "true")
		out.outcome = "replayed"
	}
	w.WriteHeader(status)
	_, _ = w.Write(answer)
	return out
}

// logger is the logger for r's lines.
func (rc *Receiver) logger(r *http.Request) *slog.Logger {
	return idem.LoggerFromContext(r.Context(), rc.log)
}

// captureFailed answers a capture that did not happen (or whose outcome is
// unknown): never 2xx.
func (rc *Receiver) captureFailed(w http.ResponseWriter, r *http.Request, id string, err error) served {
	var busy *idem.InProgressError
	var pub *PublishError
	reason := "capture-failed"
	switch {
	case errors.As(err, &busy):
		w.Header().Set("Retry-After", problem.RetryAfter(busy.RetryAfter))
		return rc.problem(w, r, http.StatusConflict, "in-progress", "Delivery in progress",
			"another delivery of this event is being captured; retry later")
	case errors.Is(err, idem.ErrNotTransactional):
		rc.logger(r).ErrorContext(r.Context(), "webhook: capture misconfigured", "source", rc.source, "error", err)
		return rc.problem(w, r, http.StatusInternalServerError, "misconfigured", "Receiver misconfigured", "the event was not captured")
	case errors.As(err, &pub):
		reason = "publish"
		rc.logger(r).ErrorContext(r.Context(), "webhook: publish failed; answered 500 so the sender retries",
			"source", rc.source, "event_id", id, "error", err)
	default:
		// Store errors, lease lost, indeterminate (AtMostOnce), failed keys,
		// a request cancelled mid-capture: nothing here is "captured".
		var se *idem.StoreError
		switch {
		case errors.As(err, &se):
			reason = "store-error"
		case errors.Is(err, idem.ErrMismatch):
			reason = "mismatch"
		case errors.Is(err, idem.ErrIndeterminate):
			reason = "indeterminate"
		}
		rc.logger(r).ErrorContext(r.Context(), "webhook: capture failed; answered 500 so the sender retries",
			"source", rc.source, "event_id", id, "error", err)
	}
	w.Header().Set("Retry-After", strconv.Itoa(DefaultRetryAfter))
	out := rc.problem(w, r, http.StatusInternalServerError, "capture-failed", "Event not captured",
		"the event could not be captured durably; retry later")
	out.reason = reason
	return out
}

// ProblemTypePrefix begins the type URI of every problem a Receiver answers,
// followed by a slug: signature-invalid, event-id-invalid, body-too-large,
// body-timeout, body-unreadable, method-not-allowed, in-progress,
// capture-failed, misconfigured, answer-unreadable. It is
// "https://github.com/idemkit/idem/blob/main/docs/problems.md#webhook-":
// each type is the address of the section of docs/problems.md that
// documents it.
const ProblemTypePrefix = problem.TypeBase + "webhook-"

// refusalReasons are the WebhookEnd reasons of the problems' slugs.
var refusalReasons = map[string]string{
	"method-not-allowed": "method", "body-too-large": "too-large", "body-timeout": "timeout",
	"body-unreadable": "unreadable", "signature-invalid": "signature", "event-id-invalid": "malformed",
	"in-progress": "busy", "capture-failed": "capture-failed", "misconfigured": "misconfigured",
	"answer-unreadable": "answer-unreadable",
}

// problem writes an RFC 9457 problem. detail never holds a secret: it is a
// scheme error's text (which names headers, never their values' secrets) or
// a fixed sentence. A refusal is logged at WARN when its signature does
// not verify (a wrong secret, or a forger), at DEBUG when expected (a
// duplicate while the first is captured, a method other than POST), at
// INFO otherwise; a 5xx is logged by its caller.
func (rc *Receiver) problem(w http.ResponseWriter, r *http.Request, status int, slug, title, detail string) served {
	if status < 500 {
		level := slog.LevelInfo
		switch status {
		case http.StatusUnauthorized:
			level = slog.LevelWarn
		case http.StatusConflict, http.StatusMethodNotAllowed:
			level = slog.LevelDebug
		}
		rc.logger(r).LogAttrs(r.Context(), level, "webhook: request refused",
			slog.String("source", rc.source), slog.Int("status", status), slog.String("reason", detail))
	}
	problem.Write(w, status, ProblemTypePrefix+slug, title, detail, nil, 0)
	return served{outcome: "refused", reason: refusalReasons[slug], status: status}
}
