package webhook

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
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
// ed25519 under a public key. The signature header is a space-separated
// list (a sender rotating secrets signs with both); the request is
// authentic when any listed signature of a known version matches any key.
// Entries of other versions, and entries without a comma, are skipped.
//
// The webhook-* set is used when any of its three headers is present, the
// svix-* set otherwise. Each header must appear once.
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
	names := svixHeaders
	for _, n := range standardHeaders {
		if len(h.Values(n)) > 0 {
			names = standardHeaders
			break
		}
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
	entries := parseStandardSignatures(sigs)
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
			sig, err := base64.StdEncoding.DecodeString(e.sig)
			if err != nil {
				continue
			}
			for _, mac := range macs {
				if hmac.Equal(sig, mac) {
					ok = true
				}
			}
		case "v1a":
			sig, err := base64.StdEncoding.DecodeString(e.sig)
			if err != nil || len(sig) != ed25519.SignatureSize {
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

// parseStandardSignatures splits a webhook-signature value into its
// "<version>,<signature>" entries. Entries without a comma are skipped, as
// the reference libraries do; at most 64 entries are read.
func parseStandardSignatures(v string) []standardSig {
	var out []standardSig
	for _, f := range strings.Fields(v) {
		if len(out) == 64 {
			break
		}
		version, sig, ok := strings.Cut(f, ",")
		if !ok {
			continue
		}
		out = append(out, standardSig{version, sig})
	}
	return out
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
