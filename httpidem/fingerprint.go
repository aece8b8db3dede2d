package httpidem

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"hash"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
)

// fingerprint returns the sha256 of what makes a request "the same request":
// method, route pattern (when a ServeMux routed it before the middleware),
// escaped path, query (keys sorted), normalised Content-Type, the headers
// named by WithFingerprintHeaders, and the body (canonical JSON when
// configured). Every part is length-prefixed, so no two different requests
// hash the same bytes.
func (m *Middleware) fingerprint(r *http.Request, body []byte) []byte {
	h := sha256.New()
	field(h, r.Method)
	field(h, r.Pattern)
	field(h, r.URL.EscapedPath())
	field(h, canonicalQuery(r.URL.RawQuery))
	ct, isJSON := canonicalContentType(r.Header.Get("Content-Type"))
	field(h, ct)
	for _, name := range m.cfg.fpHeaders {
		vals := r.Header.Values(name)
		field(h, name)
		writeUvarint(h, uint64(len(vals)))
		for _, v := range vals {
			field(h, v)
		}
	}
	if m.cfg.canonicalJSON && isJSON {
		if cb, ok := canonicalJSON(body); ok {
			body = cb
		}
	}
	field(h, string(body))
	return h.Sum(nil)
}

func field(h hash.Hash, s string) {
	writeUvarint(h, uint64(len(s)))
	_, _ = io.WriteString(h, s)
}

func writeUvarint(h hash.Hash, v uint64) {
	var b [binary.MaxVarintLen64]byte
	_, _ = h.Write(binary.AppendUvarint(b[:0], v))
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

// canonicalJSON re-encodes one JSON value with object keys sorted and no
// insignificant whitespace; numbers are kept as written.
func canonicalJSON(b []byte) ([]byte, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false // trailing data
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, false
	}
	return buf.Bytes(), true
}
