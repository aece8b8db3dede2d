// Package effect performs the side effects an [idem.Ledger] guards (an
// email over SMTP, an HTTP call to a provider) and says, in the error it
// returns, what the Ledger may conclude from a failure. That is the part
// no mail or HTTP client says by itself: whether the effect can have
// happened.
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
//	ctx ended before the message's end was written  NotDone
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
// This package imports only the standard library and idem.
package effect
