package webhook

import "fmt"

// NewShopify returns the scheme of Shopify's HTTPS webhooks:
//
//	X-Shopify-Hmac-Sha256: <base64 HMAC-SHA256(client secret, raw body)>
//
// accepting a signature under any of secrets (after a rotation, Shopify
// takes up to an hour to switch: configure the old and the new secret).
// Shopify signs no timestamp.
//
// The event id: X-Shopify-Webhook-Id and X-Shopify-Event-Id are not covered
// by the signature, so the scheme keys on the signed body ([BodyHash]);
// Shopify's retries carry the original payload, so they are recognised. Set
// the returned scheme's ID to take an id from inside the body instead.
func NewShopify(secrets ...string) (*HMAC, error) {
	s, err := newHMAC("Shopify", HMACConfig{
		Header:   "X-Shopify-Hmac-Sha256",
		Encoding: Base64,
		Secrets:  secrets,
	})
	if err != nil {
		return nil, fmt.Errorf("webhook: Shopify: %w", err)
	}
	return s, nil
}
