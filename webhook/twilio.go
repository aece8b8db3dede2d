package webhook

import (
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// RequestScheme is a [Scheme] that also signs the request's URL (Twilio).
// A [Receiver] calls VerifyRequest instead of Verify for such a scheme.
type RequestScheme interface {
	Scheme
	VerifyRequest(r *http.Request, body []byte, now time.Time) (Event, error)
}

// Twilio verifies Twilio's request signatures:
//
//	X-Twilio-Signature: base64(HMAC-SHA1(auth token, URL + params))
//
// For form posts (application/x-www-form-urlencoded) the signed content is
// the full URL Twilio requested followed by every POST parameter's name and
// value, sorted by name; the values of a name sent more than once are
// taken sorted and without repeats, as Twilio's helper libraries sign
// them, or in the order sent. (So a captured request whose repeated values
// were reordered, or one repeated again, still verifies, under another
// body hash: a second event. Twilio's own validators accept it too.) For
// other bodies (JSON), the URL carries
// bodySHA256=<hex SHA-256 of the body>: the signature covers the URL only
// and the body must hash to that parameter. As in twilio-go, a signature is
// also accepted for the URL without its port, or with the scheme's default
// port added (Twilio's own signing is inconsistent about ports).
//
// The URL is PublicURL's scheme and host followed by the request's path and
// query as received: set PublicURL to the address configured at Twilio
// (behind a proxy that rewrites the path, the signature cannot verify).
// Twilio signs no timestamp. Its idempotency token header is not signed, so
// the event id is [BodyHash] of the signed body (change it with ID).
type Twilio struct {
	// PublicURL is the endpoint's URL as Twilio calls it
	// ("https://example.com/twilio"); only its scheme and host are used.
	PublicURL string
	// ID takes the event id from the verified body; nil means [BodyHash].
	ID IDFunc

	tokens [][]byte
}

// NewTwilio returns a Twilio scheme for the endpoint at publicURL that
// accepts a signature under any of authTokens (the primary and secondary
// token during a rotation). No token, or an empty one, is [ErrNoSecret].
func NewTwilio(publicURL string, authTokens ...string) (*Twilio, error) {
	u, err := url.Parse(publicURL)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return nil, fmt.Errorf("webhook: Twilio: public URL %q is not absolute", publicURL)
	}
	t := &Twilio{PublicURL: publicURL}
	for i, k := range authTokens {
		if k == "" {
			return nil, fmt.Errorf("%w: token %d is empty", ErrNoSecret, i)
		}
		t.tokens = append(t.tokens, []byte(k))
	}
	if len(t.tokens) == 0 {
		return nil, fmt.Errorf("%w: no token given", ErrNoSecret)
	}
	return t, nil
}

// String describes the scheme without its tokens.
func (t *Twilio) String() string { return secretsString("Twilio", len(t.tokens)) }

// Verify implements [Scheme] for a request to PublicURL exactly (path and
// query included). A [Receiver] calls VerifyRequest instead.
func (t *Twilio) Verify(h http.Header, body []byte, now time.Time) (Event, error) {
	return t.verify(t.PublicURL, h, body)
}

// VerifyRequest implements [RequestScheme].
func (t *Twilio) VerifyRequest(r *http.Request, body []byte, now time.Time) (Event, error) {
	u, err := url.Parse(t.PublicURL)
	if err != nil {
		return Event{}, fmt.Errorf("%w: the public URL does not parse", ErrMalformed)
	}
	return t.verify(u.Scheme+"://"+u.Host+r.URL.RequestURI(), r.Header, body)
}

func (t *Twilio) verify(fullURL string, h http.Header, body []byte) (Event, error) {
	v, err := single(h, "X-Twilio-Signature")
	if err != nil {
		return Event{}, err
	}
	sig, canonical := decodeCanonical(v) // Twilio's helpers compare the base64 strings
	if !canonical {
		return Event{}, ErrNoMatch
	}
	u, err := url.Parse(fullURL)
	if err != nil {
		return Event{}, fmt.Errorf("%w: the request URL does not parse", ErrMalformed)
	}
	var (
		params     string
		paramForms []string // params, and the other way of signing repeated names
	)
	if bodyHash := u.Query().Get("bodySHA256"); bodyHash != "" {
		sum := sha256.Sum256(body)
		if !hmac.Equal([]byte(strings.ToLower(bodyHash)), []byte(hex.EncodeToString(sum[:]))) {
			return Event{}, fmt.Errorf("%w: the body does not match bodySHA256", ErrNoMatch)
		}
	} else {
		ct, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
		if ct != "application/x-www-form-urlencoded" {
			return Event{}, fmt.Errorf("%w: a body that is not a form needs bodySHA256 in the URL", ErrNoMatch)
		}
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return Event{}, fmt.Errorf("%w: the form body does not parse", ErrMalformed)
		}
		params = twilioParams(form, false)
		for _, vs := range form {
			if len(vs) > 1 { // a repeated name: the other way of signing it too
				if sorted := twilioParams(form, true); sorted != params {
					paramForms = append(paramForms, sorted)
				}
				break
			}
		}
	}
	paramForms = append(paramForms, params)
	ok := false
	for _, cand := range twilioURLs(u) {
		for _, p := range paramForms {
			for _, k := range t.tokens {
				m := hmac.New(sha1.New, k)
				m.Write([]byte(cand))
				m.Write([]byte(p))
				if hmac.Equal(sig, m.Sum(nil)) {
					ok = true
				}
			}
		}
	}
	if !ok {
		return Event{}, ErrNoMatch
	}
	idf := t.ID
	if idf == nil {
		idf = BodyHash
	}
	id, err := idf(body)
	if err != nil {
		return Event{}, err
	}
	if err := checkID(id); err != nil {
		return Event{}, err
	}
	return Event{ID: id}, nil
}

// twilioParams concatenates the form's names and values, sorted by name
// (not by the concatenated strings: that order differs, and is wrong). A
// name sent more than once has its values in the order sent, or, with
// sortValues, sorted and without repeats, as Twilio's Node and Python
// helpers sign them; the receiver accepts either.
func twilioParams(form url.Values, sortValues bool) string {
	names := make([]string, 0, len(form))
	for k := range form {
		names = append(names, k)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, k := range names {
		vs := form[k]
		if sortValues && len(vs) > 1 {
			vs = slices.Compact(slices.Sorted(slices.Values(vs)))
		}
		for _, v := range vs {
			b.WriteString(k)
			b.WriteString(v)
		}
	}
	return b.String()
}

// twilioURLs are the URL as given, without its port, and with the default
// port of its scheme.
func twilioURLs(u *url.URL) []string {
	out := []string{u.String()}
	host := u.Hostname()
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	noPort := *u
	noPort.Host = host
	if s := noPort.String(); s != out[0] {
		out = append(out, s)
	}
	if u.Port() == "" {
		port := map[string]string{"https": "443", "http": "80"}[u.Scheme]
		if port != "" {
			withPort := *u
			withPort.Host = net.JoinHostPort(u.Hostname(), port)
			out = append(out, withPort.String())
		}
	}
	return out
}

// Sign returns an X-Twilio-Signature for a form post of form to fullURL
// under the first token. It is for tests.
func (t *Twilio) Sign(fullURL string, form url.Values) string {
	m := hmac.New(sha1.New, t.tokens[0])
	m.Write([]byte(fullURL))
	if form != nil {
		m.Write([]byte(twilioParams(form, false)))
	}
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}
