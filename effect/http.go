package effect

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
)

// DefaultKeyHeader is the header [HTTP] sends the operation key in, as the
// IETF draft (draft-ietf-httpapi-idempotency-key-header) and Stripe name it.
const DefaultKeyHeader = "Idempotency-Key"

// maxErrorBody is how much of a refused response's body a StatusError keeps.
const maxErrorBody = 64 << 10

// HTTP makes a call to a provider that deduplicates by an idempotency key
// (Stripe, Adyen, any API that follows the IETF draft), passing the
// operation key as that key, so that a call repeated by a retry or a
// takeover is done once by the provider. Its zero value is ready to use.
//
// HTTP does not retry: it makes one call and says what its failure means
// (see [HTTP.Do]); the caller (a queue consumer, an [idem.Ledger] under
// [idem.AtLeastOnce]) retries with the same key. net/http itself may send
// a request again, once, on a kept-alive connection that the server closed
// before reading it (it does so for requests with an Idempotency-Key); the
// provider deduplicates that too.
type HTTP struct {
	// Client makes the call (default http.DefaultClient). Its Timeout, if
	// set, bounds the call as ctx does.
	Client *http.Client
	// Header is the header's name (default [DefaultKeyHeader]).
	Header string
	// BareKey sends the key as it is (Idempotency-Key: receipt:8891:7), as
	// Stripe's examples do. By default the key is sent as an RFC 8941
	// sf-string, in quotes (Idempotency-Key: "receipt:8891:7"), as the IETF
	// draft requires. Either way the key must be printable ASCII (no space
	// when bare); [KeyToken] makes such a key of any other.
	BareKey bool
}

// Do sends req with the operation key in the idempotency header and
// classifies the outcome for an [idem.Ledger]:
//
//   - a 2xx response: returned with a nil error; the caller closes its body.
//   - an error before any of the request was written (DNS, a refused or
//     failed connection, TLS, ctx ended before the headers were written):
//     wrapped in [idem.NotDone]. The provider cannot have acted on a
//     request it did not receive.
//   - an error once the request's headers were written (the connection
//     dropped or ctx ended while the body was written or the answer
//     awaited, a timeout passed): matches [ErrOutcomeUnknown], neither
//     NotDone nor Permanent. A server has the request with its headers and
//     may act before it reads the body. Retry with the same key: the
//     provider either did it and replays its answer, or does it now. When
//     net/http sends the request again on a new connection (see [HTTP]),
//     a failure of that attempt is unknown too: the first may have arrived.
//   - 408, 409 (the draft's "a request with this key is outstanding"), 425,
//     429 and 5xx: a [*StatusError] as it is (retry later, after its
//     RetryAfter), since the provider may have started the work.
//   - any other status (400, 422 "key reused with another request", other
//     4xx, a 3xx the Client did not follow): a [*StatusError] wrapped in
//     [idem.Permanent]. Sending the same request again cannot succeed.
//
// Do follows a redirect only if it keeps the method and the body (307,
// 308, or a 301, 302 or 303 to a GET or HEAD without a body), and only as
// the Client's CheckRedirect allows (net/http's default policy if nil). A
// 301, 302 or 303 to any other request, which net/http would follow as a
// GET without the body, comes back as its *StatusError: the answer to that
// GET would say nothing of the request made. A redirect the
// CheckRedirect refuses with an error is that *StatusError too, joined
// with the error. After a followed redirect, only the last hop counts for
// NotDone: the earlier ones answered with a redirect and did nothing.
//
// For a status error the response's body is read (its start kept in the
// StatusError) and closed, and Do returns a nil response.
//
// Do learns what was written from the request's [httptrace.ClientTrace]
// (WroteHeaders): the Client's Transport must report it, as net/http's
// does (HTTP/1 and HTTP/2) and any RoundTripper that hands the request on
// to it. A Transport that does not would make every failure NotDone.
//
// req is not consumed: Do sends a clone with ctx, with a body from
// req.GetBody, so the caller can pass the same req to Do again. A req with
// a body must therefore have GetBody (http.NewRequest sets it for a
// *bytes.Buffer, *bytes.Reader or *strings.Reader); without it, or with a
// key the header cannot carry, Do sends nothing and returns an error
// matching [ErrInvalid], wrapped in [idem.Permanent] and [idem.NotDone].
func (h *HTTP) Do(ctx context.Context, key string, req *http.Request) (*http.Response, error) {
	value, err := h.keyValue(key)
	if err != nil {
		return nil, idem.Permanent(idem.NotDone(err))
	}
	hasBody := req.Body != nil && req.Body != http.NoBody
	if hasBody && req.GetBody == nil {
		return nil, idem.Permanent(idem.NotDone(fmt.Errorf("%w request: its body cannot be sent again (no GetBody); make it from a bytes.Reader, bytes.Buffer or strings.Reader, or set GetBody", ErrInvalid)))
	}
	// wrote says whether the current hop's request may have reached the
	// server: its headers were written (a server can act on them before
	// it reads the body, or without reading it). It stays set when
	// net/http sends the request again on a new connection. A followed
	// redirect starts a new hop: the previous one was answered with a 3xx,
	// so it did nothing.
	var wrote atomic.Bool
	trace := &httptrace.ClientTrace{WroteHeaders: func() { wrote.Store(true) }}
	r := req.Clone(httptrace.WithClientTrace(ctx, trace))
	if hasBody {
		if r.Body, err = req.GetBody(); err != nil {
			return nil, idem.NotDone(fmt.Errorf("effect: http %s %s: GetBody: %w", req.Method, req.URL.Redacted(), err))
		}
	}
	name := h.Header
	if name == "" {
		name = DefaultKeyHeader
	}
	r.Header.Set(name, value)
	client := http.DefaultClient
	if h.Client != nil {
		client = h.Client
	}
	c := *client
	c.CheckRedirect = func(next *http.Request, via []*http.Request) error {
		// net/http turns a request answered 301, 302 or 303 into a GET
		// without a body: its answer says nothing of the request made.
		if next.Method != via[0].Method || hasBody && (next.Body == nil || next.Body == http.NoBody) {
			return http.ErrUseLastResponse
		}
		var err error
		if client.CheckRedirect != nil {
			err = client.CheckRedirect(next, via)
		} else if len(via) >= 10 { // net/http's default policy
			err = errors.New("stopped after 10 redirects")
		}
		if err == nil {
			wrote.Store(false)
		}
		return err
	}
	resp, err := c.Do(r)
	if err != nil {
		if resp != nil {
			// The Client's CheckRedirect refused to follow resp, a 3xx
			// (net/http has closed its body): the answer is that status.
			return nil, idem.Permanent(errors.Join(statusError(resp, nil), err))
		}
		if !wrote.Load() {
			return nil, idem.NotDone(fmt.Errorf("effect: http %s: not sent: %w", req.Method, err))
		}
		return nil, &unknownError{op: "http " + req.Method, err: fmt.Errorf("the request was sent and its answer was lost: %w", err)}
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	resp.Body.Close()
	se := statusError(resp, body)
	if retryableStatus(resp.StatusCode) {
		return nil, se
	}
	return nil, idem.Permanent(se)
}

func statusError(resp *http.Response, body []byte) *StatusError {
	return &StatusError{StatusCode: resp.StatusCode, Status: resp.Status, Header: resp.Header, Body: body,
		RetryAfter: retryAfter(resp.Header.Get("Retry-After"), time.Now())}
}

// keyValue is the header's value for key.
func (h *HTTP) keyValue(key string) (string, error) {
	if key == "" {
		return "", fmt.Errorf("%w request: empty idempotency key", ErrInvalid)
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c < 0x20 || c > 0x7e || (h.BareKey && c == ' ') {
			return "", fmt.Errorf("%w request: the idempotency key %q is not printable ASCII; send effect.KeyToken(key) instead", ErrInvalid, key)
		}
	}
	if h.BareKey {
		return key, nil
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`, nil
}

// retryAfter reads a Retry-After value: delay-seconds or an HTTP-date.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 || n > 1<<31 {
			return 0
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}
