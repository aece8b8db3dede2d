package effect

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net/mail"
	"regexp"
	"strings"
	"testing"
	"time"
)

var when = time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)

func parse(t *testing.T, m Email) (*envelope, *mail.Message) {
	t.Helper()
	env, err := build("receipt:8891:7", m, "", when)
	if err != nil {
		t.Fatal(err)
	}
	if s := strings.ReplaceAll(string(env.data), "\r\n", ""); strings.ContainsAny(s, "\r\n") {
		t.Fatalf("a bare CR or LF in the message:\n%q", env.data)
	}
	for _, l := range strings.Split(string(env.data), "\r\n") {
		if len(l) > 998 {
			t.Fatalf("a line of %d bytes", len(l))
		}
	}
	msg, err := mail.ReadMessage(strings.NewReader(string(env.data)))
	if err != nil {
		t.Fatal(err)
	}
	return env, msg
}

func decodeQP(t *testing.T, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(quotedprintable.NewReader(r))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestMessageIDIsTheKeys(t *testing.T) {
	id := MessageID("receipt:8891:7", "shop.example")
	if !regexp.MustCompile(`^<[0-9a-f]{32}@shop\.example>$`).MatchString(id) {
		t.Fatalf("MessageID = %q", id)
	}
	if id != MessageID("receipt:8891:7", "shop.example") || id == MessageID("receipt:8891:8", "shop.example") {
		t.Fatal("MessageID is not a function of the key")
	}
	env, err := build("receipt:8891:7", Email{From: "a@b.example", To: []string{"c@d.example"}}, "mail.shop.example", when)
	if err != nil || env.messageID != MessageID("receipt:8891:7", "mail.shop.example") {
		t.Fatalf("with a domain: %v, %v", env, err)
	}
}

func TestMessageHeaders(t *testing.T) {
	env, msg := parse(t, Email{
		From:    "Boutique Élise <receipts@shop.example>",
		To:      []string{"zoe@example.com", "Ana <ana@example.com>"},
		Bcc:     []string{"audit@example.com", "zoe@example.com"},
		Subject: "Reçu n° 8891 — " + strings.Repeat("merci ✓ ", 20),
		Text:    "Total : 12,50 €",
		Headers: map[string]string{"X-B": "2", "x-a": "1"},
	})
	h := msg.Header
	if h.Get("Message-Id") != MessageID("receipt:8891:7", "shop.example") || h.Get("Mime-Version") != "1.0" ||
		h.Get("Date") != "Tue, 01 Dec 2026 09:30:00 +0000" || h.Get("Bcc") != "" || h.Get("X-A") != "1" {
		t.Fatalf("header: %v", h)
	}
	subj, err := new(mime.WordDecoder).DecodeHeader(h.Get("Subject"))
	if err != nil || subj != "Reçu n° 8891 — "+strings.Repeat("merci ✓ ", 20) {
		t.Fatalf("subject %q (%v)", subj, err)
	}
	from, err := mail.ParseAddress(h.Get("From"))
	if err != nil || from.Name != "Boutique Élise" {
		t.Fatalf("From %q: %v %v", h.Get("From"), from, err)
	}
	if to, err := h.AddressList("To"); err != nil || len(to) != 2 {
		t.Fatalf("To: %v %v", to, err)
	}
	if want := []string{"zoe@example.com", "ana@example.com", "audit@example.com"}; strings.Join(env.rcpt, " ") != strings.Join(want, " ") {
		t.Fatalf("recipients %q, want %q (each once)", env.rcpt, want)
	}
	if ct := h.Get("Content-Type"); ct != "text/plain; charset=utf-8" || h.Get("Content-Transfer-Encoding") != "quoted-printable" {
		t.Fatalf("Content-Type %q", ct)
	}
	if body := decodeQP(t, msg.Body); body != "Total : 12,50 €\r\n" {
		t.Fatalf("body %q", body)
	}
}

func TestMessageAlternative(t *testing.T) {
	_, msg := parse(t, Email{From: "a@shop.example", To: []string{"b@example.com"},
		Text: "plain ✓\n.dot\n", HTML: "<p>html ✓</p>"})
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/alternative" {
		t.Fatalf("Content-Type %q", msg.Header.Get("Content-Type"))
	}
	r := multipart.NewReader(msg.Body, params["boundary"])
	for _, want := range []struct{ ct, body string }{{"text/plain; charset=utf-8", "plain ✓\r\n.dot\r\n"}, {"text/html; charset=utf-8", "<p>html ✓</p>\r\n"}} {
		p, err := r.NextRawPart()
		if err != nil {
			t.Fatal(err)
		}
		if p.Header.Get("Content-Type") != want.ct {
			t.Fatalf("part %q", p.Header.Get("Content-Type"))
		}
		if got := decodeQP(t, p); got != want.body {
			t.Fatalf("part body %q, want %q", got, want.body)
		}
	}
	if _, err := r.NextPart(); err != io.EOF {
		t.Fatalf("a third part: %v", err)
	}

	_, msg = parse(t, Email{From: "a@shop.example", To: []string{"b@example.com"}, HTML: "<p>only</p>"})
	if ct := msg.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Fatalf("HTML alone: Content-Type %q", ct)
	}
}

// An extra header that holds addresses (Reply-To, Sender...) is written
// as addresses, a non-ASCII display name encoded and the address left
// as it is; a value that is not an address list is refused.
func TestMessageAddressHeaders(t *testing.T) {
	_, msg := parse(t, Email{From: "a@shop.example", To: []string{"b@example.com"},
		Headers: map[string]string{
			"Reply-To":    "José Pérez <jose@shop.example>, Ana <ana@shop.example>",
			"sender":      "Boutique Élise <bot@shop.example>",
			"In-Reply-To": "<x1@shop.example>",
		}})
	rt, err := msg.Header.AddressList("Reply-To")
	if err != nil || len(rt) != 2 || rt[0].Address != "jose@shop.example" || rt[0].Name != "José Pérez" || rt[1].Name != "Ana" {
		t.Fatalf("Reply-To %q: %v %v", msg.Header.Get("Reply-To"), rt, err)
	}
	if s, err := mail.ParseAddress(msg.Header.Get("Sender")); err != nil || s.Address != "bot@shop.example" || s.Name != "Boutique Élise" {
		t.Fatalf("Sender %q: %v %v", msg.Header.Get("Sender"), s, err)
	}
	if v := msg.Header.Get("In-Reply-To"); v != "<x1@shop.example>" {
		t.Fatalf("In-Reply-To %q", v)
	}
	for _, v := range []string{"not an address", "José <jose@shop.example", ""} {
		_, err := build("k", Email{From: "a@shop.example", To: []string{"b@example.com"}, Headers: map[string]string{"Reply-To": v}}, "", when)
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("Reply-To %q: error %v, want ErrInvalid", v, err)
		}
	}
}

// RFC 5322 2.1.1: a line is at most 998 characters, and should be at
// most 78. Long header fields are folded at spaces; long text with no
// space becomes encoded words; every field reads back as it was written.
func TestMessageLongHeaders(t *testing.T) {
	subject := strings.TrimSpace(strings.Repeat("Order 8891 shipped ", 70))
	name := strings.Repeat("Ñ", 150)
	var replyTo []string
	for i := 0; i < 40; i++ {
		replyTo = append(replyTo, fmt.Sprintf("Équipe n°%d <team%d@shop.example>", i, i))
	}
	note := strings.TrimSpace(strings.Repeat("lorem ipsum ", 120))
	env, msg := parse(t, Email{From: "a@shop.example", To: []string{name + " <user7@example.com>"},
		Subject: subject, Text: "x",
		Headers: map[string]string{"Reply-To": strings.Join(replyTo, ", "), "X-Note": note, "X-Mot": strings.Repeat("é", 600)}})
	head, _, _ := strings.Cut(string(env.data), "\r\n\r\n")
	for _, l := range strings.Split(head, "\r\n") {
		// net/mail encodes a display name in words of up to 75
		// characters, after the field's name.
		if len(l) > 78 && !strings.HasPrefix(l, "To: =?") {
			t.Fatalf("a header line of %d characters, which could be folded:\n%s", len(l), head)
		}
	}
	h := msg.Header
	dec := new(mime.WordDecoder)
	if s, err := dec.DecodeHeader(h.Get("Subject")); err != nil || s != subject {
		t.Fatalf("Subject %q (%v)", s, err)
	}
	if to, err := h.AddressList("To"); err != nil || len(to) != 1 || to[0].Address != "user7@example.com" || to[0].Name != name {
		t.Fatalf("To %q: %v %v", h.Get("To"), to, err)
	}
	if rt, err := h.AddressList("Reply-To"); err != nil || len(rt) != 40 || rt[39].Name != "Équipe n°39" || rt[39].Address != "team39@shop.example" {
		t.Fatalf("Reply-To %q: %v", h.Get("Reply-To"), err)
	}
	if h.Get("X-Note") != note {
		t.Fatalf("X-Note %q", h.Get("X-Note"))
	}
	if s, err := dec.DecodeHeader(h.Get("X-Mot")); err != nil || s != strings.Repeat("é", 600) {
		t.Fatalf("X-Mot %q (%v)", s, err)
	}

	// Text with no space to fold at: encoded words.
	long := strings.Repeat("x", 1200)
	_, msg = parse(t, Email{From: "a@shop.example", To: []string{"b@example.com"}, Subject: long})
	if s, err := dec.DecodeHeader(msg.Header.Get("Subject")); err != nil || s != long {
		t.Fatalf("Subject %q (%v)", s, err)
	}

	// A field that cannot be folded under 998 and must not be encoded:
	// refused, rather than sent broken.
	_, err := build("k", Email{From: "a@shop.example", To: []string{"b@example.com"},
		Headers: map[string]string{"List-Unsubscribe": "<https://shop.example/u?t=" + strings.Repeat("a", 1100) + ">"}}, "", when)
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("a 1,100-character token: error %v, want ErrInvalid", err)
	}
}
