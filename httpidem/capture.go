package httpidem

import (
	"bufio"
	"mime"
	"net"
	"net/http"
)

// capture passes the handler's response through to the client as it is
// written, and keeps a copy of what a replay needs: the final status, the
// allow-listed headers as they were when the status was written, and the
// body up to the limit.
//
// It implements http.Flusher (and FlushError) and http.Hijacker itself, so
// that a type assertion on the writer and http.ResponseController both
// reach the client's connection, and Unwrap for the controller's other
// methods (read and write deadlines, full duplex).
type capture struct {
	rw        http.ResponseWriter
	m         *Middleware
	before    http.Header // the header map as it was before the handler ran
	status    int         // final status; 0 until written
	headers   []string
	body      []byte
	max       int
	omitted   bool // over max, or a stream: the body is not kept
	hijacked  bool
	committed bool // the final status (or a hijack) reached the underlying writer
}

func (c *capture) Header() http.Header { return c.rw.Header() }

func (c *capture) Unwrap() http.ResponseWriter { return c.rw }

func (c *capture) WriteHeader(code int) {
	if c.status != 0 || c.hijacked {
		c.rw.WriteHeader(code) // superfluous: net/http logs it, as without us
		return
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		// Informational (103 Early Hints): not the result, and it commits
		// nothing: a final status can still follow (a problem, if the
		// handler gives up without answering).
		c.rw.WriteHeader(code)
		return
	}
	c.status = code
	h := c.rw.Header()
	for name, vals := range h {
		if c.m.cfg.replayHeaders[http.CanonicalHeaderKey(name)] {
			name = http.CanonicalHeaderKey(name)
			for _, v := range vals {
				c.headers = append(c.headers, name, v)
			}
		}
	}
	if ct := h.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err == nil && mt == "text/event-stream" {
			c.omitted = true // a live feed: never replayed as a body
		}
	}
	c.committed = true
	c.rw.WriteHeader(code)
}

func (c *capture) Write(p []byte) (int, error) {
	if c.status == 0 && !c.hijacked {
		c.WriteHeader(http.StatusOK)
	}
	n, err := c.rw.Write(p)
	if err != nil || n < len(p) {
		// The client did not take it all: the handler may stop here, so
		// the kept body cannot be known complete.
		c.omitted, c.body = true, nil
	}
	if !c.omitted && n > 0 {
		if len(c.body)+n > c.max {
			c.omitted, c.body = true, nil
		} else {
			c.body = append(c.body, p[:n]...)
		}
	}
	return n, err
}

// FlushError flushes to the client (after writing a 200 status if the
// handler wrote none), as http.ResponseController.Flush does.
func (c *capture) FlushError() error {
	if c.status == 0 && !c.hijacked {
		c.WriteHeader(http.StatusOK)
	}
	return http.NewResponseController(c.rw).Flush()
}

// Flush implements http.Flusher.
func (c *capture) Flush() { _ = c.FlushError() }

// Hijack implements http.Hijacker. After a hijack nothing the handler sends
// can be kept: the key is recorded as not replayable.
func (c *capture) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(c.rw).Hijack()
	if err == nil {
		c.hijacked, c.committed = true, true
	}
	return conn, brw, err
}

// result is what the record keeps, for a handler that wrote status.
func (c *capture) result() response {
	r := response{status: c.status, headers: c.headers, body: c.body}
	if c.omitted {
		r.flags |= flagBodyOmitted
		r.body = nil
	}
	if c.hijacked {
		r.flags |= flagHijacked
	}
	return r
}

// restoreHeaders puts the header map back as it was before the handler ran,
// for an answer of the middleware's own after a handler that wrote nothing:
// what the handler set (Content-Encoding, Location) belongs to the answer it
// did not give.
func (c *capture) restoreHeaders() {
	h := c.rw.Header()
	clear(h)
	for k, v := range c.before {
		h[k] = v
	}
}
