package tcprelay

import (
	"io"
	"net"
	"testing"
	"time"
)

// echo starts an echo server and returns its address.
func echo(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// dial connects through r and waits for an echo: the connection is live.
func dial(t *testing.T, r *Relay) net.Conn {
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	return c
}

// dead reports whether c's relayed connection is gone.
func dead(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !isTimeout(err)
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func TestCutSome(t *testing.T) {
	r, err := Listen(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if n := r.CutSome(1); n != 0 {
		t.Fatalf("CutSome with no connection: %d", n)
	}
	cs := []net.Conn{dial(t, r), dial(t, r), dial(t, r)}
	if n := r.CutSome(0); n != 1 {
		t.Fatalf("CutSome(0) = %d, want at least one: 1", n)
	}
	var cut []net.Conn
	for _, c := range cs {
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
			cut = append(cut, c)
		}
	}
	if len(cut) != 1 {
		t.Fatalf("%d connections dead after CutSome(0), want 1", len(cut))
	}
	if n := r.CutSome(1); n != 2 {
		t.Fatalf("CutSome(1) = %d, want the 2 left", n)
	}
	for _, c := range cs {
		if c != cut[0] && !dead(c) {
			t.Error("a connection lives on after CutSome(1)")
		}
	}
	dial(t, r) // the relay goes on accepting
}

// TestCutSomeCountsLive shows that a connection its client closed is
// not counted (nor cut) again.
func TestCutSomeCountsLive(t *testing.T) {
	r, err := Listen(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c := dial(t, r)
	dial(t, r)
	c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		n := len(r.conns)
		r.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d live connections, want 1", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := r.CutSome(1); n != 1 {
		t.Fatalf("CutSome(1) = %d, want 1", n)
	}
}
