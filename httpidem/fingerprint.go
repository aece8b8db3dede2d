package httpidem

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"
)

// fingerprint returns the sha256 of what makes a request "the same request":
// method, route pattern (when a ServeMux routed it before the middleware),
// escaped path, query (keys sorted), normalised Content-Type, the headers
// named by WithFingerprintHeaders, and the body (canonical JSON, RFC 8785,
// when configured). Every part is length-prefixed, so no two different
// requests hash the same bytes.
func (m *Middleware) fingerprint(r *http.Request, body []byte) []byte {
	return m.fingerprintWith(r, body, jcs)
}

// legacyFingerprint is the fingerprint httpidem computed for r before it
// canonicalised JSON per RFC 8785 (see legacyCanonicalJSON), when it differs
// from [Middleware.fingerprint]'s: records written before the upgrade carry
// it. ok is false when the two are the same (canonical JSON off, a body that
// is not JSON, or one both forms leave as it is or write alike).
func (m *Middleware) legacyFingerprint(r *http.Request, body []byte) (fp []byte, ok bool) {
	if !m.cfg.canonicalJSON {
		return nil, false
	}
	if _, isJSON := canonicalContentType(r.Header.Get("Content-Type")); !isJSON {
		return nil, false
	}
	if bytes.Equal(canonicalBody(body, jcs), canonicalBody(body, legacyCanonicalJSON)) {
		return nil, false
	}
	return m.fingerprintWith(r, body, legacyCanonicalJSON), true
}

// canonicalBody is canon(body), or body when canon refuses it.
func canonicalBody(body []byte, canon func([]byte) ([]byte, bool)) []byte {
	if cb, ok := canon(body); ok {
		return cb
	}
	return body
}

func (m *Middleware) fingerprintWith(r *http.Request, body []byte, canon func([]byte) ([]byte, bool)) []byte {
	b := make([]byte, 0, 256)
	b = field(b, r.Method)
	b = field(b, r.Pattern)
	b = field(b, r.URL.EscapedPath())
	b = field(b, canonicalQuery(r.URL.RawQuery))
	ct, isJSON := canonicalContentType(r.Header.Get("Content-Type"))
	b = field(b, ct)
	for _, name := range m.cfg.fpHeaders {
		vals := r.Header.Values(name)
		b = field(b, name)
		b = binary.AppendUvarint(b, uint64(len(vals)))
		for _, v := range vals {
			b = field(b, v)
		}
	}
	if m.cfg.canonicalJSON && isJSON {
		body = canonicalBody(body, canon)
	}
	b = binary.AppendUvarint(b, uint64(len(body)))
	h := sha256.New()
	_, _ = h.Write(b)
	_, _ = h.Write(body)
	return h.Sum(b[:0])
}

func field(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// canonicalQuery sorts the query by key, keeping the order of a key's
// values (it may matter). A query that does not parse is used as sent.
func canonicalQuery(raw string) string {
	if raw == "" {
		return ""
	}
	v, err := url.ParseQuery(raw)
	if err != nil {
		return "raw:" + raw
	}
	return v.Encode()
}

// canonicalContentType lower-cases the media type and its parameter names
// and sorts the parameters; it reports whether the type is JSON.
func canonicalContentType(ct string) (string, bool) {
	if ct == "" {
		return "", false
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return "raw:" + strings.ToLower(strings.TrimSpace(ct)), false
	}
	isJSON := mt == "application/json" || strings.HasSuffix(mt, "+json")
	return mime.FormatMediaType(mt, params), isJSON
}

// legacyCanonicalJSON is the canonical form of JSON bodies before RFC 8785,
// kept unchanged so that records written before the upgrade are recognised
// (see [Middleware.legacyFingerprint]). It re-encodes one JSON value with
// object keys sorted (by UTF-8 bytes) and no insignificant whitespace, and a
// trailing newline (encoding/json's Encoder); numbers are kept as written,
// strings as encoding/json writes them. A body whose
// strings hold bytes that are not UTF-8, or lone surrogate escapes, is not
// canonicalised: encoding/json decodes those to U+FFFD, so different bodies
// would hash alike. Nor is a body with an object whose member names repeat:
// encoding/json keeps the last, so {"a":1,"a":2} would hash as {"a":2}.
func legacyCanonicalJSON(b []byte) ([]byte, bool) {
	if !utf8.Valid(b) || duplicateNames(b) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false // trailing data
	}
	if hasReplacement(v) {
		return nil, false // a lone surrogate (or a U+FFFD sent as such): keep the bytes
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, false
	}
	return buf.Bytes(), true
}

// hasReplacement reports whether a decoded JSON value holds U+FFFD in a
// string or an object key.
func hasReplacement(v any) bool {
	switch v := v.(type) {
	case string:
		return strings.ContainsRune(v, utf8.RuneError)
	case []any:
		for _, e := range v {
			if hasReplacement(e) {
				return true
			}
		}
	case map[string]any:
		for k, e := range v {
			if strings.ContainsRune(k, utf8.RuneError) || hasReplacement(e) {
				return true
			}
		}
	}
	return false
}

// duplicateNames reports whether an object in the JSON value b has two
// members of the same name (after unescaping). It reads tokens only; a body
// that is not valid JSON reports false (the decoder refuses it after).
func duplicateNames(b []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	// One frame per open object or array; names is nil for an array. key:
	// the object's next token is a member name (or its end).
	type frame struct {
		names map[string]bool
		key   bool
	}
	var open []frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		if n := len(open); n > 0 && open[n-1].key {
			if name, ok := tok.(string); ok {
				if open[n-1].names[name] {
					return true
				}
				open[n-1].names[name], open[n-1].key = true, false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			open = append(open, frame{names: map[string]bool{}, key: true})
			continue
		case json.Delim('['):
			open = append(open, frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			open = open[:len(open)-1]
		}
		// A value ended: the enclosing object's next token is a name.
		if len(open) == 0 {
			return false
		}
		if open[len(open)-1].names != nil {
			open[len(open)-1].key = true
		}
	}
}
