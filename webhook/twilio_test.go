package webhook

import (
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TW-1..4: twilio-go's client/request_validator_test.go (auth token 12345);
// TW-5-D is derived.
var twParams = url.Values{
	"Digits": {"1234"}, "CallSid": {"CA1234567890ABCDE"}, "To": {"+18005551212"}, "Caller": {"+14158675309"},
	"From": {"+14158675309"}, "ReasonConferenceEnded": {"test"}, "Reason": {"Participant"},
}

const (
	twToken    = "12345"
	twJSONBody = `{"property": "value", "boolean": true}`
	twBodyHash = "0a1ff7634d9ab3b95db5c9a2dfe9416e41502b283a80c7cf19632632f96e6620"
)

func twForm(sig string, params url.Values) (http.Header, []byte) {
	h := hdr("Content-Type", "application/x-www-form-urlencoded", "X-Twilio-Signature", sig)
	return h, []byte(params.Encode())
}

func TestTwilioOfficialVectors(t *testing.T) {
	now := time.Unix(1e9, 0)
	tw := func(u string) *Twilio {
		s, err := NewTwilio(u, twToken)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, c := range []struct {
		name, url, sig string
		params         url.Values
	}{
		{"TW-1", "https://mycompany.com/myapp.php?foo=1&bar=2", "vOEb5UThFn24KEfnOFLQY2AE5FY=", twParams},
		{"TW-1 with :1234", "https://mycompany.com:1234/myapp.php?foo=1&bar=2", "vOEb5UThFn24KEfnOFLQY2AE5FY=", twParams},
		{"TW-2", "http://mycompany.com/myapp.php?foo=1&bar=2", "n2xBNyzSW7rfYStDtOFiFMv7qNo=", twParams},
		{"TW-5-D", "https://mycompany.com/myapp.php?foo=1&bar=2", "RSOYDt4T1cUTdK1PDd93/VVr8B8=", without(twParams, "Reason", "ReasonConferenceEnded")},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, body := twForm(c.sig, c.params)
			ev, err := tw(c.url).Verify(h, body, now)
			if err != nil {
				t.Fatal(err)
			}
			if want, _ := BodyHash(body); ev.ID != want {
				t.Fatalf("id %s, want the body hash", ev.ID)
			}
		})
	}
	if got := tw("https://x").Sign("https://mycompany.com/myapp.php?foo=1&bar=2", twParams); got != "vOEb5UThFn24KEfnOFLQY2AE5FY=" {
		t.Fatalf("Sign = %s", got)
	}
	// TW-3: the signature of the concatenated strings sorted (wrong) fails.
	h, body := twForm("95+Bu0JVPi0r/SsESZCVf0dWAjw=", twParams)
	if _, err := tw("https://mycompany.com/myapp.php?foo=1&bar=2").Verify(h, body, now); !errors.Is(err, ErrNoMatch) {
		t.Fatalf("TW-3: %v, want ErrNoMatch", err)
	}
	// TW-4: JSON bodies, signed through bodySHA256.
	for _, c := range []struct{ url, sig string }{
		{"https://mycompany.com/myapp.php?foo=1&bar=2&bodySHA256=" + twBodyHash, "a9nBmqA0ju/hNViExpshrM61xv4="},
		{"https://mycompany.com/myapp.php?bodySHA256=" + twBodyHash, "y77kIzt2vzLz71DgmJGsen2scGs="},
	} {
		h := hdr("Content-Type", "application/json", "X-Twilio-Signature", c.sig)
		if _, err := tw(c.url).Verify(h, []byte(twJSONBody), now); err != nil {
			t.Fatalf("TW-4 %s: %v", c.url, err)
		}
		if _, err := tw(c.url).Verify(h, []byte(twJSONBody+" "), now); !errors.Is(err, ErrNoMatch) {
			t.Fatalf("TW-4 changed body: %v", err)
		}
	}
	s := tw("https://mycompany.com/myapp.php?foo=1&bar=2")
	good, _ := twForm("vOEb5UThFn24KEfnOFLQY2AE5FY=", twParams)
	runNegative(t, s, twToken, []verifyCase{
		{"missing", hdr("Content-Type", "application/x-www-form-urlencoded"), twParams.Encode(), now, ErrNoSignature},
		{"truncated", hdr("Content-Type", "application/x-www-form-urlencoded", "X-Twilio-Signature", "vOEb5UThFn24"), twParams.Encode(), now, ErrNoMatch},
		{"changed param", good, strings.Replace(twParams.Encode(), "1234", "1235", 1), now, ErrNoMatch},
		{"duplicated", hdr("X-Twilio-Signature", "a", "X-Twilio-Signature", "b"), "", now, ErrMalformed},
		{"not canonical base64", hdr("Content-Type", "application/x-www-form-urlencoded", "X-Twilio-Signature", nonCanonical(t, "x,vOEb5UThFn24KEfnOFLQY2AE5FY=")[2:]), twParams.Encode(), now, ErrNoMatch},
	})
	wrong, _ := NewTwilio("https://mycompany.com/myapp.php?foo=1&bar=2", "54321")
	if _, err := wrong.Verify(good, []byte(twParams.Encode()), now); !errors.Is(err, ErrNoMatch) {
		t.Fatalf("wrong token: %v", err)
	}
	rot, _ := NewTwilio("https://mycompany.com/myapp.php?foo=1&bar=2", "54321", twToken)
	if _, err := rot.Verify(good, []byte(twParams.Encode()), now); err != nil {
		t.Fatalf("rotation: %v", err)
	}
	if _, err := NewTwilio("/relative", twToken); err == nil {
		t.Fatal("a relative public URL was accepted")
	}
	if _, err := NewTwilio("https://x"); !errors.Is(err, ErrNoSecret) {
		t.Fatal(err)
	}
}

// A name sent more than once verifies whether the signer kept its values
// in the order sent or sorted them without repeats (Twilio's Python
// and Node helpers), and a changed value still fails.
func TestTwilioRepeatedNames(t *testing.T) {
	const u = "https://mycompany.com/sms"
	s, err := NewTwilio(u, twToken)
	if err != nil {
		t.Fatal(err)
	}
	sign := func(signed string) string {
		m := hmac.New(sha1.New, []byte(twToken))
		m.Write([]byte(u + signed))
		return base64.StdEncoding.EncodeToString(m.Sum(nil))
	}
	body := "To=%2B1555&MediaUrl=b&MediaUrl=a&MediaUrl=b"
	for name, signed := range map[string]string{
		"as sent":           "MediaUrlbMediaUrlaMediaUrlbTo+1555",
		"sorted, no repeat": "MediaUrlaMediaUrlbTo+1555",
	} {
		h := hdr("Content-Type", "application/x-www-form-urlencoded", "X-Twilio-Signature", sign(signed))
		if _, err := s.Verify(h, []byte(body), time.Now()); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if _, err := s.Verify(h, []byte(strings.Replace(body, "=a", "=c", 1)), time.Now()); !errors.Is(err, ErrNoMatch) {
			t.Errorf("%s, a value changed: %v, want ErrNoMatch", name, err)
		}
	}
	h := hdr("Content-Type", "application/x-www-form-urlencoded", "X-Twilio-Signature", sign("MediaUrlaMediaUrlbMediaUrlbTo+1555"))
	if _, err := s.Verify(h, []byte(body), time.Now()); !errors.Is(err, ErrNoMatch) {
		t.Errorf("sorted with the repeat kept (no signer does this): %v, want ErrNoMatch", err)
	}
}

// Through a Receiver, the URL is the public scheme and host with the
// request's own path and query.
func TestReceiverTwilio(t *testing.T) {
	e := newEnv(t)
	s, _ := NewTwilio("https://mycompany.com", twToken)
	rc, err := NewReceiver("twilio", s, e.l, Publish(e.pub), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	req := func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, "http://10.0.0.1:8080/myapp.php?foo=1&bar=2", strings.NewReader(twParams.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("X-Twilio-Signature", "vOEb5UThFn24KEfnOFLQY2AE5FY=")
		return r
	}
	if a := serve(rc, req()); a.status != 200 {
		t.Fatalf("%d %s", a.status, a.body)
	}
	if a := serve(rc, req()); a.status != 200 || a.header.Get(ReplayedHeader) != "true" {
		t.Fatalf("duplicate: %d %v", a.status, a.header)
	}
	if n := len(e.pub.messages(t)); n != 1 {
		t.Fatalf("%d messages", n)
	}
}

func without(v url.Values, names ...string) url.Values {
	out := url.Values{}
	for k, vs := range v {
		out[k] = vs
	}
	for _, n := range names {
		delete(out, n)
	}
	return out
}
