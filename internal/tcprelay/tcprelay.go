// Package tcprelay is a TCP relay between a client under test and a real
// server, for the faults a real server cannot produce on demand: the
// network going silent (Blackhole), an answer lost after the server acted
// on the request (DropAnswers, DropReplies), and every connection dying at
// once (Cut, or Close, which also stops accepting), or some of them
// (CutSome). Everything else is the real server's.
//
// New is for tests; Listen for a command (idem chaos), which has no
// testing.TB.
package tcprelay

import (
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
)

// Relay forwards each connection it accepts to the target.
type Relay struct {
	ln     net.Listener
	target string
	holed  atomic.Bool
	drop   atomic.Int32
	reply  atomic.Int32 // requests left whose answer DropReplies drops
	cutAt  atomic.Int64 // bytes of answers left before a cut; 0: none armed
	cuts   atomic.Int32
	mu     sync.Mutex
	conns  map[*link]struct{} // the live relayed connections
	closed bool
	wg     sync.WaitGroup
}

// TB is the part of testing.TB that New uses: taking it rather than
// testing.TB keeps package testing out of a command that uses Listen.
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(func())
}

// New starts a relay to target (host:port) on a free loopback port; it is
// closed when tb ends.
func New(tb TB, target string) *Relay {
	tb.Helper()
	r, err := Listen(target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(r.Close)
	return r
}

// Listen starts a relay to target (host:port) on a free loopback port;
// the caller closes it.
func Listen(target string) (*Relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Relay{ln: ln, target: target, conns: map[*link]struct{}{}}
	r.wg.Go(r.accept)
	return r, nil
}

// Addr is the address clients dial instead of the target.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// Blackhole drops every byte from now on, both ways, and keeps the
// sockets open: the client sees a silent network, not a closed one.
func (r *Relay) Blackhole() { r.holed.Store(true) }

// DropAnswers makes the relay drop the next n answers from the server (the
// next n reads on any of its connections) and close the connection each
// arrived on: the server did the work, the client never hears of it.
func (r *Relay) DropAnswers(n int) { r.drop.Store(int32(n)) }

// DropReplies makes the relay drop the answer to the next n requests: the
// next n connections the client sends something on each lose the server's
// next answer, and are closed. Unlike DropAnswers it leaves alone what
// the server sends on a connection that asked nothing since it was armed
// (a LISTEN connection's notifications, a pool's other idle connections),
// so the answer dropped is the one to the call the test makes next,
// whatever else a client with several connections has in flight.
func (r *Relay) DropReplies(n int) { r.reply.Store(int32(n)) }

// CutAnswersAfter makes the relay pass the next n bytes (n > 0) of the
// server's answers and then close the connection they arrived on: the
// server did all the work, the client hears the first part of its
// answers (a pipeline whose connection dies after some of its replies).
func (r *Relay) CutAnswersAfter(n int) { r.cutAt.Store(int64(n)) }

// AnswersCut is how many connections CutAnswersAfter has closed.
func (r *Relay) AnswersCut() int { return int(r.cuts.Load()) }

// Cut closes every relayed connection and keeps accepting new ones: a
// broker restart or a dropped network that comes back, to which a client
// can reconnect.
func (r *Relay) Cut() {
	r.mu.Lock()
	conns := r.conns
	r.conns = map[*link]struct{}{}
	r.mu.Unlock()
	for l := range conns {
		l.close()
	}
}

// CutSome resets each relayed connection with probability p, and at
// least one when there is one, and says how many it reset. The client
// reads a reset (no clean shutdown), the server sees its client vanish;
// the relay goes on accepting, and a client can reconnect.
func (r *Relay) CutSome(p float64) int {
	r.mu.Lock()
	var cut []*link
	for l := range r.conns {
		if rand.Float64() < p {
			cut = append(cut, l)
			delete(r.conns, l)
		}
	}
	if len(cut) == 0 {
		for l := range r.conns { // a random one: map order is random
			cut = append(cut, l)
			delete(r.conns, l)
			break
		}
	}
	r.mu.Unlock()
	for _, l := range cut {
		// SO_LINGER 0: an RST, not a FIN after the buffered bytes.
		if tc, ok := l.client.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		l.close()
	}
	return len(cut)
}

// Close stops accepting and closes every relayed connection (the server
// sees its clients die).
func (r *Relay) Close() {
	r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for l := range r.conns {
		l.close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

func (r *Relay) accept() {
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
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		l := &link{client: c, server: s}
		r.conns[l] = struct{}{}
		r.mu.Unlock()
		r.wg.Go(func() { r.pipe(s, c, false, l) })
		r.wg.Go(func() { r.pipe(c, s, true, l) })
	}
}

// link is one relayed connection, which its two pipes share.
type link struct {
	client, server net.Conn
	dropNext       atomic.Bool // DropReplies picked this connection: drop its next answer
}

func (l *link) close() {
	l.client.Close()
	l.server.Close()
}

// pipe copies src to dst until either fails; answers says src is the
// server, whose reads DropAnswers and DropReplies may drop.
func (r *Relay) pipe(dst, src net.Conn, answers bool, l *link) {
	defer func() {
		dst.Close()
		r.mu.Lock()
		delete(r.conns, l) // no longer live: CutSome counts the others
		r.mu.Unlock()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if answers && r.drop.Load() > 0 && r.drop.Add(-1) >= 0 {
				src.Close()
				return
			}
			if answers && l.dropNext.Load() {
				src.Close()
				return
			}
			// A request picks its connection before it is passed on, so
			// that the server cannot answer before the pick.
			if !answers && !l.dropNext.Load() && r.reply.Load() > 0 && r.reply.Add(-1) >= 0 {
				l.dropNext.Store(true)
			}
			if answers {
				if left := r.cutAt.Load(); left > 0 {
					if int64(n) >= left && r.cutAt.CompareAndSwap(left, 0) {
						_, _ = dst.Write(buf[:left])
						r.cuts.Add(1)
						src.Close()
						return
					}
					r.cutAt.Add(-int64(n))
				}
			}
			if !r.holed.Load() {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil { // EOF or a closed socket: pass the close on
			return
		}
	}
}
