// Package effect performs the side effects an [idem.Ledger] guards (an
// email over SMTP, an HTTP call to a provider) and says, in the error it
// returns, what the Ledger may conclude from a failure. That is the part
// no mail or HTTP client says by itself: whether the effect can have
// happened.
//
//	mailer := effect.NewSMTP("smtp.example.com:587", effect.WithPlainAuth(user, password))
//	res, err := ledger.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
//		id, err := mailer.Send(ctx, key.String(), effect.Email{
//			From: "Shop <receipts@shop.example>", To: []string{to},
//			Subject: "Your receipt", Text: text})
//		return []byte(id), err // the error says whether the email can have gone out
//	})
//
// The package's SMTP.Send example adds the Reconcile hook that looks the
// message up after a lost answer, and the error cases to switch on.
//
// Inside [idem.Ledger.Do] a failure means one of three things:
//
//	nothing happened, try again    wrapped in idem.NotDone: under AtMostOnce the key is released
//	nothing happened, never will   also wrapped in idem.Permanent: the key fails for good
//	it may have happened           matches ErrOutcomeUnknown, neither of the above: the policy decides
//
// Under [idem.AtMostOnce] the last kind leaves the key indeterminate, never
// repeated by itself; a Reconcile hook ([idem.WithReconcile]) then asks the
// world: the mailbox or provider for the key's [MessageID], the provider's
// API for the call's idempotency key. This is how "throw after the send"
// sends no second email while a refused SMTP connection is still retried.
//
// # Email
//
// [SMTP.Send] writes every message of an operation key with the same
// Message-ID, [MessageID](key, domain), so the send can be looked up after
// its answer was lost:
//
//	refused connection, TLS or AUTH failure        NotDone
//	auth over plain text to a host not loopback    NotDone (nothing sent)
//	4xx to MAIL, RCPT, DATA or the message's end    NotDone (an *SMTPError)
//	5xx to MAIL, RCPT, DATA or the message's end    NotDone + Permanent (an *SMTPError)
//	connection cut, or ctx ended, before the
//	message's end was written                       NotDone
//	reply to the message's end lost, ctx ended,
//	or a timeout passed after it was written        ErrOutcomeUnknown
//	250 to the message's end                        success
//
// Amazon SES is reached through its SMTP endpoint with the same type (see
// [SMTP]); no AWS SDK is needed.
//
// # HTTP calls
//
// [HTTP.Do] passes the operation key as the provider's idempotency key
// (Idempotency-Key), so a repeated call is done once by the provider:
//
//	error before any of the request was      NotDone
//	written (DNS, connect, TLS, ctx ended
//	before the headers)
//	error once its headers were written      ErrOutcomeUnknown
//	(while the body streams, or after)
//	2xx                                      success
//	408, 409, 425, 429, 5xx                  a *StatusError (retry later; RetryAfter)
//	other status, a 3xx not followed         Permanent (a *StatusError)
//
// A redirect is followed only if it keeps the method and the body: the
// GET net/http would make of a redirected POST says nothing of the POST.
//
// Neither retries: the caller (a queue consumer, the Ledger's next call)
// does, with the same key.
//
// # Options
//
// [NewSMTP] takes the server's address and options ([SMTPOption]):
// authentication ([WithPlainAuth], or any net/smtp.Auth with [WithAuth];
// never sent in plain text to a host that is not loopback), TLS
// ([WithSTARTTLS], opportunistic by default; [WithImplicitTLS] for port
// 465; [WithTLSConfig]), the Message-ID's domain ([WithMessageIDDomain]), and
// time bounds: [WithTimeout] for a whole send (default 5 minutes: RFC 5321
// lets a server take up to 10 to answer the message's end, and a send cut
// short there has an unknown outcome) and [WithDialTimeout] (30 s). An
// [HTTP]'s zero value is ready to use: http.DefaultClient, the header
// Idempotency-Key, the key as an sf-string (BareKey for Stripe's style).
//
// docs/effects.md in the repository shows both with a Reconcile hook, and
// says why the SMTP conversation runs on net/smtp rather than on a
// maintained client library:
// https://github.com/idemkit/idem/blob/main/docs/effects.md
//
// This package imports only the standard library and idem.
package effect
