package main

import (
	"io"
	"math/rand/v2"
	"net"
	"sync"
)

// chaosProxy is a TCP proxy in the harness between the workers and a
// broker (or DynamoDB) that has no means of its own to drop a client's
// connection on demand: the workers dial the proxy, and a fault closes
// some of the relayed connections, both ends at once, with no clean
// shutdown (the worker reads a reset, the server sees its client vanish).
// internal/tcprelay does the same for tests, but it is bound to a
// testing.TB, which the command cannot give it.
type chaosProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  map[*relayed]struct{}
	closed bool
	wg     sync.WaitGroup
}

// relayed is one relayed connection: the worker's side and the server's.
type relayed struct{ client, server net.Conn }

// close resets the worker's side (SO_LINGER 0: an RST, not a FIN after
// the buffered bytes) and closes the server's.
func (c *relayed) close() {
	if tc, ok := c.client.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.client.Close()
	c.server.Close()
}

// newChaosProxy starts a proxy to target (host:port) on a free loopback
// port.
func newChaosProxy(target string) (*chaosProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &chaosProxy{ln: ln, target: target, conns: map[*relayed]struct{}{}}
	r.wg.Go(r.accept)
	return r, nil
}

// Addr is the host:port the workers dial instead of the target.
func (r *chaosProxy) Addr() string { return r.ln.Addr().String() }

func (r *chaosProxy) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", r.target)
		if err != nil {
			c.Close()
			continue
		}
		rc := &relayed{client: c, server: s}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			rc.close()
			return
		}
		r.conns[rc] = struct{}{}
		r.mu.Unlock()
		r.wg.Go(func() { r.pipe(rc, s, c) })
		r.wg.Go(func() { r.pipe(rc, c, s) })
	}
}

// pipe copies src to dst until either fails, then drops the connection.
func (r *chaosProxy) pipe(rc *relayed, dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	r.mu.Lock()
	delete(r.conns, rc)
	r.mu.Unlock()
	rc.close()
}

// Cut closes each relayed connection with probability p, and at least
// one when there is one, and says how many it closed. The relay goes on
// accepting: a worker reconnects.
func (r *chaosProxy) Cut(p float64) int {
	r.mu.Lock()
	var cut []*relayed
	for rc := range r.conns {
		if rand.Float64() < p {
			cut = append(cut, rc)
			delete(r.conns, rc)
		}
	}
	if len(cut) == 0 {
		for rc := range r.conns { // a random one: map order is random
			cut = append(cut, rc)
			delete(r.conns, rc)
			break
		}
	}
	r.mu.Unlock()
	for _, rc := range cut {
		rc.close()
	}
	return len(cut)
}

// Close stops accepting and closes every relayed connection.
func (r *chaosProxy) Close() {
	r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for rc := range r.conns {
		rc.close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}
