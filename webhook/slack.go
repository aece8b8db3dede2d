package webhook

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// NewSlack returns the scheme of Slack's signed requests:
//
//	X-Slack-Request-Timestamp: 1531420618
//	X-Slack-Signature: v0=<hex HMAC-SHA256(signing secret, "v0:" + timestamp + ":" + raw body)>
//
// accepting a signature under any of secrets, with the timestamp checked
// against the tolerance (5 minutes either way, as Slack's SDKs do).
//
// The event id: Slack sends no delivery id header. For the Events API the id
// is the body's "event_id" (signed); for bodies without one (slash commands,
// interactivity payloads) it is [BodyHash] of the body, so a retry, which
// carries the same body under a new timestamp, is recognised.
//
// The scheme is a [Handshaker]: a signed url_verification request (Slack
// sends one when the Events API Request URL is set, and accepts the URL
// only if the answer echoes the challenge) is answered 200 with
// {"challenge": "..."} as application/json, and is not captured as an
// event.
func NewSlack(secrets ...string) (*HMAC, error) {
	s, err := newHMAC("Slack", HMACConfig{
		Header:          "X-Slack-Signature",
		Prefix:          "v0=",
		Encoding:        Hex,
		Signed:          []Part{Literal("v0:"), HeaderValue("X-Slack-Request-Timestamp"), Literal(":"), Body},
		TimestampHeader: "X-Slack-Request-Timestamp",
		Secrets:         secrets,
		ID:              slackID,
	})
	if err != nil {
		return nil, fmt.Errorf("webhook: Slack: %w", err)
	}
	s.handshake = slackHandshake
	return s, nil
}

// slackHandshake answers Slack's url_verification with its challenge.
func slackHandshake(body []byte) ([]byte, string, bool) {
	if !bytes.Contains(body, []byte("url_verification")) {
		return nil, "", false // an event: not parsed twice
	}
	var v struct {
		Type      string  `json:"type"`
		Challenge *string `json:"challenge"`
	}
	if json.Unmarshal(body, &v) != nil || v.Type != "url_verification" || v.Challenge == nil {
		return nil, "", false
	}
	b, _ := json.Marshal(struct {
		Challenge string `json:"challenge"`
	}{*v.Challenge})
	return b, "application/json", true
}

// slackID is the Events API's event_id, else the body's hash.
func slackID(body []byte) (string, error) {
	var v struct {
		EventID string `json:"event_id"`
	}
	if json.Unmarshal(body, &v) == nil && v.EventID != "" {
		return v.EventID, nil
	}
	return BodyHash(body)
}
