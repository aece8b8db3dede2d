package effect_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/smtp"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/effect"
)

func receipt() effect.Email {
	return effect.Email{
		From:    "Shop <receipts@shop.example>",
		To:      []string{"user7@example.com"},
		Subject: "Your receipt for order 8891",
		Text:    "Thanks for your order.",
	}
}

// class is what an error from Send tells an idem.Ledger.
type class struct{ notDone, permanent, unknown bool }

func classify(err error) class {
	var nd *idem.NotDoneError
	var pe *idem.PermanentError
	return class{errors.As(err, &nd), errors.As(err, &pe), errors.Is(err, effect.ErrOutcomeUnknown)}
}

func wantClass(t *testing.T, err error, want class) {
	t.Helper()
	if err == nil {
		t.Fatalf("Send succeeded; want an error of class %+v", want)
	}
	if got := classify(err); got != want {
		t.Fatalf("error %q is %+v, want %+v", err, got, want)
	}
}

func wantSMTPError(t *testing.T, err error, code int, stage string) {
	t.Helper()
	var se *effect.SMTPError
	if !errors.As(err, &se) || se.Code != code || se.Stage != stage {
		t.Fatalf("error %q: want an *SMTPError %d at %q, got %+v", err, code, stage, se)
	}
}

var (
	notDone   = class{notDone: true}
	rejected  = class{notDone: true, permanent: true}
	ambiguous = class{unknown: true}
)

func TestSMTPSendAccepted(t *testing.T) {
	f := newFakeSMTP(t, "")
	m := receipt()
	m.Text = "Thanks.\n.a line that starts with a dot\n"
	id, err := effect.NewSMTP(f.Addr).Send(context.Background(), "receipt:8891:7", m)
	if err != nil {
		t.Fatal(err)
	}
	if want := effect.MessageID("receipt:8891:7", "shop.example"); id != want {
		t.Fatalf("message id %q, want %q", id, want)
	}
	msgs := f.Messages()
	if len(msgs) != 1 || !strings.Contains(msgs[0], "Message-ID: "+id+"\r\n") {
		t.Fatalf("server got %q, want one message with Message-ID %s", msgs, id)
	}
	// The fake strips one leading dot from each line: the line arrives
	// whole only if the client doubled it.
	if !strings.Contains(msgs[0], "\r\n.a line that starts with a dot\r\n") {
		t.Fatalf("the dotted line was not dot-stuffed:\n%s", msgs[0])
	}
	if cmds := f.Commands(); cmds[len(cmds)-1] != "QUIT" {
		t.Fatalf("the session ended with %q, want QUIT", cmds[len(cmds)-1])
	}
}

// Nothing listens: nothing can have been sent, so the key may be retried.
func TestSMTPConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, err = effect.NewSMTP(addr).Send(context.Background(), "k", receipt())
	wantClass(t, err, notDone)
}

// A recipient refused with 550: nothing is sent, and trying again cannot
// help, so the error is both NotDone and Permanent.
func TestSMTPRcpt550(t *testing.T) {
	f := newFakeSMTP(t, "")
	f.Rcpt = "550 5.1.1 no such user"
	_, err := effect.NewSMTP(f.Addr).Send(context.Background(), "k", receipt())
	wantClass(t, err, rejected)
	wantSMTPError(t, err, 550, effect.StageRcpt)
	if len(f.Messages()) != 0 {
		t.Fatal("a message reached the server after RCPT was refused")
	}
	for _, c := range f.Commands() {
		if c == "DATA" {
			t.Fatal("DATA was sent after RCPT was refused")
		}
	}
}

// A 4xx before the message: NotDone, not Permanent.
func TestSMTPMail451(t *testing.T) {
	f := newFakeSMTP(t, "")
	f.Mail = "451 4.3.0 try again later"
	_, err := effect.NewSMTP(f.Addr).Send(context.Background(), "k", receipt())
	wantClass(t, err, notDone)
	wantSMTPError(t, err, 451, effect.StageMail)
	var se *effect.SMTPError
	if errors.As(err, &se); !se.Temporary() {
		t.Fatal("a 451 is not Temporary")
	}
}

// The server read the whole message and refused it: a 4xx means it kept
// nothing (NotDone), a 5xx also that it never will (Permanent).
func TestSMTPEndOfDataRefused(t *testing.T) {
	for _, tc := range []struct {
		reply string
		code  int
		want  class
	}{
		{"451 4.7.1 greylisted", 451, notDone},
		{"554 5.7.1 rejected as spam", 554, rejected},
	} {
		t.Run(tc.reply[:3], func(t *testing.T) {
			f := newFakeSMTP(t, "")
			f.EndOfData = tc.reply
			_, err := effect.NewSMTP(f.Addr).Send(context.Background(), "k", receipt())
			wantClass(t, err, tc.want)
			wantSMTPError(t, err, tc.code, effect.StageEndOfData)
		})
	}
}

// RFC 5321 4.2: the text after a reply code is optional, and a reply may
// span lines. A bare "250" to the message's end accepts it, a bare 451
// or 554 refuses it; so at MAIL and RCPT. A reply that is no reply
// at all to the message's end leaves the outcome unknown. net/textproto,
// and so go-smtp, read a bare code as a broken reply: this test is why
// Send reads these replies itself (the package doc says more).
func TestSMTPBareAndMultilineReplies(t *testing.T) {
	for _, tc := range []struct {
		name              string
		mail, rcpt, final string
		code              int
		stage             string
		want              class
	}{
		{name: "bare 250", final: "250"},
		{name: "multi-line 250", final: "250-queued\r\n250-as\r\n250 1"},
		{name: "bare 451", final: "451", code: 451, stage: effect.StageEndOfData, want: notDone},
		{name: "bare 554", final: "554", code: 554, stage: effect.StageEndOfData, want: rejected},
		{name: "multi-line 554", final: "554-5.7.1 rejected\r\n554 5.7.1 as spam", code: 554, stage: effect.StageEndOfData, want: rejected},
		{name: "bare 451 to MAIL", mail: "451", code: 451, stage: effect.StageMail, want: notDone},
		{name: "bare 550 to RCPT", rcpt: "550", code: 550, stage: effect.StageRcpt, want: rejected},
		{name: "garbage to the end", final: "25", want: ambiguous},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeSMTP(t, "")
			f.Mail, f.Rcpt, f.EndOfData = tc.mail, tc.rcpt, tc.final
			_, err := effect.NewSMTP(f.Addr).Send(context.Background(), "k", receipt())
			if tc.want == (class{}) {
				if err != nil {
					t.Fatalf("the server accepted the message; Send says %+v: %v", classify(err), err)
				}
				return
			}
			wantClass(t, err, tc.want)
			if tc.code != 0 {
				wantSMTPError(t, err, tc.code, tc.stage)
			}
		})
	}
}

// The server read the whole message and dropped the connection before
// answering: it may have kept the message. The error is neither NotDone
// nor Permanent; the Ledger's policy decides.
func TestSMTPReplyLostAfterData(t *testing.T) {
	f := newFakeSMTP(t, "")
	f.DropAfterData = true
	_, err := effect.NewSMTP(f.Addr).Send(context.Background(), "k", receipt())
	wantClass(t, err, ambiguous)
	if len(f.Messages()) != 1 {
		t.Fatalf("the server got %d messages, want 1", len(f.Messages()))
	}
}

// A connection cut at any stage before the message's end was written:
// the server cannot have kept the message, so NotDone (and not
// Permanent: there was no refusal). Cut after the message's end it is
// TestSMTPReplyLostAfterData.
func TestSMTPCutBeforeEndOfData(t *testing.T) {
	for _, stage := range []string{"greeting", "EHLO", "MAIL", "RCPT", "DATA", "message"} {
		t.Run(stage, func(t *testing.T) {
			f := newFakeSMTP(t, "")
			f.CutAt(stage)
			m := receipt()
			if stage == "message" {
				// 9 MiB, over twice the most Linux buffers for a
				// sender (tcp_wmem, 4 MiB) while its reader reads
				// nothing: the client is still writing when the reset
				// comes. (A message that fits the buffers is written
				// in full before the reset, and the reply's loss then
				// leaves the outcome unknown, as it should.)
				m.Text = strings.Repeat("A line of the receipt, one of many.\n", 1<<18)
			}
			_, err := effect.NewSMTP(f.Addr, effect.WithTimeout(10*time.Second)).Send(context.Background(), "k", m)
			wantClass(t, err, notDone)
			if n := len(f.Messages()); n != 0 {
				t.Fatalf("the server kept %d messages", n)
			}
		})
	}
}

// A context cancelled mid-conversation ends Send promptly. Before the
// message's end nothing was sent (NotDone); after it, the outcome is
// unknown. Either way the error matches context.Canceled.
func TestSMTPContextCancelled(t *testing.T) {
	for _, tc := range []struct {
		hangAt string
		want   class
	}{
		{"RCPT", notDone},
		{".", ambiguous},
	} {
		t.Run("hang at "+tc.hangAt, func(t *testing.T) {
			f := newFakeSMTP(t, "")
			f.HangAt = tc.hangAt
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(100*time.Millisecond, cancel)
			start := time.Now()
			_, err := effect.NewSMTP(f.Addr).Send(ctx, "k", receipt())
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("Send returned %v after the cancel", d)
			}
			wantClass(t, err, tc.want)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("error %q does not match context.Canceled", err)
			}
		})
	}
}

// WithTimeout bounds a server that never answers the message's end.
func TestSMTPTimeoutAfterData(t *testing.T) {
	f := newFakeSMTP(t, "")
	f.HangAt = "."
	start := time.Now()
	_, err := effect.NewSMTP(f.Addr, effect.WithTimeout(200*time.Millisecond)).Send(context.Background(), "k", receipt())
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Send returned after %v", d)
	}
	wantClass(t, err, ambiguous)
}

// STARTTLSRequired against a server without STARTTLS: nothing is sent.
func TestSMTPStartTLSRequired(t *testing.T) {
	f := newFakeSMTP(t, "")
	_, err := effect.NewSMTP(f.Addr, effect.WithSTARTTLS(effect.STARTTLSRequired)).Send(context.Background(), "k", receipt())
	wantClass(t, err, notDone)
	for _, c := range f.Commands() {
		if strings.HasPrefix(c, "MAIL") {
			t.Fatal("MAIL was sent without the required TLS")
		}
	}
}

// WithImplicitTLS: TLS from the first byte (port 465). The session is TLS
// for net/smtp too, STARTTLS is not sent even when offered, and the
// message goes through.
func TestSMTPImplicitTLS(t *testing.T) {
	f, pool := newFakeSMTPS(t)
	f.Ext = []string{"8BITMIME", "STARTTLS", "AUTH PLAIN"}
	s := effect.NewSMTP(f.Addr, effect.WithImplicitTLS(true), effect.WithTLSConfig(&tls.Config{RootCAs: pool}),
		effect.WithPlainAuth("u", "p"), effect.WithSTARTTLS(effect.STARTTLSRequired))
	if _, err := s.Send(context.Background(), "receipt:8891:7", receipt()); err != nil {
		t.Fatal(err)
	}
	if n := f.TLSConns(); n != 1 {
		t.Errorf("%d TLS connections, want 1", n)
	}
	if len(f.Messages()) != 1 {
		t.Errorf("%d messages, want 1", len(f.Messages()))
	}
	for _, c := range f.Commands() {
		if strings.HasPrefix(c, "STARTTLS") {
			t.Error("STARTTLS sent on an implicit-TLS connection")
		}
	}
}

// A certificate the client does not trust fails the send before anything
// is said: NotDone, at StageTLS.
func TestSMTPImplicitTLSUntrusted(t *testing.T) {
	f, _ := newFakeSMTPS(t)
	_, err := effect.NewSMTP(f.Addr, effect.WithImplicitTLS(true)).Send(context.Background(), "k", receipt())
	wantClass(t, err, notDone)
	if !strings.Contains(err.Error(), "smtp "+effect.StageTLS) {
		t.Errorf("error %q does not name the TLS stage", err)
	}
	if c := f.Commands(); len(c) != 0 {
		t.Errorf("commands reached the server: %q", c)
	}
}

// Without WithImplicitTLS, a server on a port other than 465 is spoken to
// in plain text; a plain-text client to an implicit-TLS server fails
// without a false success.
func TestSMTPImplicitTLSDefaultOff(t *testing.T) {
	f, _ := newFakeSMTPS(t)
	_, err := effect.NewSMTP(f.Addr, effect.WithTimeout(300*time.Millisecond)).Send(context.Background(), "k", receipt())
	wantClass(t, err, notDone)
	if n := len(f.Messages()); n != 0 {
		t.Errorf("%d messages, want none", n)
	}
}

// Port 465 defaults to implicit TLS.
func TestSMTPImplicitTLSOnPort465(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:465")
	if err != nil {
		t.Skipf("cannot listen on 127.0.0.1:465 (needs the privilege to bind a port below 1024): %v", err)
	}
	handshake := make(chan bool, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		// A TLS client speaks first (its ClientHello: a handshake record,
		// byte 0x16); a plain-text one waits for the greeting.
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		b := make([]byte, 1)
		_, err = c.Read(b)
		handshake <- err == nil && b[0] == 0x16
	}()
	defer ln.Close()
	_, err = effect.NewSMTP("127.0.0.1:465", effect.WithTimeout(3*time.Second)).Send(context.Background(), "k", receipt())
	if !<-handshake {
		t.Error("the client to port 465 did not start with a TLS handshake")
	}
	wantClass(t, err, notDone)
}

// A service name for port 465 ("submissions", "smtps" in /etc/services)
// takes implicit TLS too: the port is resolved, not compared as text.
func TestSMTPImplicitTLSOnServiceName(t *testing.T) {
	for _, name := range []string{"submissions", "smtps"} {
		t.Run(name, func(t *testing.T) {
			if p, err := net.LookupPort("tcp", name); err != nil || p != 465 {
				t.Skipf("%q does not resolve to 465 here (%d, %v)", name, p, err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:465")
			if err != nil {
				t.Skipf("cannot listen on 127.0.0.1:465 (needs the privilege to bind a port below 1024): %v", err)
			}
			defer ln.Close()
			handshake := make(chan bool, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					handshake <- false
					return
				}
				defer c.Close()
				c.SetReadDeadline(time.Now().Add(2 * time.Second))
				b := make([]byte, 1)
				_, err = c.Read(b)
				handshake <- err == nil && b[0] == 0x16
			}()
			_, err = effect.NewSMTP("127.0.0.1:"+name, effect.WithTimeout(3*time.Second)).Send(context.Background(), "k", receipt())
			if !<-handshake {
				t.Errorf("the client to 127.0.0.1:%s did not start with a TLS handshake", name)
			}
			wantClass(t, err, notDone)
		})
	}
}

// Credentials go in plain text only to a loopback host (as net/smtp);
// a wrong password is NotDone, not Permanent: it is not about the message.
func TestSMTPAuth(t *testing.T) {
	f := newFakeSMTP(t, "")
	f.Ext = []string{"AUTH PLAIN"}
	if _, err := effect.NewSMTP(f.Addr, effect.WithPlainAuth("u", "p")).Send(context.Background(), "k", receipt()); err != nil {
		t.Fatalf("AUTH PLAIN to 127.0.0.1: %v", err)
	}
	f.Auth = "535 5.7.8 bad credentials"
	_, err := effect.NewSMTP(f.Addr, effect.WithPlainAuth("u", "bad")).Send(context.Background(), "k", receipt())
	wantClass(t, err, notDone)
	wantSMTPError(t, err, 535, effect.StageAuth)

	// Without AUTH on offer, a sender with credentials sends nothing.
	g := newFakeSMTP(t, "")
	_, err = effect.NewSMTP(g.Addr, effect.WithPlainAuth("u", "p")).Send(context.Background(), "k", receipt())
	wantClass(t, err, notDone)

	// 127.0.0.2 is loopback on Linux, but not a name net/smtp trusts
	// without TLS: the credentials are not sent.
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Logf("no 127.0.0.2 here (%v); the plain-text refusal is not checked", err)
		return
	}
	ln.Close()
	h := newFakeSMTP(t, "127.0.0.2:0")
	h.Ext = []string{"AUTH PLAIN"}
	_, err = effect.NewSMTP(h.Addr, effect.WithPlainAuth("u", "p")).Send(context.Background(), "k", receipt())
	wantClass(t, err, notDone)
	for _, c := range h.Commands() {
		if strings.HasPrefix(c, "AUTH") {
			t.Fatal("credentials were sent over plain text to a non-loopback name")
		}
	}
}

// loginAuth is AUTH LOGIN, a mechanism net/smtp lacks, as WithAuth takes
// one: unlike net/smtp's PlainAuth it has no plain-text check of its own.
type loginAuth struct{ user, pass string }

func (a loginAuth) Start(*smtp.ServerInfo) (string, []byte, error) { return "LOGIN", nil, nil }
func (a loginAuth) Next(from []byte, more bool) ([]byte, error) {
	if !more {
		return nil, nil
	}
	if strings.HasPrefix(strings.ToLower(string(from)), "user") {
		return []byte(a.user), nil
	}
	return []byte(a.pass), nil
}

// nonLoopbackIP returns an IPv4 address of this machine that is not
// loopback, or skips the test.
func nonLoopbackIP(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Skip(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	t.Skip("no non-loopback IPv4 address here")
	return ""
}

// Whatever the mechanism, credentials are not sent in plain text to a
// server that is not loopback: without STARTTLS on offer (or with
// STARTTLSOff) the send fails before AUTH, as NotDone. To a loopback
// server they are.
func TestSMTPAuthNeverInPlainText(t *testing.T) {
	f := newFakeSMTP(t, nonLoopbackIP(t)+":0")
	f.Ext = []string{"8BITMIME", "AUTH LOGIN"} // no STARTTLS
	for _, mode := range []effect.STARTTLS{effect.STARTTLSOpportunistic, effect.STARTTLSOff} {
		_, err := effect.NewSMTP(f.Addr, effect.WithAuth(loginAuth{"ana", "s3cret"}), effect.WithSTARTTLS(mode)).
			Send(context.Background(), "k", receipt())
		wantClass(t, err, notDone)
		if !strings.Contains(err.Error(), "smtp auth") || !strings.Contains(err.Error(), "TLS") {
			t.Fatalf("error %q does not say why", err)
		}
	}
	for _, c := range f.Commands() {
		if strings.HasPrefix(c, "AUTH") || strings.HasPrefix(c, "MAIL") {
			t.Fatalf("%q sent over plain text to %s", c, f.Addr)
		}
	}
	g := newFakeSMTP(t, "")
	g.Ext = []string{"AUTH LOGIN"}
	if _, err := effect.NewSMTP(g.Addr, effect.WithAuth(loginAuth{"ana", "s3cret"})).Send(context.Background(), "k", receipt()); err != nil {
		t.Fatalf("AUTH LOGIN to 127.0.0.1: %v", err)
	}
}

// A quoted local part keeps its quotes in MAIL FROM and RCPT TO (RFC 5321
// Quoted-string), backslash and quote escaped: a ">" inside the quotes
// ends no path and adds no parameter.
func TestSMTPQuotedLocalPart(t *testing.T) {
	f := newFakeSMTP(t, "")
	m := receipt()
	m.From = `Shop <"shop bot"@shop.example>`
	m.To = []string{`"x> NOTIFY=NEVER"@example.com`}
	m.Cc = []string{`"john doe"@example.com`, "john.doe@example.com"}
	m.Bcc = []string{`"a\"b\\c"@example.com`, `"plain"@example.com`}
	if _, err := effect.NewSMTP(f.Addr).Send(context.Background(), "k", m); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range f.Commands() {
		if strings.HasPrefix(c, "MAIL") || strings.HasPrefix(c, "RCPT") {
			got = append(got, c)
		}
	}
	want := []string{
		`MAIL FROM:<"shop bot"@shop.example> BODY=8BITMIME`,
		`RCPT TO:<"x> NOTIFY=NEVER"@example.com>`,
		`RCPT TO:<"john doe"@example.com>`,
		`RCPT TO:<john.doe@example.com>`,
		`RCPT TO:<"a\"b\\c"@example.com>`,
		`RCPT TO:<plain@example.com>`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("envelope\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// An invalid email is refused before any connection: NotDone and Permanent.
func TestSMTPInvalidEmail(t *testing.T) {
	f := newFakeSMTP(t, "")
	s := effect.NewSMTP(f.Addr)
	for name, m := range map[string]effect.Email{
		"no recipient":        {From: "a@example.com"},
		"bad From":            {From: "not an address", To: []string{"b@example.com"}},
		"Subject injection":   {From: "a@example.com", To: []string{"b@example.com"}, Subject: "hi\r\nBcc: x@example.com"},
		"header injection":    {From: "a@example.com", To: []string{"b@example.com"}, Headers: map[string]string{"X-A": "1\nBcc: x@example.com"}},
		"reserved header":     {From: "a@example.com", To: []string{"b@example.com"}, Headers: map[string]string{"message-id": "<x@y>"}},
		"non-ASCII domain":    {From: "a@exämple.com", To: []string{"b@example.com"}},
		"bad recipient list":  {From: "a@example.com", To: []string{"b@example.com", "nope"}},
		"tab in a local part": {From: "a@example.com", To: []string{"\"b\tc\"@example.com"}},
		"unfoldable header": {From: "a@example.com", To: []string{"b@example.com"},
			Headers: map[string]string{"List-Unsubscribe": "<https://shop.example/u?t=" + strings.Repeat("a", 1100) + ">"}},
	} {
		_, err := s.Send(context.Background(), "k", m)
		if !errors.Is(err, effect.ErrInvalid) {
			t.Errorf("%s: error %v, want ErrInvalid", name, err)
			continue
		}
		if got := classify(err); got != rejected {
			t.Errorf("%s: class %+v, want %+v", name, got, rejected)
		}
	}
	if len(f.Commands()) != 0 {
		t.Fatalf("invalid emails reached the server: %q", f.Commands())
	}
}
