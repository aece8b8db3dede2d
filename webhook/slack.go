package webhook

import (
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
	return s, nil
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
