package httpidem

import (
	"encoding/binary"
	"errors"
	"net/http"
)

// The stored result of a request: a version byte, flags, the status, the
// replayed header lines and the body, all length-prefixed with uvarints:
//
//	1 | flags | status | n | (len name, name, len value, value)*n | body...
//
// The version byte is the format's marker: a result that does not begin with
// it was not written by the middleware. That is a result an operator gave
// when resolving the key as done (idem resolve KEY --done [--result S]):
// empty or plain text, which never begins with byte 1.
const recordVersion = 1

const (
	flagBodyOmitted = 1 << iota // the body was over MaxResponse, or a stream
	flagHijacked                // the handler took the connection: nothing to replay
)

// response is what a request's record holds.
type response struct {
	status  int
	flags   byte
	headers []string // name, value, name, value...
	body    []byte
}

var (
	// errBadRecord: the result carries the middleware's marker but cannot
	// be decoded.
	errBadRecord = errors.New("httpidem: stored response cannot be decoded")
	// errNotRecorded: the result is not one the middleware wrote (no
	// marker): the key was resolved as done by hand, and no response was
	// kept.
	errNotRecorded = errors.New("httpidem: the key was completed without a recorded response")
)

func (r *response) encode() []byte {
	n := 2 + binary.MaxVarintLen64*(2+len(r.headers)) + len(r.body)
	for _, h := range r.headers {
		n += len(h)
	}
	b := make([]byte, 0, n)
	b = append(b, recordVersion, r.flags)
	b = binary.AppendUvarint(b, uint64(r.status))
	b = binary.AppendUvarint(b, uint64(len(r.headers)/2))
	for _, h := range r.headers {
		b = binary.AppendUvarint(b, uint64(len(h)))
		b = append(b, h...)
	}
	return append(b, r.body...)
}

func decodeResponse(b []byte) (response, error) {
	var r response
	if len(b) == 0 || b[0] != recordVersion {
		return r, errNotRecorded
	}
	if len(b) < 2 {
		return r, errBadRecord
	}
	r.flags = b[1]
	b = b[2:]
	status, n := binary.Uvarint(b)
	if n <= 0 || status > 999 {
		return r, errBadRecord
	}
	r.status, b = int(status), b[n:]
	count, n := binary.Uvarint(b)
	if n <= 0 || count > uint64(len(b)) {
		return r, errBadRecord
	}
	b = b[n:]
	r.headers = make([]string, 0, 2*count)
	for i := uint64(0); i < 2*count; i++ {
		l, n := binary.Uvarint(b)
		if n <= 0 || l > uint64(len(b)-n) {
			return r, errBadRecord
		}
		r.headers = append(r.headers, string(b[n:n+int(l)]))
		b = b[n+int(l):]
	}
	r.body = b
	return r, nil
}

// replay writes the stored response to w.
func (r *response) replay(w http.ResponseWriter) {
	h := w.Header()
	for i := 0; i+1 < len(r.headers); i += 2 {
		h.Del(r.headers[i]) // the stored values replace any set before the middleware
	}
	for i := 0; i+1 < len(r.headers); i += 2 {
		h[r.headers[i]] = append(h[r.headers[i]], r.headers[i+1])
	}
	h.Set(HeaderReplayed, "true")
	if r.flags&flagBodyOmitted != 0 {
		h.Set(HeaderBodyOmitted, "true")
	}
	w.WriteHeader(r.status)
	if len(r.body) > 0 {
		_, _ = w.Write(r.body)
	}
}
