package webhook

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store/memstore"
)

// namedErr reports whether err is one of the package's sentinel errors: bad
// input always gets a named error, never a panic or an anonymous one.
func namedErr(err error) bool {
	for _, e := range []error{ErrNoSignature, ErrMalformed, ErrUnknownVersion, ErrNoMatch, ErrTooOld, ErrTooNew, ErrNoEventID, ErrInvalidEventID} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// FuzzStandardSignatureHeader feeds arbitrary webhook-signature, id and
// timestamp values: the parser keeps its bounds, a failure is a named error,
// and only the one genuine signature verifies.
func FuzzStandardSignatureHeader(f *testing.F) {
	for _, sig := range []string{sw1Sig, swWrongSig, "v1,", "v1", "v1," + sw1Sig[3:11], "v2,abc " + sw1Sig,
		"v1a," + strings.Repeat("A", 88), "  v1,,,  v1a,=", "\x00v1,\xff", strings.Repeat("v1,a ", 100)} {
		f.Add(sw1ID, sw1TS, sig)
	}
	f.Add("msg.1", "1614265330", sw1Sig)
	f.Add(sw1ID, "-1", sw1Sig)
	f.Add(sw1ID, "99999999999999999999", sw1Sig)
	s, err := NewStandard(sw1Secret, swv1aPub)
	if err != nil {
		f.Fatal(err)
	}
	body := []byte(sw1Body)
	f.Fuzz(func(t *testing.T, id, ts, sig string) {
		entries, perr := parseStandardSignatures(sig)
		if len(entries) > 64 || perr != nil && entries != nil {
			t.Fatalf("%d entries kept (error %v)", len(entries), perr)
		}
		for _, e := range entries {
			if strings.ContainsAny(e.version+e.sig, " \t\r\n\u00a0") || strings.Contains(e.version, ",") {
				t.Fatalf("entry %q,%q holds a separator or a space", e.version, e.sig)
			}
		}
		h := http.Header{}
		h.Set("Webhook-Id", id)
		h.Set("Webhook-Timestamp", ts)
		h.Set("Webhook-Signature", sig)
		ev, err := s.Verify(h, body, unix(sw1TS))
		if err != nil {
			if !namedErr(err) {
				t.Fatalf("unnamed error %v", err)
			}
			return
		}
		if id != sw1ID || ts != sw1TS || ev.ID != sw1ID {
			t.Fatalf("verified id %q ts %q sig %q", id, ts, sig)
		}
		genuine := false
		for f := range strings.SplitSeq(sig, " ") {
			genuine = genuine || f == sw1Sig || f == swv1aSig
		}
		if !genuine {
			t.Fatalf("verified without the genuine signature as one entry: %q", sig)
		}
	})
}

// FuzzStripeSignatureHeader: arbitrary Stripe-Signature values.
func FuzzStripeSignatureHeader(f *testing.F) {
	for _, v := range []string{st1Header, "", "t=", "v1,t=1", "t=1614265330", "t=1614265330,v0=ab", "t=1,t=2,v1=00",
		"t=1614265330,v1=zz,v1=" + strings.Repeat("0", 64), "t=1614265330,v1=3c58", st1Header + ",v1=" + strings.Repeat("f", 64),
		"t=1614265330,,v1=00", "=,=,=", "t==1", "t=1614265330,v1=3C5817089D739023DD6190F70A3757E04F7A2FD8B5DAB12C2E000F51970DCCFF"} {
		f.Add(v)
	}
	s, err := NewStripe(st1Secret)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, v string) {
		sh, err := parseStripeHeader(v)
		if err == nil && (sh.t == "" || len(sh.v1) > 64) {
			t.Fatalf("parsed %q as %+v", v, sh)
		}
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("parse error %v is not ErrMalformed", err)
		}
		h := http.Header{}
		h.Set("Stripe-Signature", v)
		ev, err := s.Verify(h, []byte(st1Body), unix(st1T))
		if err != nil {
			if !namedErr(err) {
				t.Fatalf("unnamed error %v", err)
			}
			return
		}
		if ev.ID != "evt_test_webhook" || !strings.Contains(strings.ToLower(v), st1Header[len("t=1614265330,v1="):]) {
			t.Fatalf("verified %q", v)
		}
	})
}

// FuzzHMACSignatureHeader: arbitrary values for the generic scheme's
// signature and timestamp headers (Slack's configuration: prefix, hex,
// signed timestamp).
func FuzzHMACSignatureHeader(f *testing.F) {
	for _, v := range []string{sl1Sig, "v0=", "v0", "v1=" + sl1Sig[3:], sl1Sig[:20], "v0=" + strings.Repeat("g", 64), " v0=00 ", "\xffv0="} {
		f.Add(sl1TS, v)
	}
	f.Add("+1531420618", sl1Sig)
	f.Add("", sl1Sig)
	f.Add("1531420618 ", sl1Sig)
	s, err := NewSlack(sl1Secret)
	if err != nil {
		f.Fatal(err)
	}
	gen, err := NewHMAC(HMACConfig{Header: "X-Sig", Prefix: "s=", Separator: ",", Encoding: Base64URL, Secrets: []string{"k"}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, ts, v string) {
		sigs, _, _ := parseHMACSignatures(v, ",", "s=", Base64URL)
		if len(sigs) > 64 {
			t.Fatalf("%d signatures kept", len(sigs))
		}
		h := http.Header{}
		h.Set("X-Slack-Request-Timestamp", ts)
		h.Set("X-Slack-Signature", v)
		h.Set("X-Sig", v)
		_, err := s.Verify(h, []byte(sl1Body), unix(sl1TS))
		if err == nil && (ts != sl1TS || !strings.Contains(strings.ToLower(v), sl1Sig[3:])) {
			t.Fatalf("verified ts %q sig %q", ts, v)
		}
		if err != nil && !namedErr(err) {
			t.Fatalf("unnamed error %v", err)
		}
		if _, err := gen.Verify(h, []byte("{}"), time.Unix(0, 0)); err != nil && !namedErr(err) {
			t.Fatalf("generic: unnamed error %v", err)
		}
	})
}

// countingPub counts publishes (for the receiver fuzz test, which must not
// publish anything).
type countingPub struct{ n atomic.Int64 }

func (p *countingPub) Publish(context.Context, queue.Outgoing) (queue.Published, error) {
	p.n.Add(1)
	return queue.Published{ID: "x"}, nil
}

// FuzzReceiverHeaders sends requests with arbitrary Standard Webhooks
// headers and bodies through a Receiver: none is accepted unless it carries
// the genuine signature, every refusal is a 4xx problem, and nothing is
// published for a refused request.
func FuzzReceiverHeaders(f *testing.F) {
	f.Add(sw1ID, sw1TS, sw1Sig, sw1Body)
	f.Add(sw1ID, sw1TS, swWrongSig, sw1Body)
	f.Add("", "", "", "")
	f.Add("msg:\xff", "1614265330", "v1,====", "{}")
	s, err := NewStandard(sw1Secret)
	if err != nil {
		f.Fatal(err)
	}
	pub := new(countingPub)
	rc, err := NewReceiver("fuzz", s, idem.New(memstore.New(), idem.WithLogger(quiet)), Publish(pub),
		WithLogger(quiet), WithClock(func() time.Time { return unix(sw1TS) }), WithMaxBody(4096))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id, ts, sig, body string) {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		r.Header["Webhook-Id"] = []string{id}
		r.Header["Webhook-Timestamp"] = []string{ts}
		r.Header["Webhook-Signature"] = []string{sig}
		before := pub.n.Load()
		a := serve(rc, r)
		genuine := id == sw1ID && ts == sw1TS && body == sw1Body && strings.Contains(sig, sw1Sig[3:])
		switch {
		case a.status == 200:
			if !genuine {
				t.Fatalf("accepted id %q ts %q sig %q body %q", id, ts, sig, body)
			}
		case a.status == 401 || a.status == 400 || a.status == 413:
			if pub.n.Load() != before {
				t.Fatalf("a refused request (%d) was published", a.status)
			}
			if !strings.HasPrefix(a.header.Get("Content-Type"), "application/problem+json") {
				t.Fatalf("refusal %d without a problem body", a.status)
			}
		default:
			t.Fatalf("status %d for id %q ts %q sig %q: %s", a.status, id, ts, sig, a.body)
		}
	})
}
