// Package webhook receives provider webhooks so that each event is captured
// once: verified, recognised on every retry, and durably queued before the
// sender hears 2xx.
//
// A [Receiver] is an http.Handler for one source. It verifies the request
// with a [Scheme] over the raw body bytes, takes the event id from data the
// signature covers, claims the operation key accept:<source>:<event id> in
// an [idem.Ledger], and captures the event into a queue ([Capture]):
//
//	store, _ := sqlitestore.Open(ctx, "idem.db")
//	l := idem.New(store) // retention 7 days: covers the senders' retry horizons
//	scheme, _ := webhook.NewStandard(os.Getenv("WEBHOOK_SECRET"))
//	rcv, _ := webhook.NewReceiver("billing", scheme, l, webhook.PublishTx[*sql.Tx](q))
//	http.Handle("POST /hooks/billing", rcv)
//
// 2xx means "taken responsibility": the event is in the queue. A duplicate
// delivery gets the first answer again with Idempotent-Replayed: true; a
// duplicate that arrives while the first is being captured gets 409 and
// Retry-After; a queue or store that fails gets 500, never 2xx, and the key
// is released (or, when the store itself failed, left to its lease) so the
// sender's retry captures the event.
//
// Under an [idem.AtMostOnce] ledger a publish that failed (the broker may
// have taken the message) leaves the key indeterminate: retries get 500
// until an operator decides with `idem resolve` (docs/webhooks.md).
//
// The package's examples run a Receiver end to end (Receiver, PublishTx)
// and show the consumer's side (EventKey).
//
// # Capture modes
//
// [PublishTx] captures in the ledger store's own transaction (sqlitestore
// with *sql.Tx, pgstore with pgx.Tx, and a queue in the same database): the
// claim, the message and the completion commit together, so every event is
// queued exactly once. [Publish] works with any [queue.Publisher]: claim,
// publish with DedupID = the operation key, complete. A crash between the
// publish and the completion publishes again on the retry (under the same
// DedupID, for brokers that deduplicate); the consumer's ledger is the last
// line.
//
// # Schemes
//
// [NewStandard] (Standard Webhooks "v1" HMAC and "v1a" ed25519, under the
// webhook-* or svix-* headers), [NewStripe], [NewGitHub], [NewShopify],
// [NewSlack], [NewTwilio] (which also signs the URL: a [RequestScheme]),
// and [NewHMAC] for other providers (header, prefix, encoding,
// signed content, signed timestamp and id headers). Every scheme compares in
// constant time, accepts several secrets at once (rotation), and checks a
// signed timestamp (Standard, Stripe, Slack, HMAC with TimestampHeader) within [DefaultTolerance] (5 minutes either way) unless
// its Tolerance field says otherwise.
//
// A scheme may also be a [Handshaker], for providers that check an endpoint
// with a signed handshake before sending events: the Slack scheme answers
// url_verification with its challenge, and the Receiver neither claims nor
// queues it.
//
// Where the event id comes from:
//
//	scheme            event id                         signed?
//	Standard          webhook-id / svix-id header      yes (id.timestamp.body)
//	Stripe            body "id" (evt_...)              yes (the body)
//	Slack             body "event_id", else body hash  yes (the body)
//	GitHub, Shopify   "sha256:" + hex SHA-256 of body  yes (the body)
//	Twilio            "sha256:" + hex SHA-256 of body  yes (params or bodySHA256)
//	HMAC              IDHeader if set, else ID(body)   IDHeader must be signed
//
// GitHub's and Shopify's delivery ids are not covered by their
// signatures, so those schemes key on the signed body (a replay under a
// fresh id is a duplicate); set the scheme's ID field ([JSONField]) to key
// on an id inside the body instead.
//
// # Refusals and options
//
// Signature headers are read strictly, as the providers write them
// (canonical base64, lower-case hex, no repeated headers): a scheme
// refuses with [ErrMalformed] (401) some headers the provider's own
// library accepts; docs/webhooks.md lists them.
//
// Refusals: 405 (not POST), 413 (body over [DefaultMaxBody]), 408 (body
// slower than [DefaultBodyTimeout]), 401 (not authentic), 400 (authentic but
// without a usable id), each with an application/problem+json body whose
// type begins with [ProblemTypePrefix] (each type is the section of
// docs/problems.md that documents it); none of them touches the ledger.
// [WithMaxBody] and [WithBodyTimeout] change those limits (1 MiB, 10 s);
// [WithClock] (the clock signed timestamps are checked against, default
// time.Now) and [WithLogger] (default slog.Default) are the others.
//
// docs/webhooks.md in the repository lists where the schemes are
// stricter than the providers' libraries, why GitHub and Shopify are keyed
// on the body, and how to resolve an event under AtMostOnce:
// https://github.com/idemkit/idem/blob/main/docs/webhooks.md
package webhook
