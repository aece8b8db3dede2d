package effect

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// ErrOutcomeUnknown is matched (with [errors.Is]) by every error that says
// the effect may or may not have happened: the request or the message was
// handed over in full and its answer was lost (the connection dropped, the
// context ended, a timeout passed). Such an error is neither
// [idem.NotDone] nor [idem.Permanent]: the [idem.Ledger]'s policy decides
// what it means. Under [idem.AtMostOnce] the key is left indeterminate,
// for a Reconcile hook (look the send up by [MessageID], the call up by its
// idempotency key) or an operator.
var ErrOutcomeUnknown = errors.New("effect: outcome unknown")

// ErrInvalid is matched by the error for an [Email] or a request that
// cannot be sent as it is (no recipient, a line break in a header, a body
// that cannot be sent again). Nothing was sent; the error is
// [idem.Permanent] and [idem.NotDone], since trying again cannot help.
var ErrInvalid = errors.New("effect: invalid")

// unknownError is an error whose outcome is unknown: it wraps the cause and
// matches ErrOutcomeUnknown.
type unknownError struct {
	op  string
	err error
}

func (e *unknownError) Error() string {
	return "effect: " + e.op + ": outcome unknown: " + e.err.Error()
}
func (e *unknownError) Unwrap() error        { return e.err }
func (e *unknownError) Is(target error) bool { return target == ErrOutcomeUnknown }

// SMTPError is an SMTP server's refusal: a 4xx or 5xx reply. It is wrapped
// in [idem.NotDone] (the server kept nothing), and a 5xx reply about the
// message (at [StageMail], [StageRcpt], [StageData] or [StageEndOfData])
// also in [idem.Permanent]. Find it with [errors.As].
type SMTPError struct {
	Code  int    // the reply code, such as 451 or 550
	Stage string // the command it answered: one of the Stage constants
	Msg   string // the reply text, lines joined with "\n"
}

// The stages of an SMTP conversation, as [SMTPError.Stage] names them.
const (
	StageTLS       = "tls"         // the TLS handshake of an implicit-TLS connection (WithImplicitTLS)
	StageGreeting  = "greeting"    // the server's first reply, after the connection opens
	StageHello     = "hello"       // EHLO (or HELO)
	StageStartTLS  = "starttls"    // STARTTLS and the TLS handshake
	StageAuth      = "auth"        // AUTH
	StageMail      = "mail"        // MAIL FROM
	StageRcpt      = "rcpt"        // RCPT TO
	StageData      = "data"        // DATA, before the message is written
	StageEndOfData = "end of data" // the reply to the message's final "."
)

func (e *SMTPError) Error() string {
	return fmt.Sprintf("effect: smtp %s: %d %s", e.Stage, e.Code, e.Msg)
}

// Temporary reports whether the reply was a 4xx (try again later).
func (e *SMTPError) Temporary() bool { return e.Code >= 400 && e.Code < 500 }

// StatusError is an HTTP response that [HTTP.Do] did not count as success.
// For 408, 409, 425, 429 and 5xx it is returned as it is (try again later,
// after RetryAfter if the server said); for any other status it is wrapped
// in [idem.Permanent]. Find it with [errors.As].
type StatusError struct {
	StatusCode int
	Status     string        // such as "503 Service Unavailable"
	Header     http.Header   // the response's header
	Body       []byte        // the start of the response's body (at most 64 KiB)
	RetryAfter time.Duration // from the Retry-After header; 0 if absent or unreadable
}

func (e *StatusError) Error() string {
	s := "effect: http: " + e.Status
	if e.RetryAfter > 0 {
		s += fmt.Sprintf(" (retry after %v)", e.RetryAfter)
	}
	return s
}

// Temporary reports whether trying again later may succeed: 408, 409, 425,
// 429 and 5xx.
func (e *StatusError) Temporary() bool { return retryableStatus(e.StatusCode) }

func retryableStatus(code int) bool {
	switch code {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return code >= 500 && code < 600
}
