package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Stripe verifies Stripe's webhook signatures:
//
//	Stripe-Signature: t=1614265330,v1=<hex>,v1=<hex>,v0=<hex>
//
// Each v1 is hex(HMAC-SHA256(secret, t + "." + raw body)), the secret used
// as the string it is ("whsec_..." included: Stripe does not decode it). A
// rolled secret makes Stripe send several v1 entries; any match under any
// configured secret is enough. v0 and other keys are ignored; a header with
// none of v1 is [ErrUnknownVersion]; an entry that is not "key=value" is
// [ErrMalformed], as in stripe-go.
//
// Stripe sends no event-id header: the id is the body's "id" ("evt_..."),
// which the signature covers (change it with the ID field).
type Stripe struct {
	// Tolerance is how far t may be from now, either way: 0 means
	// [DefaultTolerance] (5 minutes; stripe-go checks only the past, with
	// the same 300 s), negative means unchecked.
	Tolerance time.Duration
	// ID takes the event id from the verified body; nil means
	// JSONField("id").
	ID IDFunc

	secrets [][]byte
}

// NewStripe returns a Stripe scheme that accepts a signature under any of
// secrets (the endpoint's signing secrets, "whsec_..."). No secret, or an
// empty one, is [ErrNoSecret].
func NewStripe(secrets ...string) (*Stripe, error) {
	s := new(Stripe)
	for i, k := range secrets {
		if k == "" {
			return nil, fmt.Errorf("%w: secret %d is empty", ErrNoSecret, i)
		}
		s.secrets = append(s.secrets, []byte(k))
	}
	if len(s.secrets) == 0 {
		return nil, fmt.Errorf("%w: no secret given", ErrNoSecret)
	}
	return s, nil
}

// String describes the scheme without its secrets.
func (s *Stripe) String() string { return secretsString("Stripe", len(s.secrets)) }

type stripeHeader struct {
	t    string
	v1   [][]byte
	more bool // other keys (v0, unknown schemes) were present
}

// parseStripeHeader parses a Stripe-Signature value. At most 64 pairs are
// read.
func parseStripeHeader(v string) (stripeHeader, error) {
	var sh stripeHeader
	pairs := strings.Split(v, ",")
	if len(pairs) > 64 {
		return sh, fmt.Errorf("%w: Stripe-Signature has %d entries", ErrMalformed, len(pairs))
	}
	for _, p := range pairs {
		k, val, ok := strings.Cut(p, "=")
		if !ok || strings.Contains(val, "=") {
			return sh, fmt.Errorf("%w: Stripe-Signature entry is not key=value", ErrMalformed)
		}
		switch k {
		case "t":
			if sh.t != "" {
				return sh, fmt.Errorf("%w: Stripe-Signature has two timestamps", ErrMalformed)
			}
			if val == "" {
				return sh, fmt.Errorf("%w: Stripe-Signature has an empty timestamp", ErrMalformed)
			}
			sh.t = val
		case "v1":
			sig, err := hex.DecodeString(val)
			if err != nil {
				continue // skipped, as stripe-go does
			}
			sh.v1 = append(sh.v1, sig)
		default:
			sh.more = true
		}
	}
	if sh.t == "" {
		return sh, fmt.Errorf("%w: Stripe-Signature has no timestamp", ErrMalformed)
	}
	return sh, nil
}

// Verify implements [Scheme].
func (s *Stripe) Verify(h http.Header, body []byte, now time.Time) (Event, error) {
	v, err := single(h, "Stripe-Signature")
	if err != nil {
		return Event{}, err
	}
	sh, err := parseStripeHeader(v)
	if err != nil {
		return Event{}, err
	}
	ts, err := parseUnix(sh.t)
	if err != nil {
		return Event{}, err
	}
	if len(sh.v1) == 0 {
		return Event{}, fmt.Errorf("%w: Stripe-Signature has no v1 signature", ErrUnknownVersion)
	}
	ok := false
	for _, k := range s.secrets {
		m := hmac.New(sha256.New, k)
		m.Write([]byte(sh.t))
		m.Write([]byte{'.'})
		m.Write(body)
		mac := m.Sum(nil)
		for _, sig := range sh.v1 {
			if hmac.Equal(sig, mac) {
				ok = true
			}
		}
	}
	if !ok {
		return Event{}, ErrNoMatch
	}
	if err := checkTime(ts, now, tolerance(s.Tolerance)); err != nil {
		return Event{}, err
	}
	idf := s.ID
	if idf == nil {
		idf = stripeID
	}
	id, err := idf(body)
	if err != nil {
		return Event{}, err
	}
	if err := checkID(id); err != nil {
		return Event{}, err
	}
	return Event{ID: id, Timestamp: ts}, nil
}

var stripeID = JSONField("id")

// Sign returns a Stripe-Signature value for ts and body, with one v1 entry
// per secret. It is for tests.
func (s *Stripe) Sign(ts time.Time, body []byte) string {
	t := strconv.FormatInt(ts.Unix(), 10)
	var b strings.Builder
	b.WriteString("t=" + t)
	for _, k := range s.secrets {
		m := hmac.New(sha256.New, k)
		m.Write([]byte(t + "."))
		m.Write(body)
		b.WriteString(",v1=" + hex.EncodeToString(m.Sum(nil)))
	}
	return b.String()
}
