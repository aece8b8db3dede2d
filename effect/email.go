package effect

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net/mail"
	"net/textproto"
	"sort"
	"strings"
	"time"
	"unicode/utf8"
)

// Email is one message to send with [SMTP.Send].
//
// Addresses are RFC 5322 addresses, with or without a display name
// ("Ana <ana@example.com>" or "ana@example.com"); a display name may be
// non-ASCII (it is encoded). Bcc recipients get the message but appear in
// no header. A quoted local part ("john doe"@example.com) is sent quoted
// in the envelope too; an address with a control character (a tab, CR,
// LF, NUL) is refused, as SMTP cannot carry it.
type Email struct {
	From    string   // required: the author, and the envelope sender (MAIL FROM)
	To      []string // at least one of To, Cc and Bcc is required
	Cc      []string
	Bcc     []string
	Subject string // may be non-ASCII (encoded as RFC 2047 Q-encoded words)
	Text    string // the plain-text body
	// HTML is an optional HTML body. With both Text and HTML the message is
	// multipart/alternative; with HTML alone it is text/html.
	HTML string
	// Headers are extra header fields (Reply-To, List-Unsubscribe,
	// X-SES-CONFIGURATION-SET...), written in the order of their names.
	// Values may be non-ASCII (encoded like Subject). They may not replace
	// the fields Send writes itself: From, To, Cc, Bcc, Subject, Date,
	// Message-ID, MIME-Version, Content-Type, Content-Transfer-Encoding.
	//
	// The value of an address field (Sender, Reply-To, Resent-From,
	// Resent-Sender, Resent-To, Resent-Cc, Resent-Bcc, Mail-Followup-To,
	// Mail-Reply-To, Disposition-Notification-To, Return-Receipt-To,
	// Errors-To) must be a comma-separated list of addresses, as for To;
	// they are written like To, a non-ASCII display name encoded and the
	// address as it is. Any other value is taken as text.
	Headers map[string]string
}

// KeyToken returns the operation key's token: the first 32 hex digits of
// the SHA-256 of key. It is what [MessageID] puts before the "@", and it
// suits places that take only letters and digits (an SES message tag, a
// provider's idempotency key of limited length).
func KeyToken(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16])
}

// MessageID returns the Message-ID that [SMTP.Send] writes for the
// operation key: "<" + KeyToken(key) + "@" + domain + ">". It is the same
// on every attempt, so a Reconcile hook can ask the mailbox or the provider
// whether a message with it went out. The domain is used as given; it
// should be one the sender controls.
func MessageID(key, domain string) string {
	return "<" + KeyToken(key) + "@" + domain + ">"
}

// reserved are the header fields Send writes itself.
var reserved = map[string]bool{
	"From": true, "To": true, "Cc": true, "Bcc": true, "Subject": true, "Date": true,
	"Message-Id": true, "Mime-Version": true, "Content-Type": true, "Content-Transfer-Encoding": true,
}

// addressFields are the extra header fields whose value is an address
// list (RFC 5322 3.6.2, 3.6.6; RFC 8098; common usage), by canonical name.
// In-Reply-To and References hold message ids, not addresses.
var addressFields = map[string]bool{
	"Sender": true, "Reply-To": true,
	"Resent-From": true, "Resent-Sender": true, "Resent-To": true, "Resent-Cc": true, "Resent-Bcc": true,
	"Mail-Followup-To": true, "Mail-Reply-To": true,
	"Disposition-Notification-To": true, "Return-Receipt-To": true, "Errors-To": true,
}

// envelope is an Email made ready to send: its envelope and its bytes.
type envelope struct {
	from      string   // MAIL FROM, as smtpPath writes it
	rcpt      []string // RCPT TO, as smtpPath writes them, in order, without duplicates
	messageID string
	data      []byte // the message, CRLF line endings, not dot-stuffed
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w email: "+format, append([]any{ErrInvalid}, a...)...)
}

// build checks m and writes it as an RFC 5322 message with the key's
// Message-ID. domain overrides the Message-ID's domain (default: From's).
func build(key string, m Email, domain string, now time.Time) (*envelope, error) {
	if key == "" {
		return nil, invalid("empty operation key")
	}
	from, err := mail.ParseAddress(m.From)
	if err != nil {
		return nil, invalid("From %q: %v", m.From, err)
	}
	if domain == "" {
		domain = from.Address[strings.LastIndexByte(from.Address, '@')+1:]
	}
	if !asciiDomain(domain) {
		return nil, invalid("Message-ID domain %q is not an ASCII domain name (set WithMessageIDDomain)", domain)
	}
	path, err := smtpPath(from.Address)
	if err != nil {
		return nil, invalid("From %q: %v", m.From, err)
	}
	env := &envelope{from: path, messageID: MessageID(key, domain)}
	seen := map[string]bool{}
	lists := make(map[string][]*mail.Address, 3)
	for _, f := range []struct {
		name string
		in   []string
	}{{"To", m.To}, {"Cc", m.Cc}, {"Bcc", m.Bcc}} {
		for _, s := range f.in {
			a, err := mail.ParseAddress(s)
			if err != nil {
				return nil, invalid("%s %q: %v", f.name, s, err)
			}
			path, err := smtpPath(a.Address)
			if err != nil {
				return nil, invalid("%s %q: %v", f.name, s, err)
			}
			lists[f.name] = append(lists[f.name], a)
			if !seen[path] {
				seen[path] = true
				env.rcpt = append(env.rcpt, path)
			}
		}
	}
	if len(env.rcpt) == 0 {
		return nil, invalid("no recipient (To, Cc and Bcc are empty)")
	}
	if hasBreak(m.Subject) {
		return nil, invalid("line break in Subject")
	}
	if !utf8.ValidString(m.Subject) || !utf8.ValidString(m.Text) || !utf8.ValidString(m.HTML) {
		return nil, invalid("Subject or body is not valid UTF-8")
	}
	names := make([]string, 0, len(m.Headers))
	extraLists := map[string][]*mail.Address{}
	for k, v := range m.Headers {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if k == "" || !validFieldName(k) {
			return nil, invalid("header name %q", k)
		}
		if reserved[ck] {
			return nil, invalid("header %s is written by Send; set it through Email's fields", ck)
		}
		if hasBreak(v) || !utf8.ValidString(v) {
			return nil, invalid("header %s: a line break or invalid UTF-8 in its value", ck)
		}
		if addressFields[ck] {
			l, err := mail.ParseAddressList(v)
			if err != nil {
				return nil, invalid("header %s %q: not an address list: %v", ck, v, err)
			}
			extraLists[k] = l
		}
		names = append(names, k)
	}
	sort.Strings(names)

	var b bytes.Buffer
	field := func(name, value string) { b.WriteString(name + ": " + value + "\r\n") }
	field("Date", now.Format(time.RFC1123Z))
	field("Message-ID", env.messageID)
	field("From", from.String())
	if l := lists["To"]; len(l) > 0 {
		field("To", addressList(l))
	}
	if l := lists["Cc"]; len(l) > 0 {
		field("Cc", addressList(l))
	}
	if m.Subject != "" {
		field("Subject", encodeText(m.Subject))
	}
	for _, k := range names {
		if l, ok := extraLists[k]; ok {
			field(k, addressList(l))
		} else {
			field(k, encodeText(m.Headers[k]))
		}
	}
	field("MIME-Version", "1.0")
	switch {
	case m.HTML != "" && m.Text != "":
		mw := multipart.NewWriter(&b)
		field("Content-Type", mime.FormatMediaType("multipart/alternative", map[string]string{"boundary": mw.Boundary()}))
		b.WriteString("\r\n")
		for _, p := range []struct{ ct, body string }{{"text/plain", m.Text}, {"text/html", m.HTML}} {
			w, err := mw.CreatePart(textproto.MIMEHeader{
				"Content-Type":              {p.ct + "; charset=utf-8"},
				"Content-Transfer-Encoding": {"quoted-printable"},
			})
			if err != nil {
				return nil, err
			}
			if err := writeQP(w, p.body); err != nil {
				return nil, err
			}
		}
		if err := mw.Close(); err != nil {
			return nil, err
		}
	default:
		ct, body := "text/plain", m.Text
		if m.HTML != "" {
			ct, body = "text/html", m.HTML
		}
		field("Content-Type", ct+"; charset=utf-8")
		field("Content-Transfer-Encoding", "quoted-printable")
		b.WriteString("\r\n")
		if err := writeQP(&b, body); err != nil {
			return nil, err
		}
	}
	env.data = b.Bytes()
	return env, nil
}

// writeQP writes body quoted-printable with CRLF line endings, ending in a
// line break.
func writeQP(w io.Writer, body string) error {
	body = strings.ReplaceAll(body, "\r\n", "\n")
	if body != "" && !strings.HasSuffix(body, "\n") {
		body += "\n"
	}
	qp := quotedprintable.NewWriter(w)
	if _, err := io.WriteString(qp, body); err != nil {
		return err
	}
	return qp.Close()
}

// encodeText returns s as it is if it is printable ASCII, or else as
// RFC 2047 Q-encoded words, folded onto continuation lines.
func encodeText(s string) string {
	e := mime.QEncoding.Encode("utf-8", s)
	if e == s {
		return s
	}
	return strings.ReplaceAll(e, " =?utf-8?q?", "\r\n =?utf-8?q?")
}

// addressList writes addresses separated by commas, one per line after the
// first when they do not fit on one.
func addressList(l []*mail.Address) string {
	parts := make([]string, len(l))
	n := 0
	for i, a := range l {
		parts[i] = a.String()
		n += len(parts[i]) + 2
	}
	if n <= 70 {
		return strings.Join(parts, ", ")
	}
	return strings.Join(parts, ",\r\n ")
}

// smtpPath returns addr, an address as net/mail gives it (its local part
// unquoted), as MAIL FROM and RCPT TO take it (RFC 5321 4.1.2): the local
// part as it is if it is a dot-string, else as a quoted string with "\"
// and the quote escaped. A control character (CR, LF, NUL, tab...) cannot
// be sent in either: such an address is an error.
func smtpPath(addr string) (string, error) {
	for i := 0; i < len(addr); i++ {
		if c := addr[i]; c < ' ' || c == 0x7f {
			return "", fmt.Errorf("a control character (%q) in the address", c)
		}
	}
	at := strings.LastIndexByte(addr, '@')
	if at < 0 {
		return "", fmt.Errorf("no @ in the address")
	}
	local, domain := addr[:at], addr[at+1:]
	if strings.ContainsAny(domain, " <>\"\\") {
		return "", fmt.Errorf("domain %q cannot be sent", domain)
	}
	if dotString(local) {
		return addr, nil
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(local) + `"@` + domain, nil
}

// dotString reports whether s is an RFC 5321 Dot-string: atoms (atext,
// or UTF-8 beyond ASCII as RFC 6531 allows) joined by single dots.
func dotString(s string) bool {
	if s == "" || s[0] == '.' || s[len(s)-1] == '.' || strings.Contains(s, "..") {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x80 || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte(".!#$%&'*+-/=?^_`{|}~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

func hasBreak(s string) bool { return strings.ContainsAny(s, "\r\n") }

func validFieldName(k string) bool {
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c > '~' || c == ':' {
			return false
		}
	}
	return true
}

func asciiDomain(d string) bool {
	if d == "" || len(d) > 253 {
		return false
	}
	for i := 0; i < len(d); i++ {
		c := d[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}
