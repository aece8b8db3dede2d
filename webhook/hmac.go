package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"strings"
	"time"
)

// Encoding is how a signature is written in its header.
type Encoding int

const (
	Hex       Encoding = iota // lower-case hex (the default)
	Base64                    // standard base64, padded, canonical
	Base64URL                 // URL-safe base64, padded or not, canonical
)

// errNotCanonical: a signature that decodes, but is not the one encoding
// of its bytes (unused bits set, a line break inside, upper-case hex); it
// matches nothing.
var errNotCanonical = errors.New("webhook: signature is not in its canonical encoding")

func (e Encoding) decode(s string) ([]byte, error) {
	switch e {
	case Base64:
		if b, ok := decodeCanonical(s); ok {
			return b, nil
		}
		return nil, errNotCanonical
	case Base64URL:
		raw := strings.TrimSuffix(strings.TrimSuffix(s, "="), "=")
		b, err := base64.RawURLEncoding.Strict().DecodeString(raw)
		if err != nil || base64.RawURLEncoding.EncodedLen(len(b)) != len(raw) ||
			raw != s && base64.URLEncoding.EncodedLen(len(b)) != len(s) {
			return nil, errNotCanonical
		}
		return b, nil
	default:
		// Lower case only: the providers' helpers (Stripe's, GitHub's,
		// Slack's) compare the lower-case hex string they compute, so an
		// upper-case signature matches nothing there either.
		if strings.ContainsFunc(s, func(r rune) bool { return 'A' <= r && r <= 'F' }) {
			return nil, errNotCanonical
		}
		return hex.DecodeString(s)
	}
}

func (e Encoding) encode(b []byte) string {
	switch e {
	case Base64:
		return base64.StdEncoding.EncodeToString(b)
	case Base64URL:
		return base64.RawURLEncoding.EncodeToString(b)
	default:
		return hex.EncodeToString(b)
	}
}

// Part is one piece of the content a generic [HMAC] scheme signs: a literal
// string, the value of a request header, or the raw body. Build parts with
// [Literal], [HeaderValue] and [Body].
type Part struct {
	literal string
	header  string
	body    bool
}

// Literal is a fixed string in the signed content ("v0:", ".").
func Literal(s string) Part { return Part{literal: s} }

// HeaderValue is the value of request header name in the signed content. The
// header must appear exactly once.
func HeaderValue(name string) Part { return Part{header: http.CanonicalHeaderKey(name)} }

// Body is the raw request body, byte for byte, in the signed content.
var Body = Part{body: true}

// HMACConfig configures a generic HMAC scheme; see [NewHMAC].
type HMACConfig struct {
	// Header carries the signature (required).
	Header string
	// Prefix is stripped from each signature before decoding ("sha256=",
	// "v0="). A signature without it is of an unknown version.
	Prefix string
	// Separator splits Header into several signatures (rotation on the
	// sender's side); "" means the header holds one.
	Separator string
	// Encoding of the signature: [Hex] (default), [Base64], [Base64URL].
	Encoding Encoding
	// Hash is the HMAC's hash; nil means SHA-256.
	Hash func() hash.Hash
	// Signed lists the parts of the signed content, concatenated; nil means
	// the body alone.
	Signed []Part
	// TimestampHeader, if set, holds a signed Unix time in seconds, checked
	// against the tolerance. It must be one of the Signed parts.
	TimestampHeader string
	// IDHeader, if set, holds the event id. It must be one of the Signed
	// parts (an unsigned id header could be changed by whoever replays the
	// request), with a non-empty Literal between it and any neighbouring
	// part, and on at least one side of it only Literals and the
	// TimestampHeader (digits); its value must not contain a byte of any
	// Literal part. Otherwise the signed content would be ambiguous: with
	// the body or another header on both sides, bytes could move across
	// the id's boundaries, and a captured delivery verify under another id.
	// When empty, the id comes from ID.
	IDHeader string
	// Secrets, used as the strings they are (no decoding). At least one.
	Secrets []string
	// Tolerance for TimestampHeader: 0 means [DefaultTolerance], negative
	// means unchecked.
	Tolerance time.Duration
	// ID takes the event id from the verified body when IDHeader is empty;
	// nil means [BodyHash].
	ID IDFunc
}

// HMAC is a generic HMAC signature scheme, configured by an [HMACConfig].
// The GitHub, Shopify and Slack schemes are HMACs.
type HMAC struct {
	// Tolerance and ID are as in [HMACConfig]; they may be changed before
	// the scheme is used.
	Tolerance time.Duration
	ID        IDFunc

	name      string
	cfg       HMACConfig
	secrets   [][]byte
	forbid    string                                   // bytes an IDHeader value must not contain
	handshake func(body []byte) ([]byte, string, bool) // the provider's handshake (Slack's); nil: none
}

// NewHMAC returns a generic HMAC scheme. It fails with [ErrNoSecret] without
// a non-empty secret, and with an error when Header is empty, the timestamp
// or id header is not signed, or the id header is not set apart from the
// other signed parts by literals.
func NewHMAC(cfg HMACConfig) (*HMAC, error) { return newHMAC("HMAC", cfg) }

func newHMAC(name string, cfg HMACConfig) (*HMAC, error) {
	if cfg.Header == "" {
		return nil, fmt.Errorf("webhook: %s scheme needs a signature header", name)
	}
	cfg.Header = http.CanonicalHeaderKey(cfg.Header)
	if cfg.Hash == nil {
		cfg.Hash = sha256.New
	}
	if cfg.Signed == nil {
		cfg.Signed = []Part{Body}
	}
	s := &HMAC{name: name, Tolerance: cfg.Tolerance, ID: cfg.ID}
	signed := map[string]bool{}
	for _, p := range cfg.Signed {
		if p.header != "" {
			signed[p.header] = true
		}
		s.forbid += p.literal
	}
	for _, h := range []*string{&cfg.TimestampHeader, &cfg.IDHeader} {
		if *h == "" {
			continue
		}
		*h = http.CanonicalHeaderKey(*h)
		if !signed[*h] {
			return nil, fmt.Errorf("webhook: %s scheme: header %s is not part of the signed content", name, *h)
		}
	}
	if cfg.IDHeader != "" {
		// The id's bytes are told apart from its neighbours' only by a
		// literal it may not contain: next to another header or the body,
		// one signed content would read as several (id, neighbour) splits,
		// and a replay could verify under a new id.
		lit := func(p Part) bool { return p.header == "" && !p.body && p.literal != "" }
		for i, p := range cfg.Signed {
			if p.header != cfg.IDHeader {
				continue
			}
			if i > 0 && !lit(cfg.Signed[i-1]) || i+1 < len(cfg.Signed) && !lit(cfg.Signed[i+1]) {
				return nil, fmt.Errorf("webhook: %s scheme: id header %s must be separated from the other signed parts by a non-empty literal", name, cfg.IDHeader)
			}
			// A part that may hold a separator (the body, a header other
			// than the digits-only timestamp) on each side of the id lets
			// bytes move across the id's boundaries: the id must be
			// anchored at one end by literals and the timestamp only.
			fixed := func(ps []Part) bool {
				for _, p := range ps {
					if p.body || p.header != "" && p.header != cfg.TimestampHeader {
						return false
					}
				}
				return true
			}
			if !fixed(cfg.Signed[:i]) && !fixed(cfg.Signed[i+1:]) {
				return nil, fmt.Errorf("webhook: %s scheme: id header %s has parts that may hold a separator on both sides", name, cfg.IDHeader)
			}
		}
	}
	for i, k := range cfg.Secrets {
		if k == "" {
			return nil, fmt.Errorf("%w: secret %d is empty", ErrNoSecret, i)
		}
		s.secrets = append(s.secrets, []byte(k))
	}
	if len(s.secrets) == 0 {
		return nil, fmt.Errorf("%w: no secret given", ErrNoSecret)
	}
	cfg.Secrets = nil // kept only in s.secrets
	s.cfg = cfg
	return s, nil
}

// String describes the scheme without its secrets.
func (s *HMAC) String() string { return secretsString(s.name, len(s.secrets)) }

// parseHMACSignatures splits a signature header into decoded signatures.
// known is false when no entry carried the prefix; ok is false when the
// header has more than maxSignatures entries. Entries that do not decode
// are skipped (they match nothing).
func parseHMACSignatures(v, sep, prefix string, enc Encoding) (sigs [][]byte, known, ok bool) {
	entries := []string{v}
	if sep != "" {
		if strings.Count(v, sep) >= maxSignatures {
			return nil, false, false
		}
		entries = strings.Split(v, sep)
	}
	for _, e := range entries {
		e = strings.TrimSpace(e)
		rest, ok := strings.CutPrefix(e, prefix)
		if !ok {
			continue
		}
		known = true
		if b, err := enc.decode(rest); err == nil && len(b) > 0 {
			sigs = append(sigs, b)
		}
	}
	return sigs, known, true
}

// content builds the signed content from h and body.
func (s *HMAC) content(h http.Header, body []byte) ([]byte, map[string]string, error) {
	vals := make(map[string]string, 2)
	n := 0
	for _, p := range s.cfg.Signed {
		if p.header != "" {
			v, err := single(h, p.header)
			if err != nil {
				return nil, nil, err
			}
			vals[p.header] = v
			n += len(v)
		}
		n += len(p.literal)
		if p.body {
			n += len(body)
		}
	}
	c := make([]byte, 0, n)
	for _, p := range s.cfg.Signed {
		switch {
		case p.header != "":
			c = append(c, vals[p.header]...)
		case p.body:
			c = append(c, body...)
		default:
			c = append(c, p.literal...)
		}
	}
	return c, vals, nil
}

// Verify implements [Scheme].
func (s *HMAC) Verify(h http.Header, body []byte, now time.Time) (Event, error) {
	v, err := single(h, s.cfg.Header)
	if err != nil {
		return Event{}, err
	}
	content, vals, err := s.content(h, body)
	if err != nil {
		return Event{}, err
	}
	var ts time.Time
	if s.cfg.TimestampHeader != "" {
		if ts, err = parseUnix(vals[s.cfg.TimestampHeader]); err != nil {
			return Event{}, err
		}
	}
	if s.cfg.IDHeader != "" && strings.ContainsAny(vals[s.cfg.IDHeader], s.forbid) {
		return Event{}, fmt.Errorf("%w: %s contains a separator of the signed content", ErrMalformed, s.cfg.IDHeader)
	}
	sigs, known, ok := parseHMACSignatures(v, s.cfg.Separator, s.cfg.Prefix, s.cfg.Encoding)
	if !ok {
		return Event{}, fmt.Errorf("%w: %s has more than %d entries", ErrMalformed, s.cfg.Header, maxSignatures)
	}
	if !known {
		return Event{}, fmt.Errorf("%w: %s", ErrUnknownVersion, s.cfg.Header)
	}
	ok = false
	for _, k := range s.secrets {
		m := hmac.New(s.cfg.Hash, k)
		m.Write(content)
		mac := m.Sum(nil)
		for _, sig := range sigs {
			if hmac.Equal(sig, mac) {
				ok = true
			}
		}
	}
	if !ok {
		return Event{}, ErrNoMatch
	}
	if s.cfg.TimestampHeader != "" {
		if err := checkTime(ts, now, tolerance(s.Tolerance)); err != nil {
			return Event{}, err
		}
	}
	var id string
	if s.cfg.IDHeader != "" {
		id = vals[s.cfg.IDHeader]
	} else {
		idf := s.ID
		if idf == nil {
			idf = BodyHash
		}
		if id, err = idf(body); err != nil {
			return Event{}, err
		}
	}
	if err := checkID(id); err != nil {
		return Event{}, err
	}
	return Event{ID: id, Timestamp: ts}, nil
}

// Handshake implements [Handshaker]. Only the Slack scheme ([NewSlack]) has
// a handshake, its url_verification; for other HMAC schemes ok is false.
func (s *HMAC) Handshake(body []byte) (answer []byte, contentType string, ok bool) {
	if s.handshake == nil {
		return nil, "", false
	}
	return s.handshake(body)
}

// Sign returns the signature header's value for h and body under every
// secret (joined by Separator, or the first secret's alone when the header
// holds one). It is for tests and senders; h must hold the signed headers.
func (s *HMAC) Sign(h http.Header, body []byte) (string, error) {
	content, _, err := s.content(h, body)
	if err != nil {
		return "", err
	}
	var out []string
	for _, k := range s.secrets {
		m := hmac.New(s.cfg.Hash, k)
		m.Write(content)
		out = append(out, s.cfg.Prefix+s.cfg.Encoding.encode(m.Sum(nil)))
		if s.cfg.Separator == "" {
			break
		}
	}
	return strings.Join(out, s.cfg.Separator), nil
}
