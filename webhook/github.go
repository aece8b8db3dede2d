package webhook

import "fmt"

// NewGitHub returns the scheme of GitHub's webhooks:
//
//	X-Hub-Signature-256: sha256=<hex HMAC-SHA256(secret, raw body)>
//
// accepting a signature under any of secrets. The legacy SHA-1
// X-Hub-Signature header is not read. GitHub signs no timestamp, so no
// freshness check is possible.
//
// The event id: GitHub's delivery id (X-GitHub-Delivery) is not covered by
// the signature, so anyone holding one signed delivery could replay its body
// under a fresh delivery id. The scheme therefore keys on the signed body:
// the id is [BodyHash] of the body ("sha256:<hex>"). A redelivery (GitHub
// resends the same body) and a replay under a new delivery id are both the
// same operation; two events with byte-identical bodies would be one (GitHub
// payloads carry the changed object and its timestamps, so they differ). Set
// the returned scheme's ID to take an id from inside the body instead.
func NewGitHub(secrets ...string) (*HMAC, error) {
	s, err := newHMAC("GitHub", HMACConfig{
		Header:   "X-Hub-Signature-256",
		Prefix:   "sha256=",
		Encoding: Hex,
		Secrets:  secrets,
	})
	if err != nil {
		return nil, fmt.Errorf("webhook: GitHub: %w", err)
	}
	return s, nil
}
