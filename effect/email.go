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
	From string   // required: the author, and the envelope sender (MAIL FROM)
	To   []string // at least one of To, Cc and Bcc is required
	Cc   []string
	Bcc  []string
	// Subject may be non-ASCII (encoded as RFC 2047 Q-encoded words) and
	// of any length: header fields are folded at spaces, and a subject
	// with a word too long to fold is encoded too.
	Subject string
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
	// address as it is. Any other value is taken as text: folded at its
	// spaces; if ASCII, never encoded, since it may be structured
	// (List-Unsubscribe). A value with a word too long to fold into lines
	// of 998 characters (RFC 5322's limit) is refused as [ErrInvalid].
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
	var ferr error // the first field that cannot be folded
	write := func(name, value string, addr bool) {
		f, err := fold(name, value, addr)
		if err != nil && ferr == nil {
			ferr = err
		}
		b.WriteString(f)
	}
	field := func(name, value string) { write(name, value, false) }
	field("Date", now.Format(time.RFC1123Z))
	field("Message-ID", env.messageID)
	write("From", from.String(), true)
	if l := lists["To"]; len(l) > 0 {
		write("To", addressList(l), true)
	}
	if l := lists["Cc"]; len(l) > 0 {
		write("Cc", addressList(l), true)
	}
	if m.Subject != "" {
		// Subject is text: printable ASCII that cannot be folded (a word
		// of nearly 1,000 characters) is written as encoded words.
		f, err := fold("Subject", encodeText("Subject", m.Subject), false)
		if err != nil {
			f, err = fold("Subject", encodeWords(m.Subject, len("Subject: ")), false)
		}
		if err != nil && ferr == nil {
			ferr = err
		}
		b.WriteString(f)
	}
	for _, k := range names {
		if l, ok := extraLists[k]; ok {
			write(k, addressList(l), true)
		} else {
			// Not encoded when ASCII: it may be structured
			// (List-Unsubscribe), and must be folded as it is.
			write(k, encodeText(k, m.Headers[k]), false)
		}
	}
	if ferr != nil {
		return nil, invalid("%v", ferr)
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

// encodeText returns the value of the field name for the text s: s as
// it is if it is printable ASCII, or else as RFC 2047 Q-encoded words.
func encodeText(name, s string) string {
	if mime.QEncoding.Encode("utf-8", s) == s {
		return s
	}
	return encodeWords(s, len(name)+2)
}

// encodeWords returns s as RFC 2047 Q-encoded words, separated by spaces
// (where fold may break the line), each holding whole characters: the
// first fits a line of 76 characters after lead characters ("Subject: "),
// the others one after a space, as RFC 2047 asks of lines with encoded
// words. Unlike mime.QEncoding it encodes printable ASCII too, which makes
// text without spaces foldable.
func encodeWords(s string, lead int) string {
	const prefix, suffix = "=?utf-8?q?", "?="
	room := max(76-lead-len(prefix)-len(suffix), 12)
	var words []string
	var w, enc []byte
	var rb [utf8.UTFMax]byte
	for _, r := range s {
		enc = enc[:0]
		for _, c := range rb[:utf8.EncodeRune(rb[:], r)] {
			switch {
			case c == ' ':
				enc = append(enc, '_')
			case c > ' ' && c < 0x7f && c != '=' && c != '?' && c != '_':
				enc = append(enc, c)
			default:
				enc = fmt.Appendf(enc, "=%02X", c)
			}
		}
		if len(w)+len(enc) > room && len(w) > 0 {
			words = append(words, prefix+string(w)+suffix)
			w = w[:0]
			room = 75 - len(prefix) - len(suffix)
		}
		w = append(w, enc...)
	}
	if len(w) > 0 || len(words) == 0 {
		words = append(words, prefix+string(w)+suffix)
	}
	return strings.Join(words, " ")
}

// addressList writes addresses separated by commas, for fold to break.
func addressList(l []*mail.Address) string {
	parts := make([]string, len(l))
	for i, a := range l {
		parts[i] = a.String()
	}
	return strings.Join(parts, ", ")
}

// fold returns the header field "name: value" with its CRLF, folded
// (RFC 5322 2.2.3) so that its lines are at most 78 characters where
// possible. It breaks only at a single space between two other
// characters, which unfolding (CRLF removed, or CRLF and blanks made one
// space, as net/textproto does) gives back as it was; in an address field
// (addr) not within an angle-addr. A line that cannot be made at most
// 998 characters (RFC 5322's hard limit) is an error.
func fold(name, value string, addr bool) (string, error) {
	var segs []string
	start, angle, quoted := 0, false, false
	for i := 0; i < len(value); i++ {
		switch c := value[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case addr && !quoted && c == '<':
			angle = true
		case addr && !quoted && c == '>':
			angle = false
		case c == ' ' && !angle && i > start && i+1 < len(value) && !isBlank(value[i-1]) && !isBlank(value[i+1]):
			segs = append(segs, value[start:i])
			start = i + 1
		}
	}
	segs = append(segs, value[start:])
	var b strings.Builder
	b.WriteString(name + ":")
	n := len(name) + 1
	long := false
	for i, s := range segs {
		if i > 0 && n+1+len(s) > 78 {
			b.WriteString("\r\n")
			n = 0
		}
		b.WriteString(" " + s)
		n += 1 + len(s)
		long = long || n > 998
	}
	b.WriteString("\r\n")
	if long {
		return b.String(), fmt.Errorf("header %s: its value cannot be folded into lines of at most 998 characters (a word is too long)", name)
	}
	return b.String(), nil
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' }

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
