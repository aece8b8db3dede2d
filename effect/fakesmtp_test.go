package effect_test

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeSMTP is a tiny SMTP server on 127.0.0.1 for the faults a real server
// cannot produce on demand. Replies default to success; set a field to
// change one stage's reply.
type fakeSMTP struct {
	ln   net.Listener
	Addr string

	Ext       []string // extensions EHLO lists (default 8BITMIME)
	Mail      string   // reply to MAIL FROM (default "250 ok")
	Rcpt      string   // reply to RCPT TO
	Auth      string   // reply to AUTH
	EndOfData string   // reply to the message's final "."
	// DropAfterData reads the whole message, then closes the connection
	// without answering it.
	DropAfterData bool
	// HangAt is a command ("MAIL", "RCPT", "DATA", ".") after which the
	// server stops answering (and keeps the connection open).
	HangAt string

	tls *tls.Config // set by newFakeSMTPS: every connection is TLS from its first byte

	mu       sync.Mutex
	cutAt    string // set with CutAt
	tlsConns int    // connections whose TLS handshake succeeded
	commands []string
	messages []string
	hung     chan struct{}
	wg       sync.WaitGroup
}

func newFakeSMTP(t *testing.T, network string) *fakeSMTP {
	t.Helper()
	return startFakeSMTP(t, network, nil)
}

// newFakeSMTPS starts a fake that speaks implicit TLS (as on port 465)
// with a new self-signed certificate for 127.0.0.1, and returns the pool
// a client must trust to verify it.
func newFakeSMTPS(t *testing.T) (*fakeSMTP, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "fake smtp"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	cfg := &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	return startFakeSMTP(t, "", cfg), pool
}

func startFakeSMTP(t *testing.T, network string, tlsConfig *tls.Config) *fakeSMTP {
	t.Helper()
	if network == "" {
		network = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", network)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeSMTP{ln: ln, Addr: ln.Addr().String(), tls: tlsConfig, hung: make(chan struct{})}
	f.wg.Add(1)
	go f.serve()
	t.Cleanup(func() {
		ln.Close()
		close(f.hung)
		f.wg.Wait()
	})
	return f
}

func (f *fakeSMTP) serve() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer c.Close()
			f.session(c)
		}()
	}
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func (f *fakeSMTP) session(c net.Conn) {
	if f.tls != nil {
		tc := tls.Server(c, f.tls)
		if err := tc.Handshake(); err != nil {
			return
		}
		f.mu.Lock()
		f.tlsConns++
		f.mu.Unlock()
		c = tc
	}
	r := bufio.NewReader(c)
	say := func(s string) bool { _, err := c.Write([]byte(s + "\r\n")); return err == nil }
	hang := func(cmd string) bool {
		if f.HangAt != cmd {
			return false
		}
		<-f.hung // until the test ends
		return true
	}
	f.mu.Lock()
	cutAt := f.cutAt
	f.mu.Unlock()
	if cutAt == "greeting" || !say("220 fake ESMTP") {
		return
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimRight(line, "\r\n")
		verb := strings.ToUpper(strings.SplitN(line, " ", 2)[0])
		f.mu.Lock()
		f.commands = append(f.commands, line)
		f.mu.Unlock()
		if hang(verb) || cutAt == verb {
			return
		}
		switch verb {
		case "EHLO":
			ext := f.Ext
			if ext == nil {
				ext = []string{"8BITMIME"}
			}
			lines := append([]string{"fake"}, ext...)
			for i, l := range lines {
				sep := "-"
				if i == len(lines)-1 {
					sep = " "
				}
				say("250" + sep + l)
			}
		case "HELO", "NOOP", "RSET":
			say("250 ok")
		case "AUTH":
			say(orDefault(f.Auth, "235 2.7.0 authenticated"))
		case "MAIL":
			say(orDefault(f.Mail, "250 ok"))
		case "RCPT":
			say(orDefault(f.Rcpt, "250 ok"))
		case "DATA":
			say("354 go ahead")
			var msg strings.Builder
			for n := 0; ; n++ {
				l, err := r.ReadString('\n')
				if err != nil || cutAt == "message" && n == 10 {
					return
				}
				if l == ".\r\n" {
					break
				}
				msg.WriteString(strings.TrimPrefix(l, ".")) // undo dot-stuffing
			}
			f.mu.Lock()
			f.messages = append(f.messages, msg.String())
			f.mu.Unlock()
			if f.DropAfterData || hang(".") {
				return
			}
			say(orDefault(f.EndOfData, "250 2.0.0 queued as 1"))
		case "QUIT":
			say("221 bye")
			return
		default:
			say("502 unknown command")
		}
	}
}

// CutAt makes the server close the connection without a reply: at
// "greeting" before the greeting, at a command ("EHLO", "MAIL", "RCPT",
// "DATA") once it is read, at "message" after reading the first lines of
// the message (the unread bytes make the close a reset, so the client's
// next write fails). It is set under the lock: at "greeting" the server
// reads it before anything synchronizes it with the test.
func (f *fakeSMTP) CutAt(stage string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cutAt = stage
}

func (f *fakeSMTP) Messages() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.messages...)
}

func (f *fakeSMTP) TLSConns() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tlsConns
}

func (f *fakeSMTP) Commands() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.commands...)
}
