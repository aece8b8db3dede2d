package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// slackRequest is a Slack delivery of body, signed with s at now (or with a
// wrong signature when forged).
func slackRequest(t testing.TB, s *HMAC, body string, now time.Time, forged bool) *http.Request {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/slack/events", bytes.NewBufferString(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-Slack-Request-Timestamp", formatUnix(now))
	sig, err := s.Sign(r.Header, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if forged {
		sig = "v0=" + string(bytes.Repeat([]byte("0"), 64))
	}
	r.Header.Set("X-Slack-Signature", sig)
	return r
}

// Slack accepts an Events API Request URL only if the URL answers its
// signed url_verification request with the challenge. The Receiver answers
// it 200 with {"challenge": ...}, and neither claims nor queues it: it is
// not an event. Ordinary events are still captured, and a url_verification
// that is not signed by Slack is refused like any forgery.
func TestReceiverAnswersSlackURLVerification(t *testing.T) {
	e := newEnv(t)
	s, err := NewSlack(sl1Secret)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := NewReceiver("slack", s, e.l, Publish(e.pub), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	const challenge = "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
	handshake := `{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"` + challenge + `","type":"url_verification"}`

	for i := 0; i < 2; i++ { // Slack may send it again: answered again, still not an event
		a := serve(rc, slackRequest(t, s, handshake, time.Now(), false))
		if a.status != http.StatusOK || a.header.Get("Content-Type") != "application/json" {
			t.Fatalf("url_verification %d: %d %q %s, want 200 application/json", i, a.status, a.header.Get("Content-Type"), a.body)
		}
		var got struct {
			Challenge string `json:"challenge"`
		}
		if err := json.Unmarshal(a.body, &got); err != nil || got.Challenge != challenge {
			t.Fatalf("url_verification %d answered %s (%v), want the challenge echoed", i, a.body, err)
		}
		if a.header.Get(ReplayedHeader) != "" {
			t.Fatalf("url_verification %d marked replayed", i)
		}
	}
	if n := len(e.pub.messages(t)); n != 0 {
		t.Fatalf("%d messages queued for the handshake, want 0", n)
	}
	id, _ := BodyHash([]byte(handshake))
	if _, err := e.store.Get(context.Background(), Key("slack", id).String()); err == nil {
		t.Fatalf("the handshake claimed a key")
	}

	if a := serve(rc, slackRequest(t, s, handshake, time.Now(), true)); a.status != http.StatusUnauthorized {
		t.Fatalf("forged url_verification: %d %s, want 401", a.status, a.body)
	}
	unsigned := slackRequest(t, s, handshake, time.Now(), false)
	unsigned.Header.Del("X-Slack-Signature")
	if a := serve(rc, unsigned); a.status != http.StatusUnauthorized {
		t.Fatalf("unsigned url_verification: %d %s, want 401", a.status, a.body)
	}

	event := `{"type":"event_callback","event_id":"Ev1","event":{"type":"app_mention"}}`
	a := serve(rc, slackRequest(t, s, event, time.Now(), false))
	var ab acceptedBody
	if a.status != http.StatusOK || json.Unmarshal(a.body, &ab) != nil || ab.EventID != "Ev1" || ab.MessageID == "" {
		t.Fatalf("event: %d %s, want 200 and the accepted body", a.status, a.body)
	}
	if msgs := e.pub.messages(t); len(msgs) != 1 || string(msgs[0].Body) != event {
		t.Fatalf("queued %d messages, want the event alone", len(msgs))
	}
}
