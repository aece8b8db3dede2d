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
// # Why net/smtp and not a maintained SMTP client
//
// The SMTP conversation runs on the standard library's net/smtp (frozen,
// but still maintained with Go) for the connection, EHLO, STARTTLS and
// AUTH, and on this package's own MAIL, RCPT, DATA and reply reading over
// net/smtp's Client.Text. github.com/emersion/go-smtp (v0.25.1), the
// maintained client, was weighed and not taken, because three of the
// answers above would be lost or need a shim around it:
//
//   - A bare reply code. RFC 5321 4.2 makes a reply's text optional, and
//     go-smtp reads replies with net/textproto, which takes "250" or "554"
//     alone on a line for a broken reply ("short response"). After the
//     message's end that turns an accepted message, and a permanent
//     refusal, into an unknown outcome. The fix is to read the reply
//     ourselves, which go-smtp does not allow (its textproto.Conn is not
//     exported), nor can a reader under it rewrite the line: go-smtp
//     wraps STARTTLS itself, so such a reader would see ciphertext.
//   - The message's end. go-smtp's DataCommand.Close writes the final
//     "." and reads its reply in one call, and its error does not say
//     which failed: "the server saw no end" (NotDone) or "the reply was
//     lost" (unknown). Telling them apart would take a wrapper of the
//     connection that records whether a write failed before the first
//     read.
//   - The deadline. go-smtp sets the connection's deadline before each
//     command (5 minutes, 12 after the message's end) and clears it after,
//     so the bound of [WithTimeout] and ctx's deadline would need another
//     wrapper that holds every deadline to ours.
//
// Switching would also change [WithAuth] from net/smtp's Auth to go-sasl's
// Client, a breaking change for no gain: net/smtp.Auth already takes any
// mechanism (AUTH LOGIN, XOAUTH2) a caller writes. What we write by hand is
// about eighty lines, tested against a fake server that answers or cuts
// at each stage and against Mailpit. Revisit if net/smtp stops being
// maintained or a needed extension (DSN, REQUIRETLS) is asked for.
//
// This package imports only the standard library and idem.
package effect
