package webhook

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// DefaultTolerance is how far a signed timestamp may lie in the past or in
// the future before a scheme refuses the request, unless its Tolerance field
// says otherwise. Every Standard Webhooks reference library uses 5 minutes.
const DefaultTolerance = 5 * time.Minute

// Scheme verifies one provider's signature over a request's raw body and
// headers, and names the event the request delivers.
//
// Verify must use only data the signature covers for the event id: a header
// that the signature does not cover can be changed by anyone who replays the
// request. It compares signatures in constant time, accepts a match against
// any of the scheme's secrets (rotation), and checks a signed timestamp
// against now when the scheme signs one. It returns an error wrapping one of
// the package's sentinel errors: [ErrNoSignature], [ErrMalformed],
// [ErrUnknownVersion], [ErrNoMatch], [ErrTooOld], [ErrTooNew] (the request
// is not authentic: 401), or [ErrNoEventID], [ErrInvalidEventID] (authentic
// but unusable: 400). Errors never contain a secret.
type Scheme interface {
	Verify(h http.Header, body []byte, now time.Time) (Event, error)
}

// Handshaker is implemented by a [Scheme] whose provider sends, besides
// events, a signed handshake that must be answered with data from its body:
// Slack's url_verification, sent when an Events API Request URL is set,
// which Slack accepts only if the answer echoes its challenge.
//
// A [Receiver] calls Handshake with the raw body of every request whose
// signature verified, before it claims any key. When ok, the request is a
// handshake: it is answered 200 with answer as the body, of contentType, and
// is neither claimed nor captured. Verify must accept a handshake like an
// event (with an id, such as the body's hash), so that a handshake whose
// signature does not verify is refused with 401 like any forgery.
type Handshaker interface {
	Handshake(body []byte) (answer []byte, contentType string, ok bool)
}

// Event is what a [Scheme] verified.
type Event struct {
	// ID identifies the event (the operation), the same on every retry:
	// taken from signed data (a signed header or the signed body), or a
	// hash of the signed body for schemes that sign nothing else.
	ID string
	// Timestamp is the signed timestamp of this delivery attempt (zero when
	// the scheme signs none). It changes between retries: never a key.
	Timestamp time.Time
}

var (
	// ErrNoSignature: the request carries no signature header (or no
	// timestamp or id header the scheme needs).
	ErrNoSignature = errors.New("webhook: missing signature header")
	// ErrMalformed: a signature, timestamp or id header cannot be parsed, or
	// appears more than once.
	ErrMalformed = errors.New("webhook: malformed signature header")
	// ErrUnknownVersion: the signature header holds only signatures of
	// versions or algorithms the scheme does not know.
	ErrUnknownVersion = errors.New("webhook: no signature of a known version")
	// ErrNoMatch: no signature matches any of the secrets (a wrong or
	// truncated signature, a wrong secret, or a changed body).
	ErrNoMatch = errors.New("webhook: signature does not match")
	// ErrTooOld: the signed timestamp is further in the past than the
	// tolerance (a stale request, or a replay).
	ErrTooOld = errors.New("webhook: timestamp too old")
	// ErrTooNew: the signed timestamp is further in the future than the
	// tolerance.
	ErrTooNew = errors.New("webhook: timestamp too far in the future")
	// ErrNoEventID: the request is authentic but its signed data holds no
	// event id.
	ErrNoEventID = errors.New("webhook: no event id in the signed data")
	// ErrInvalidEventID: the event id is not valid UTF-8 or holds control
	// characters, so it cannot be passed on faithfully.
	ErrInvalidEventID = errors.New("webhook: invalid event id")
	// ErrNoSecret: a scheme was built without a secret, or with an empty or
	// undecodable one.
	ErrNoSecret = errors.New("webhook: no usable secret")
)

// Unauthentic reports whether err says the request is not authentic (an
// answer of 401), as opposed to authentic but unusable.
func Unauthentic(err error) bool {
	for _, e := range []error{ErrNoSignature, ErrMalformed, ErrUnknownVersion, ErrNoMatch, ErrTooOld, ErrTooNew} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// tolerance returns the effective tolerance of a scheme's Tolerance field:
// 0 means DefaultTolerance, negative means unchecked.
func tolerance(d time.Duration) time.Duration {
	if d == 0 {
		return DefaultTolerance
	}
	return d
}

// parseUnix parses a timestamp header: decimal digits only (no sign, no
// spaces), at most 12 of them.
func parseUnix(s string) (time.Time, error) {
	if s == "" || len(s) > 12 {
		return time.Time{}, fmt.Errorf("%w: timestamp is not a Unix time in seconds", ErrMalformed)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return time.Time{}, fmt.Errorf("%w: timestamp is not a Unix time in seconds", ErrMalformed)
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: timestamp is not a Unix time in seconds", ErrMalformed)
	}
	return time.Unix(n, 0), nil
}

// checkTime checks ts against now with tolerance tol (negative: unchecked).
func checkTime(ts, now time.Time, tol time.Duration) error {
	if tol < 0 {
		return nil
	}
	if d := now.Sub(ts); d > tol {
		return fmt.Errorf("%w: %ds in the past, tolerance %v", ErrTooOld, int64(d/time.Second), tol)
	}
	if d := ts.Sub(now); d > tol {
		return fmt.Errorf("%w: %ds in the future, tolerance %v", ErrTooNew, int64(d/time.Second), tol)
	}
	return nil
}

// single returns the one value of header name: ErrNoSignature when absent
// (or empty), ErrMalformed when the header appears more than once (a
// duplicated header is ambiguous: which one was meant to be signed?).
func single(h http.Header, name string) (string, error) {
	vs := h.Values(name)
	switch {
	case len(vs) == 0 || (len(vs) == 1 && vs[0] == ""):
		return "", fmt.Errorf("%w: %s", ErrNoSignature, name)
	case len(vs) > 1:
		return "", fmt.Errorf("%w: %s appears %d times", ErrMalformed, name, len(vs))
	}
	return vs[0], nil
}

// IDFunc takes an event id from a verified body.
type IDFunc func(body []byte) (string, error)

// BodyHash is the [IDFunc] for schemes whose signature covers the body and
// nothing that identifies the event: the id is "sha256:" and the hex SHA-256
// of the body. A replay of the body under a new (unsigned) delivery id is
// then the same operation; a sender that changes the body between retries
// (some add an attempt counter) would create a new one.
func BodyHash(body []byte) (string, error) {
	sum := sha256.Sum256(body)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// JSONField returns an [IDFunc] that takes the event id from the top-level
// string field name of a JSON object body (Stripe's "id", Slack's
// "event_id"). A body that is not a JSON object, or lacks the field, gives
// [ErrNoEventID].
func JSONField(name string) IDFunc {
	return func(body []byte) (string, error) {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(body, &m); err != nil {
			return "", fmt.Errorf("%w: body is not a JSON object", ErrNoEventID)
		}
		raw, ok := m[name]
		if !ok {
			return "", fmt.Errorf("%w: no %q field in the body", ErrNoEventID, name)
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil || s == "" {
			return "", fmt.Errorf("%w: %q is not a non-empty string", ErrNoEventID, name)
		}
		return s, nil
	}
}

// checkID refuses ids that cannot be passed on faithfully.
func checkID(id string) error {
	if id == "" {
		return ErrNoEventID
	}
	for _, r := range id {
		if r == 0xFFFD || r < 0x20 || r == 0x7f {
			// 0xFFFD: not valid UTF-8 (or a literal replacement character,
			// which no provider puts in an id).
			return fmt.Errorf("%w: not printable UTF-8", ErrInvalidEventID)
		}
	}
	return nil
}

// secretsString describes a scheme for logs without its secrets.
func secretsString(name string, n int) string {
	return fmt.Sprintf("webhook.%s(%d secrets)", name, n)
}

func formatUnix(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }
