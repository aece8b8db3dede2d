package effect_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/effect"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/store/memstore"
)

// mailpit is Mailpit's HTTP API (IDEM_TEST_MAILPIT_API) and the SMTP
// server beside it (IDEM_TEST_SMTP).
type mailpit struct {
	t    testing.TB
	api  string
	smtp string
}

func needMailpit(t testing.TB) *mailpit {
	t.Helper()
	smtp := testenv.Require(t, testenv.SMTP, "effect's SMTP tests against Mailpit")
	api := testenv.Require(t, testenv.Mailpit, "effect's SMTP tests against Mailpit")
	return &mailpit{t: t, api: strings.TrimRight(api, "/"), smtp: smtp}
}

// uniqueKey returns an operation key no other run has used, so tests can
// share one Mailpit (and its stored mail) without clearing it.
func uniqueKey(t testing.TB, name string) string {
	return fmt.Sprintf("%s:%s:%d", name, t.Name(), time.Now().UnixNano())
}

func (m *mailpit) call(method, path string, body, out any) {
	m.t.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, err := http.NewRequest(method, m.api+path, rd)
	if err != nil {
		m.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		m.t.Fatalf("mailpit %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		m.t.Fatalf("mailpit %s %s: %s", method, path, resp.Status)
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			m.t.Fatalf("mailpit %s %s: %v", method, path, err)
		}
	}
}

type mailpitAddress struct{ Name, Address string }

type mailpitMessage struct {
	ID, MessageID, Subject, Text, HTML string
	From                               mailpitAddress
	To, Cc, Bcc                        []mailpitAddress
}

// search returns the messages whose Message-ID is id (with or without
// angle brackets).
func (m *mailpit) search(id string) []mailpitMessage {
	m.t.Helper()
	var res struct {
		MessagesCount int `json:"messages_count"`
		Messages      []mailpitMessage
	}
	m.call("GET", "/api/v1/search?query="+url.QueryEscape("message-id:"+strings.Trim(id, "<>")), nil, &res)
	return res.Messages
}

func (m *mailpit) message(id string) mailpitMessage {
	m.t.Helper()
	var msg mailpitMessage
	m.call("GET", "/api/v1/message/"+url.PathEscape(id), nil, &msg)
	return msg
}

// find is a Mailer lookup: the Message-ID's message, if Mailpit has it.
func (m *mailpit) find(ctx context.Context, id string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", m.api+"/api/v1/search?query="+url.QueryEscape("message-id:"+strings.Trim(id, "<>")), nil)
	if err != nil {
		return false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("mailpit search: %s", resp.Status)
	}
	var res struct {
		MessagesCount int `json:"messages_count"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return false, err
	}
	return res.MessagesCount > 0, nil
}

// One send arrives once, under its deterministic Message-ID, with a UTF-8
// subject, body and display name intact, a line starting with a dot kept,
// and the Bcc recipient out of the headers.
func TestMailpitSendArrivesOnce(t *testing.T) {
	mp := needMailpit(t)
	key := uniqueKey(t, "receipt")
	m := effect.Email{
		From:    "Boutique Élise <receipts@shop.example>",
		To:      []string{"Zoë Ångström <zoe@example.com>"},
		Cc:      []string{"accounts@example.com"},
		Bcc:     []string{"audit@example.com"},
		Subject: "Reçu n° 8891 — merci ✓ " + strings.Repeat("très long ", 8),
		Text:    "Bonjour Zoë,\n.une ligne qui commence par un point\nTotal : 12,50 €\n",
		HTML:    "<p>Bonjour Zoë, total&nbsp;: 12,50&nbsp;€</p>\n",
		Headers: map[string]string{"X-Order": "8891", "Reply-To": "Service client <help@shop.example>"},
	}
	id, err := effect.NewSMTP(mp.smtp).Send(context.Background(), key, m)
	if err != nil {
		t.Fatal(err)
	}
	if id != effect.MessageID(key, "shop.example") {
		t.Fatalf("Send returned %q, want %q", id, effect.MessageID(key, "shop.example"))
	}
	found := mp.search(id)
	if len(found) != 1 {
		t.Fatalf("Mailpit holds %d messages with Message-ID %s, want 1", len(found), id)
	}
	got := mp.message(found[0].ID)
	crlf := strings.NewReplacer("\r\n", "\n")
	if got.MessageID != strings.Trim(id, "<>") || got.Subject != m.Subject ||
		crlf.Replace(got.Text) != m.Text || crlf.Replace(got.HTML) != m.HTML {
		t.Fatalf("Mailpit has\n%+v\nwant subject %q, text %q, html %q", got, m.Subject, m.Text, m.HTML)
	}
	if got.From != (mailpitAddress{"Boutique Élise", "receipts@shop.example"}) ||
		len(got.To) != 1 || got.To[0] != (mailpitAddress{"Zoë Ångström", "zoe@example.com"}) ||
		len(got.Cc) != 1 || got.Cc[0].Address != "accounts@example.com" ||
		len(got.Bcc) != 1 || got.Bcc[0].Address != "audit@example.com" {
		t.Fatalf("addresses: from %+v to %+v cc %+v bcc %+v", got.From, got.To, got.Cc, got.Bcc)
	}
	// Mailpit puts the envelope's Bcc above the header it received; the
	// header Send wrote (from Date on) must not name the Bcc recipient.
	var raw bytes.Buffer
	resp, err := http.Get(mp.api + "/api/v1/message/" + found[0].ID + "/raw")
	if err != nil {
		t.Fatal(err)
	}
	raw.ReadFrom(resp.Body)
	resp.Body.Close()
	head, _, _ := strings.Cut(raw.String(), "\r\n\r\n")
	if i := strings.Index(head, "\r\nDate: "); i < 0 || strings.Contains(head[i:], "audit@example.com") {
		t.Fatalf("the message's header names the Bcc recipient (or has no Date):\n%s", head)
	}
}

// A receipts worker's "throw after the send on purpose": fn sends, then fails. Under
// AtMostOnce the next call does not send again: without a hook it gets
// ErrIndeterminate; with a Reconcile hook that searches Mailpit by the
// Message-ID it records the send, and still no second email goes out.
func TestMailpitThrowAfterSendNoSecondEmail(t *testing.T) {
	mp := needMailpit(t)
	smtp := effect.NewSMTP(mp.smtp)
	l := idem.New(memstore.New(), idem.WithPolicy(idem.AtMostOnce), idem.WithLogger(slog.New(slog.DiscardHandler)))
	ctx := context.Background()
	for _, hook := range []bool{false, true} {
		t.Run(fmt.Sprintf("reconcile=%v", hook), func(t *testing.T) {
			key := idem.RawKey(uniqueKey(t, "receipt"))
			sends := 0
			fn := func(ctx context.Context) ([]byte, error) {
				sends++
				id, err := smtp.Send(ctx, key.String(), receipt())
				if err != nil {
					return nil, err
				}
				return []byte(id), errors.New("the worker failed after the send, before recording it")
			}
			var opts []idem.CallOption
			if hook {
				opts = append(opts, idem.WithReconcile(func(ctx context.Context, lp idem.Lapsed) ([]byte, bool, error) {
					id := effect.MessageID(lp.Key, "shop.example")
					found, err := mp.find(ctx, id)
					return []byte(id), found, err
				}))
			}
			if _, err := l.Do(ctx, key, fn, opts...); err == nil {
				t.Fatal("the first call did not fail")
			}
			res, err := l.Do(ctx, key, fn, opts...)
			id := effect.MessageID(key.String(), "shop.example")
			if hook {
				if err != nil || !res.Reconciled || string(res.Value) != id {
					t.Fatalf("second call: %+v, %v; want reconciled with %s", res, err, id)
				}
			} else if !errors.Is(err, idem.ErrIndeterminate) {
				t.Fatalf("second call: %v, want ErrIndeterminate", err)
			}
			if sends != 1 {
				t.Fatalf("fn ran %d times, want 1", sends)
			}
			if n := len(mp.search(id)); n != 1 {
				t.Fatalf("Mailpit holds %d messages for the key, want 1", n)
			}
		})
	}
}

// Mailpit's chaos mode (it must run with --enable-chaos, as .ci/run starts
// it) answers MAIL FROM with 451: nothing was sent, so under AtMostOnce the
// key is released, not left indeterminate, and the retry sends once.
func TestMailpitChaos451ReleasesTheKey(t *testing.T) {
	mp := needMailpit(t)
	type trigger struct{ ErrorCode, Probability int }
	set := func(code, p int) error {
		b, _ := json.Marshal(map[string]trigger{"Sender": {code, p}})
		req, _ := http.NewRequest("PUT", mp.api+"/api/v1/chaos", bytes.NewReader(b))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	}
	if err := set(451, 100); err != nil {
		t.Fatalf("PUT /api/v1/chaos: %v; start Mailpit with --enable-chaos (as .ci/services/70-mailpit.sh does)", err)
	}
	// Chaos applies to every client of this Mailpit: keep it short.
	reset := func() {
		if err := set(451, 0); err != nil {
			t.Errorf("resetting Mailpit's chaos: %v", err)
		}
	}
	defer reset()

	store := memstore.New()
	l := idem.New(store, idem.WithPolicy(idem.AtMostOnce), idem.WithLogger(slog.New(slog.DiscardHandler)))
	smtp := effect.NewSMTP(mp.smtp)
	key := idem.RawKey(uniqueKey(t, "receipt"))
	fn := func(ctx context.Context) ([]byte, error) {
		id, err := smtp.Send(ctx, key.String(), receipt())
		return []byte(id), err
	}
	ctx := context.Background()
	_, err := l.Do(ctx, key, fn)
	reset()
	wantClass(t, err, notDone)
	wantSMTPError(t, err, 451, effect.StageMail)
	rec, err := store.Get(ctx, key.String())
	if err != nil || rec.Status != idem.StatusReleased {
		t.Fatalf("after the 451 the record is %+v (%v), want released", rec.Status, err)
	}
	res, err := l.Do(ctx, key, fn)
	if err != nil || res.Attempt != 2 {
		t.Fatalf("the retry: %+v, %v; want attempt 2 to send", res, err)
	}
	if n := len(mp.search(string(res.Value))); n != 1 {
		t.Fatalf("Mailpit holds %d messages for the key, want 1", n)
	}
}
