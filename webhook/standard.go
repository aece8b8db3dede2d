package webhook

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Standard verifies Standard Webhooks (https://www.standardwebhooks.com),
// which Svix also sends under its own header names:
//
//	webhook-id:        msg_2KWPBgLlAfxdpx2AI54pPJ85f4W   (or svix-id)
//	webhook-timestamp: 1674087231                       (or svix-timestamp)
//	webhook-signature: v1,<base64> v1a,<base64> ...     (or svix-signature)
//
// The signed content is id + "." + timestamp + "." + raw body. A "v1"
// signature is HMAC-SHA256 under a symmetric secret; a "v1a" signature is
// ed25519 under a public key. The signature header is a list of at most 64
// entries separated by single ASCII spaces (a sender rotating secrets signs
// with both); the request is authentic when any listed signature of a known
// version matches any key. Entries of other versions, and entries without a
// comma, are skipped. A signature must be canonical padded base64, as the
// JavaScript and Python references compare the encoded strings: one that
// decodes to the right bytes but is written otherwise (unused bits set)
// matches nothing.
//
// The webhook-* set is used when any of its three headers is present, the
// svix-* set otherwise. A request may carry both sets (a sender that
// serves verifiers of either name) only when each pair is equal; headers
// of both sets that differ, or a set that is partly there, are
// [ErrMalformed]. Each header must appear once.
//
// The event id is webhook-id, which the signature covers. It must not
// contain '.', which would make the signed content ambiguous (id "a.1" with
// timestamp 2 signs the same bytes as id "a" with timestamp 1 and a body
// starting "2.").
type Standard struct {
	// Tolerance is how far webhook-timestamp may be from now, either way:
	// 0 means [DefaultTolerance] (5 minutes), negative means unchecked (to
	// re-verify old payloads).
	Tolerance time.Duration

	secrets [][]byte            // v1
	public  []ed25519.PublicKey // v1a
}

// NewStandard returns a Standard scheme that accepts a signature under any
// of keys. Each key is one of:
//
//   - "whsec_" + base64 of a symmetric secret (the prefix is optional; the
//     padding too): verifies "v1" signatures;
//   - "whpk_" + base64 of a 32-byte ed25519 public key: verifies "v1a"
//     signatures. Trust only keys configured here, never one that arrives
//     with a request.
//
// An empty key, "whsec_" alone, or a key that does not decode is
// [ErrNoSecret].
func NewStandard(keys ...string) (*Standard, error) {
	s := new(Standard)
	for i, k := range keys {
		if pk, ok := strings.CutPrefix(k, "whpk_"); ok {
			b, err := decodeB64(pk)
			if err != nil || len(b) != ed25519.PublicKeySize {
				return nil, fmt.Errorf("%w: key %d is not a base64 ed25519 public key", ErrNoSecret, i)
			}
			s.public = append(s.public, ed25519.PublicKey(b))
			continue
		}
		b, err := decodeB64(strings.TrimPrefix(k, "whsec_"))
		if err != nil || len(b) == 0 {
			return nil, fmt.Errorf("%w: key %d is empty or not base64", ErrNoSecret, i)
		}
		s.secrets = append(s.secrets, b)
	}
	if len(s.secrets)+len(s.public) == 0 {
		return nil, fmt.Errorf("%w: no key given", ErrNoSecret)
	}
	return s, nil
}

// decodeB64 decodes standard base64 with or without padding.
func decodeB64(s string) ([]byte, error) {
	if strings.HasSuffix(s, "=") {
		return base64.StdEncoding.DecodeString(s)
	}
	return base64.RawStdEncoding.DecodeString(s)
}

// String describes the scheme without its keys.
func (s *Standard) String() string {
	return secretsString("Standard", len(s.secrets)+len(s.public))
}

// The header names of the two sets.
var (
	standardHeaders = [3]string{"Webhook-Id", "Webhook-Timestamp", "Webhook-Signature"}
	svixHeaders     = [3]string{"Svix-Id", "Svix-Timestamp", "Svix-Signature"}
)

// Verify implements [Scheme].
func (s *Standard) Verify(h http.Header, body []byte, now time.Time) (Event, error) {
	names, err := standardNames(h)
	if err != nil {
		return Event{}, err
	}
	id, err := single(h, names[0])
	if err != nil {
		return Event{}, err
	}
	tsRaw, err := single(h, names[1])
	if err != nil {
		return Event{}, err
	}
	sigs, err := single(h, names[2])
	if err != nil {
		return Event{}, err
	}
	if strings.IndexByte(id, '.') >= 0 {
		return Event{}, fmt.Errorf("%w: %s contains '.'", ErrMalformed, names[0])
	}
	ts, err := parseUnix(tsRaw)
	if err != nil {
		return Event{}, err
	}
	entries, err := parseStandardSignatures(sigs)
	if err != nil {
		return Event{}, fmt.Errorf("%w: %s %s", ErrMalformed, names[2], err)
	}
	known := false
	for _, e := range entries {
		if e.version == "v1" && len(s.secrets) > 0 || e.version == "v1a" && len(s.public) > 0 {
			known = true
		}
	}
	if !known {
		return Event{}, fmt.Errorf("%w: %s", ErrUnknownVersion, names[2])
	}
	content := make([]byte, 0, len(id)+len(tsRaw)+2+len(body))
	content = append(content, id...)
	content = append(content, '.')
	content = append(content, tsRaw...)
	content = append(content, '.')
	content = append(content, body...)
	if !s.match(entries, content) {
		return Event{}, ErrNoMatch
	}
	// The timestamp is checked after the signature: an unsigned request
	// learns nothing about the clock.
	if err := checkTime(ts, now, tolerance(s.Tolerance)); err != nil {
		return Event{}, err
	}
	if err := checkID(id); err != nil {
		return Event{}, err
	}
	return Event{ID: id, Timestamp: ts}, nil
}

// match reports whether any entry matches any key. Every comparison is
// constant-time; the loop does not stop early on a match, so the time taken
// does not say which key matched.
func (s *Standard) match(entries []standardSig, content []byte) bool {
	ok := false
	var macs [][]byte
	for _, e := range entries {
		switch e.version {
		case "v1":
			if macs == nil {
				macs = make([][]byte, len(s.secrets))
				for i, k := range s.secrets {
					m := hmac.New(sha256.New, k)
					m.Write(content)
					macs[i] = m.Sum(nil)
				}
			}
			sig, canonical := decodeCanonical(e.sig)
			if !canonical {
				continue
			}
			for _, mac := range macs {
				if hmac.Equal(sig, mac) {
					ok = true
				}
			}
		case "v1a":
			sig, canonical := decodeCanonical(e.sig)
			if !canonical || len(sig) != ed25519.SignatureSize {
				continue
			}
			for _, pk := range s.public {
				if ed25519.Verify(pk, content, sig) {
					ok = true
				}
			}
		}
	}
	return ok
}

type standardSig struct{ version, sig string }

// maxSignatures bounds the entries of a signature header: a sender signs
// with a few secrets at once, never dozens.
const maxSignatures = 64

// parseStandardSignatures splits a webhook-signature value into its
// "<version>,<signature>" entries. Entries are separated by exactly one
// ASCII space and hold printable ASCII only: an empty entry (two spaces, a
// leading or trailing space), a tab, a CR or LF, a non-ASCII space (NBSP)
// or more than maxSignatures entries make the whole header malformed.
// Entries without a comma are skipped, as the reference libraries do.
func parseStandardSignatures(v string) ([]standardSig, error) {
	if n := strings.Count(v, " ") + 1; n > maxSignatures {
		return nil, fmt.Errorf("has %d entries, more than %d", n, maxSignatures)
	}
	var out []standardSig
	for f := range strings.SplitSeq(v, " ") {
		if f == "" {
			return nil, errors.New("has an empty entry (entries are separated by one space)")
		}
		for i := 0; i < len(f); i++ {
			if f[i] <= ' ' || f[i] >= 0x7f {
				return nil, errors.New("holds a byte other than printable ASCII and single spaces")
			}
		}
		version, sig, ok := strings.Cut(f, ",")
		if !ok {
			continue
		}
		out = append(out, standardSig{version, sig})
	}
	return out, nil
}

// decodeCanonical decodes a signature written in canonical padded standard
// base64: the one encoding of its bytes (padding present, unused bits zero,
// no line breaks), so that a signature is accepted as the string the sender
// computed and not as any of the other strings that decode to it.
func decodeCanonical(s string) ([]byte, bool) {
	b, err := base64.StdEncoding.Strict().DecodeString(s)
	if err != nil || base64.StdEncoding.EncodedLen(len(b)) != len(s) {
		return nil, false
	}
	return b, true
}

// standardNames returns the header set a request uses: webhook-* when any
// of its headers is present, svix-* otherwise. Headers of both sets are
// taken only when they say the same (each pair equal, one value each):
// otherwise the request is ambiguous (the two sets' libraries would verify
// different values), ErrMalformed.
func standardNames(h http.Header) ([3]string, error) {
	has := func(names [3]string) bool {
		for _, n := range names {
			if len(h.Values(n)) > 0 {
				return true
			}
		}
		return false
	}
	std, svix := has(standardHeaders), has(svixHeaders)
	switch {
	case std && svix:
		for i := range standardHeaders {
			a, b := h.Values(standardHeaders[i]), h.Values(svixHeaders[i])
			if len(a) != 1 || len(b) != 1 || a[0] != b[0] {
				return standardHeaders, fmt.Errorf("%w: webhook-* and svix-* headers that differ", ErrMalformed)
			}
		}
		return standardHeaders, nil
	case svix:
		return svixHeaders, nil
	}
	return standardHeaders, nil
}

// Sign returns a webhook-signature value for id, ts and body: one "v1"
// entry per symmetric secret, space-separated. It is for tests and for
// senders; a scheme with only public keys returns "".
func (s *Standard) Sign(id string, ts time.Time, body []byte) string {
	var b strings.Builder
	t := strconv.FormatInt(ts.Unix(), 10)
	for i, k := range s.secrets {
		m := hmac.New(sha256.New, k)
		m.Write([]byte(id))
		m.Write([]byte{'.'})
		m.Write([]byte(t))
		m.Write([]byte{'.'})
		m.Write(body)
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("v1,")
		b.WriteString(base64.StdEncoding.EncodeToString(m.Sum(nil)))
	}
	return b.String()
}
