package effect

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/smtp"
	"net/textproto"
	"strings"
	"time"

	"github.com/idemkit/idem"
)

// STARTTLS says when [SMTP] switches the connection to TLS.
type STARTTLS int

const (
	// STARTTLSOpportunistic (the default) uses STARTTLS when the server
	// offers it and goes on in plain text when it does not. Credentials are
	// still never sent in plain text, whatever the mechanism, except to a
	// loopback server (localhost, 127.0.0.1 or ::1): a server that offers
	// no STARTTLS to an SMTP with auth fails the send, as [idem.NotDone],
	// before AUTH.
	STARTTLSOpportunistic STARTTLS = iota
	// STARTTLSRequired fails the send (as [idem.NotDone]) when the server
	// does not offer STARTTLS.
	STARTTLSRequired
	// STARTTLSOff never uses STARTTLS. With auth it works only with a
	// loopback server: credentials are not sent in plain text elsewhere.
	STARTTLSOff
)

// Defaults of an [SMTP].
const (
	DefaultDialTimeout = 30 * time.Second
	DefaultSMTPTimeout = 5 * time.Minute
	DefaultHelo        = "localhost"
)

// SMTP sends email to one SMTP server (a submission server, a relay, a
// provider's SMTP endpoint) so that an [idem.Ledger] can tell what a
// failure means. Make it with [NewSMTP]; it is safe for concurrent use and
// opens one connection per [SMTP.Send].
//
// # Amazon SES
//
// SES is reached through its SMTP interface, with no AWS SDK:
//
//	ses := effect.NewSMTP("email-smtp.eu-west-1.amazonaws.com:587",
//		effect.WithPlainAuth(smtpUser, smtpPassword), // SES SMTP credentials, not an access key
//		effect.WithSTARTTLS(effect.STARTTLSRequired))
//
// Port 465 of the same host takes implicit TLS instead, the default on
// that port ([WithImplicitTLS]).
//
// SES replaces the Message-ID header with its own (SES's header-fields
// documentation says so), and the id it assigns is known only from the
// reply to the message's end, which is exactly what is lost when the
// outcome is unknown. A Reconcile hook therefore cannot search SES by
// [MessageID]. What SES keeps is a message tag: set
// Headers["X-SES-MESSAGE-TAGS"] to "idem-key=" + [KeyToken](key) (tags
// take letters, digits, "-" and "_") together with an
// X-SES-CONFIGURATION-SET whose event destination records send events,
// and reconcile by looking the tag up in those events. (Checked against
// SES's documentation only; no SES account was used to test it.)
type SMTP struct {
	addr        string
	host        string
	auth        smtp.Auth
	user, pass  string
	starttls    STARTTLS
	implicitTLS bool
	tlsConfig   *tls.Config
	helo        string
	dialTimeout time.Duration
	timeout     time.Duration
	domain      string
	now         func() time.Time
}

// SMTPOption configures an [SMTP].
type SMTPOption func(*SMTP)

// WithPlainAuth authenticates with AUTH PLAIN (net/smtp's PlainAuth). Like
// net/smtp, it sends the credentials only over TLS or to a server whose
// host is localhost, 127.0.0.1 or ::1; otherwise the send fails as
// [idem.NotDone] before anything is sent. A server that does not offer AUTH
// fails the send as well.
func WithPlainAuth(username, password string) SMTPOption {
	return func(s *SMTP) { s.user, s.pass, s.auth = username, password, nil }
}

// WithAuth authenticates with any net/smtp mechanism (CRAM-MD5, or one of
// your own). It replaces [WithPlainAuth]. Whatever the mechanism, Send
// starts it only over TLS or with a loopback server (localhost, 127.0.0.1
// or ::1); otherwise the send fails as [idem.NotDone] before AUTH.
func WithAuth(a smtp.Auth) SMTPOption {
	return func(s *SMTP) { s.auth, s.user, s.pass = a, "", "" }
}

// WithSTARTTLS sets when to use STARTTLS (default [STARTTLSOpportunistic]).
func WithSTARTTLS(mode STARTTLS) SMTPOption { return func(s *SMTP) { s.starttls = mode } }

// WithImplicitTLS sets whether the connection is TLS from its first byte
// (implicit TLS, "SMTPS", RFC 8314), as submission servers expect on port
// 465: a plain-text client waits there for a greeting the server never
// sends until its TLS handshake comes. The default is on when the
// address's port is 465, as a number or as a service name that
// [net.LookupPort] resolves to 465 ("submissions", "smtps" in the usual
// services list), and off otherwise, a name that does not resolve
// included. With implicit TLS, STARTTLS is not used ([WithSTARTTLS] is
// ignored) and credentials go over TLS to any host. A failed handshake
// fails the send as [idem.NotDone], at [StageTLS].
func WithImplicitTLS(on bool) SMTPOption { return func(s *SMTP) { s.implicitTLS = on } }

// WithTLSConfig sets the TLS configuration for STARTTLS and implicit TLS
// (default: the system's roots, ServerName the address's host). A config
// without a ServerName gets the host.
func WithTLSConfig(cfg *tls.Config) SMTPOption { return func(s *SMTP) { s.tlsConfig = cfg } }

// WithHelo sets the name sent with EHLO or HELO (default "localhost", as
// net/smtp). Relays that check it want the sending host's name.
func WithHelo(name string) SMTPOption { return func(s *SMTP) { s.helo = name } }

// WithDialTimeout bounds the TCP connect (default [DefaultDialTimeout]).
// Non-positive values are ignored.
func WithDialTimeout(d time.Duration) SMTPOption {
	return func(s *SMTP) {
		if d > 0 {
			s.dialTimeout = d
		}
	}
}

// WithTimeout bounds a whole Send, connect to final reply (default
// [DefaultSMTPTimeout], 5 minutes; the context's deadline applies too).
// RFC 5321 lets a server take up to 10 minutes to answer the message's
// end, and a send cut short there has an unknown outcome, so do not make
// it short. Non-positive values are ignored.
func WithTimeout(d time.Duration) SMTPOption {
	return func(s *SMTP) {
		if d > 0 {
			s.timeout = d
		}
	}
}

// WithMessageIDDomain sets the domain of the Message-IDs Send writes
// (default: the domain of the message's From address).
func WithMessageIDDomain(domain string) SMTPOption { return func(s *SMTP) { s.domain = domain } }

// NewSMTP returns a sender to the SMTP server at addr ("host:port"). The
// defaults: implicit TLS on port 465 (or a service name for it, such as
// "submissions"), elsewhere STARTTLS when offered; no
// auth, EHLO localhost, 30 s to connect, 5 minutes for a whole send,
// Message-IDs in From's domain.
func NewSMTP(addr string, opts ...SMTPOption) *SMTP {
	s := &SMTP{addr: addr, helo: DefaultHelo, dialTimeout: DefaultDialTimeout, timeout: DefaultSMTPTimeout, now: time.Now}
	s.host = addr
	if h, port, err := net.SplitHostPort(addr); err == nil {
		s.host = h
		// The port may be a service name ("submissions", "smtps"): resolve
		// it, so that a name for 465 gets implicit TLS as 465 does. A name
		// that does not resolve leaves it off.
		if p, err := net.LookupPort("tcp", port); err == nil && p == 465 {
			s.implicitTLS = true
		}
	}
	for _, o := range opts {
		o(s)
	}
	if s.auth == nil && (s.user != "" || s.pass != "") {
		s.auth = smtp.PlainAuth("", s.user, s.pass, s.host)
	}
	return s
}

// Send sends m once as the operation key's message and returns its
// Message-ID (angle brackets included), [MessageID](key, domain) whatever
// the attempt. It is meant to run inside [idem.Ledger.Do]; the error says
// what the Ledger may conclude:
//
//   - nil: the server accepted the message (250 after its end).
//   - wrapped in [idem.NotDone]: the server cannot have kept the message.
//     The connection, TLS or AUTH failed, the server refused a command
//     before the message's end, or answered its end with 4xx, or ctx ended
//     before the end was written. Under [idem.AtMostOnce] the key is
//     released for a retry.
//   - also wrapped in [idem.Permanent]: a 5xx refusal of the message
//     (MAIL, RCPT, DATA or its end) or an invalid m ([ErrInvalid]). The
//     Ledger marks the key failed (it reads Permanent first); trying again
//     would be refused again. A 5xx to the greeting, EHLO, STARTTLS or AUTH
//     is about the connection or the credentials, not the message, and is
//     NotDone only.
//   - matching [ErrOutcomeUnknown] (and neither of the above): the whole
//     message was written and its reply was lost (the connection dropped,
//     ctx ended, a timeout passed). The server may have kept it. The
//     policy decides: under AtMostOnce the key is indeterminate, and a
//     Reconcile hook can search the mailbox or provider by the Message-ID.
//
// A refusal carries an [*SMTPError] with the reply code and stage. A
// recipient refused at RCPT aborts the whole send: nothing goes to the
// others either.
//
// Send dials with ctx, sets the connection's deadline to ctx's deadline or
// the [WithTimeout] bound, whichever is first, and closes the connection
// as soon as ctx ends, so it returns promptly; the error then also matches
// ctx.Err(). It does not retry.
func (s *SMTP) Send(ctx context.Context, key string, m Email) (string, error) {
	env, err := build(key, m, s.domain, s.now())
	if err != nil {
		return "", idem.Permanent(idem.NotDone(err))
	}
	if err := s.send(ctx, env); err != nil {
		return "", err
	}
	return env.messageID, nil
}

// notDone wraps an error of a stage before the message's end.
func (s *SMTP) notDone(ctx context.Context, stage string, err error) error {
	var tp *textproto.Error
	if errors.As(err, &tp) {
		se := &SMTPError{Code: tp.Code, Stage: stage, Msg: tp.Msg}
		switch stage {
		case StageMail, StageRcpt, StageData, StageEndOfData:
			if tp.Code >= 500 {
				return idem.Permanent(idem.NotDone(se))
			}
		}
		return idem.NotDone(se)
	}
	if ctx.Err() != nil {
		err = errors.Join(err, context.Cause(ctx))
	}
	return idem.NotDone(fmt.Errorf("effect: smtp %s (%s): %w", stage, s.addr, err))
}

func (s *SMTP) send(ctx context.Context, env *envelope) error {
	if err := ctx.Err(); err != nil {
		return idem.NotDone(fmt.Errorf("effect: smtp: not sent: %w", context.Cause(ctx)))
	}
	deadline := time.Now().Add(s.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	d := net.Dialer{Timeout: s.dialTimeout}
	conn, err := d.DialContext(dctx, "tcp", s.addr)
	if err != nil {
		return s.notDone(ctx, "connect", err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(deadline); err != nil {
		return s.notDone(ctx, "connect", err)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	if s.implicitTLS {
		tc := tls.Client(conn, s.tlsConfigFor())
		if err := tc.HandshakeContext(dctx); err != nil {
			return s.notDone(ctx, StageTLS, err)
		}
		conn = tc // net/smtp sees a *tls.Conn: the session counts as TLS (AUTH PLAIN allowed)
	}
	c, err := smtp.NewClient(conn, s.host)
	if err != nil {
		return s.notDone(ctx, StageGreeting, err)
	}
	defer c.Close()
	// quit ends the session politely after a refusal; its error is
	// irrelevant (the outcome is already known).
	quit := func() { _ = c.Quit() }
	if err := c.Hello(s.helo); err != nil {
		return s.notDone(ctx, StageHello, err)
	}
	// Noop runs EHLO (HELO if EHLO is refused) first and, unlike
	// Extension, reports its error.
	if err := c.Noop(); err != nil {
		return s.notDone(ctx, StageHello, err)
	}
	tlsOK, _ := c.Extension("STARTTLS")
	switch {
	case s.implicitTLS, s.starttls == STARTTLSOff:
	case tlsOK:
		if err := c.StartTLS(s.tlsConfigFor()); err != nil {
			return s.notDone(ctx, StageStartTLS, err)
		}
	case s.starttls == STARTTLSRequired:
		quit()
		return s.notDone(ctx, StageStartTLS, errors.New("the server does not offer STARTTLS, and WithSTARTTLS(STARTTLSRequired) is set"))
	}
	if s.auth != nil {
		// net/smtp's PlainAuth checks this itself; another mechanism (AUTH
		// LOGIN, the one most often added) may not.
		if _, isTLS := c.TLSConnectionState(); !isTLS && !loopback(s.host) {
			quit()
			return s.notDone(ctx, StageAuth, fmt.Errorf("credentials are not sent in plain text to %s, a host that is not loopback, and the connection is not TLS (the server offers no STARTTLS, or STARTTLSOff is set)", s.host))
		}
		if ok, _ := c.Extension("AUTH"); !ok {
			quit()
			return s.notDone(ctx, StageAuth, errors.New("the server does not offer AUTH"))
		}
		if err := c.Auth(s.auth); err != nil {
			quit()
			return s.notDone(ctx, StageAuth, err)
		}
	}
	// MAIL, RCPT, DATA and the message's end by hand: net/smtp's reader
	// takes a bare reply code (RFC 5321 allows "250" with no text) for a
	// broken reply, and at the message's end that is the difference
	// between "sent" and "outcome unknown"; its Data writer does not tell
	// a failed write of the message from a lost reply to its end.
	params := ""
	if ok, _ := c.Extension("8BITMIME"); ok {
		params += " BODY=8BITMIME"
	}
	if ok, _ := c.Extension("SMTPUTF8"); ok {
		params += " SMTPUTF8"
	}
	if err := s.expect(ctx, c.Text, StageMail, 2, quit, "MAIL FROM:<%s>%s", env.from, params); err != nil {
		return err
	}
	for _, r := range env.rcpt {
		if err := s.expect(ctx, c.Text, StageRcpt, 2, quit, "RCPT TO:<%s>", r); err != nil {
			return err
		}
	}
	if err := s.expect(ctx, c.Text, StageData, 3, quit, "DATA"); err != nil {
		return err
	}
	w := c.Text.DotWriter()
	if _, err := w.Write(env.data); err != nil {
		return s.notDone(ctx, StageData, err)
	}
	// Close writes the final "." and flushes. If it fails, the server has
	// not seen the end of the message and keeps nothing.
	if err := w.Close(); err != nil {
		return s.notDone(ctx, StageData, err)
	}
	code, msg, err := readReply(&c.Text.Reader)
	switch {
	case err == nil && code < 300:
		quit()
		return nil
	case err == nil && code >= 400:
		quit()
		return s.notDone(ctx, StageEndOfData, &textproto.Error{Code: code, Msg: msg})
	case err == nil:
		err = fmt.Errorf("unexpected reply %d %s", code, msg)
	}
	if ctx.Err() != nil {
		err = errors.Join(err, context.Cause(ctx))
	}
	return &unknownError{op: "smtp " + StageEndOfData + " (" + s.addr + ")",
		err: fmt.Errorf("the message was written and its reply was lost: %w", err)}
}

// tlsConfigFor returns the TLS configuration of a connection: the
// WithTLSConfig one (a copy) or the default, with the host as ServerName
// when it names none.
func (s *SMTP) tlsConfigFor() *tls.Config {
	if s.tlsConfig == nil {
		return &tls.Config{ServerName: s.host}
	}
	cfg := s.tlsConfig.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName = s.host
	}
	return cfg
}

// expect sends a command of the message's envelope and reads its reply,
// which must be of the class want (2 for 2xx, 3 for 3xx). A 4xx or 5xx
// is the server's refusal, and quit ends the session; anything else (an
// I/O error, an unreadable or unexpected reply) is a failure of stage.
// All are before the message's end, so NotDone.
func (s *SMTP) expect(ctx context.Context, text *textproto.Conn, stage string, want int, quit func(), format string, args ...any) error {
	line := fmt.Sprintf(format, args...)
	if strings.ContainsAny(line, "\r\n") {
		return s.notDone(ctx, stage, errors.New("a line break in the command"))
	}
	id, err := text.Cmd("%s", line)
	if err != nil {
		return s.notDone(ctx, stage, err)
	}
	text.StartResponse(id)
	code, msg, err := readReply(&text.Reader)
	text.EndResponse(id)
	switch {
	case err != nil:
		return s.notDone(ctx, stage, err)
	case code/100 == want:
		return nil
	case code >= 400:
		quit()
		return s.notDone(ctx, stage, &textproto.Error{Code: code, Msg: msg})
	}
	quit()
	return s.notDone(ctx, stage, fmt.Errorf("unexpected reply %d %s", code, msg))
}

// readReply reads one SMTP reply (RFC 5321 4.2): lines "ddd-text" and a
// last line "ddd text" or a bare "ddd", every line with the same code,
// whose first digit is 2 to 5. It returns the code and the lines' texts
// joined with "\n".
func readReply(r *textproto.Reader) (code int, msg string, err error) {
	var texts []string
	for {
		line, err := r.ReadLine()
		if err != nil {
			return 0, "", err
		}
		if len(line) < 3 || line[0] < '2' || line[0] > '5' || line[1] < '0' || line[1] > '9' || line[2] < '0' || line[2] > '9' ||
			len(line) > 3 && line[3] != ' ' && line[3] != '-' {
			return 0, "", textproto.ProtocolError("malformed reply: " + line)
		}
		c := int(line[0]-'0')*100 + int(line[1]-'0')*10 + int(line[2]-'0')
		if code != 0 && c != code {
			return 0, "", textproto.ProtocolError("reply codes differ in a multi-line reply: " + line)
		}
		code = c
		if len(line) > 4 {
			texts = append(texts, line[4:])
		}
		if len(line) == 3 || line[3] == ' ' {
			return code, strings.Join(texts, "\n"), nil
		}
	}
}

// loopback reports whether host is one net/smtp's PlainAuth sends
// credentials to without TLS.
func loopback(host string) bool {
	return host == "localhost" || host == "127.0.0.1" || host == "::1"
}
