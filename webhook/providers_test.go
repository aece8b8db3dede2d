package webhook

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// verifyCase is one negative case of a scheme.
type verifyCase struct {
	name string
	h    http.Header
	body string
	now  time.Time
	want error
}

func runNegative(t *testing.T, s Scheme, secret string, cases []verifyCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := s.Verify(c.h, []byte(c.body), c.now)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if secret != "" && strings.Contains(err.Error(), secret) {
				t.Fatalf("error echoes the secret: %v", err)
			}
		})
	}
}

// ST-1-D (derived with stripe-go's algorithm; stripe-go has no fixed vector).
const (
	st1Secret = "whsec_test_secret"
	st1T      = "1614265330"
	st1Body   = `{"id":"evt_test_webhook","object":"event"}`
	st1Header = "t=1614265330,v1=3c5817089d739023dd6190f70a3757e04f7a2fd8b5dab12c2e000f51970dccff"
)

func TestStripe(t *testing.T) {
	s, err := NewStripe(st1Secret)
	if err != nil {
		t.Fatal(err)
	}
	now := unix(st1T)
	if got := s.Sign(now, []byte(st1Body)); got != st1Header {
		t.Fatalf("Sign = %s, want %s", got, st1Header)
	}
	ev, err := s.Verify(hdr("Stripe-Signature", st1Header), []byte(st1Body), now)
	if err != nil || ev.ID != "evt_test_webhook" || !ev.Timestamp.Equal(now) {
		t.Fatalf("ST-1-D: %+v, %v", ev, err)
	}
	// Rolled secret: Stripe sends one v1 per secret; the receiver may know
	// either. v0 entries are ignored.
	other, _ := NewStripe("whsec_new_secret")
	rolled := st1Header + ",v1=" + strings.TrimPrefix(other.Sign(now, []byte(st1Body)), "t="+st1T+",v1=") + ",v0=abcd"
	for _, sch := range []*Stripe{s, other} {
		if _, err := sch.Verify(hdr("Stripe-Signature", rolled), []byte(st1Body), now); err != nil {
			t.Fatalf("rolled header under %v: %v", sch, err)
		}
	}
	both, _ := NewStripe("whsec_new_secret", st1Secret)
	if _, err := both.Verify(hdr("Stripe-Signature", st1Header), []byte(st1Body), now); err != nil {
		t.Fatalf("two configured secrets: %v", err)
	}
	sig := strings.TrimPrefix(st1Header, "t="+st1T+",v1=")
	at := func(ts time.Time) http.Header { return hdr("Stripe-Signature", s.Sign(ts, []byte(st1Body))) }
	runNegative(t, s, st1Secret, []verifyCase{
		{"wrong signature", hdr("Stripe-Signature", "t="+st1T+",v1="+strings.Repeat("0", 64)), st1Body, now, ErrNoMatch},
		{"truncated signature", hdr("Stripe-Signature", "t="+st1T+",v1="+sig[:32]), st1Body, now, ErrNoMatch},
		{"non-hex signature only", hdr("Stripe-Signature", "t="+st1T+",v1=zz"), st1Body, now, ErrUnknownVersion},
		{"v0 only", hdr("Stripe-Signature", "t="+st1T+",v0="+sig), st1Body, now, ErrUnknownVersion},
		{"missing header", hdr(), st1Body, now, ErrNoSignature},
		{"empty header", hdr("Stripe-Signature", ""), st1Body, now, ErrNoSignature},
		{"pair without =", hdr("Stripe-Signature", "v1,t=1"), st1Body, now, ErrMalformed},
		{"empty t", hdr("Stripe-Signature", "t="), st1Body, now, ErrMalformed},
		{"no t", hdr("Stripe-Signature", "v1="+sig), st1Body, now, ErrMalformed},
		{"two t", hdr("Stripe-Signature", "t=1,"+st1Header), st1Body, now, ErrMalformed},
		{"non-numeric t", hdr("Stripe-Signature", "t=abc,v1="+sig), st1Body, now, ErrMalformed},
		{"duplicated header", hdr("Stripe-Signature", st1Header, "Stripe-Signature", st1Header), st1Body, now, ErrMalformed},
		{"changed body", hdr("Stripe-Signature", st1Header), st1Body + " ", now, ErrNoMatch},
		{"changed t", hdr("Stripe-Signature", "t=1614265331,v1="+sig), st1Body, now, ErrNoMatch},
		{"wrong secret", hdr("Stripe-Signature", other.Sign(now, []byte(st1Body))), st1Body, now, ErrNoMatch},
		{"stale", at(now.Add(-300*time.Second - time.Second)), st1Body, now, ErrTooOld},
		{"future", at(now.Add(301 * time.Second)), st1Body, now, ErrTooNew},
	})
	if _, err := s.Verify(at(now.Add(-300*time.Second+time.Second)), []byte(st1Body), now); err != nil {
		t.Fatalf("now-300s+1s (stripe-go passes it): %v", err)
	}
	// Authentic, but no id in the body: 400, not 401.
	noID := `{"object":"event"}`
	_, err = s.Verify(hdr("Stripe-Signature", s.Sign(now, []byte(noID))), []byte(noID), now)
	if !errors.Is(err, ErrNoEventID) || Unauthentic(err) {
		t.Fatalf("no id: %v", err)
	}
	if _, err := NewStripe(); !errors.Is(err, ErrNoSecret) {
		t.Fatal(err)
	}
	if _, err := NewStripe(st1Secret, ""); !errors.Is(err, ErrNoSecret) {
		t.Fatal(err)
	}
}

// GH-1: GitHub's docs, "Testing the webhook payload validation".
const (
	gh1Secret = "It's a Secret to Everybody"
	gh1Body   = "Hello, World!"
	gh1Sig    = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
)

func TestGitHub(t *testing.T) {
	s, err := NewGitHub(gh1Secret)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Sign(nil, []byte(gh1Body)); got != gh1Sig {
		t.Fatalf("Sign = %s, want %s", got, gh1Sig)
	}
	now := time.Unix(1e9, 0)
	ev, err := s.Verify(hdr("X-Hub-Signature-256", gh1Sig, "X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"), []byte(gh1Body), now)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := BodyHash([]byte(gh1Body))
	if ev.ID != want || !ev.Timestamp.IsZero() {
		t.Fatalf("event %+v, want the body's hash %s and no timestamp", ev, want)
	}
	// A replay with a new, unsigned delivery id is the same event.
	ev2, err := s.Verify(hdr("X-Hub-Signature-256", gh1Sig, "X-GitHub-Delivery", "00000000-0000-0000-0000-000000000000"), []byte(gh1Body), now.Add(1000*time.Hour))
	if err != nil || ev2.ID != ev.ID {
		t.Fatalf("replay under a new delivery id: %+v, %v; want id %s", ev2, err, ev.ID)
	}
	rot, _ := NewGitHub("old secret", gh1Secret)
	if _, err := rot.Verify(hdr("X-Hub-Signature-256", gh1Sig), []byte(gh1Body), now); err != nil {
		t.Fatalf("rotation: %v", err)
	}
	runNegative(t, s, gh1Secret, []verifyCase{
		{"wrong signature", hdr("X-Hub-Signature-256", "sha256="+strings.Repeat("ab", 32)), gh1Body, now, ErrNoMatch},
		{"truncated signature", hdr("X-Hub-Signature-256", gh1Sig[:40]), gh1Body, now, ErrNoMatch},
		// The right bytes in upper-case hex: GitHub's own check compares
		// the lower-case string, so this matches nothing there either.
		{"upper-case hex", hdr("X-Hub-Signature-256", "sha256="+strings.ToUpper(gh1Sig[7:])), gh1Body, now, ErrNoMatch},
		{"prefix only", hdr("X-Hub-Signature-256", "sha256="), gh1Body, now, ErrNoMatch},
		{"missing", hdr("X-Hub-Signature", "sha1=0123"), gh1Body, now, ErrNoSignature},
		{"unknown version", hdr("X-Hub-Signature-256", "sha512="+gh1Sig[7:]), gh1Body, now, ErrUnknownVersion},
		{"duplicated header", hdr("X-Hub-Signature-256", gh1Sig, "X-Hub-Signature-256", gh1Sig), gh1Body, now, ErrMalformed},
		{"changed body", hdr("X-Hub-Signature-256", gh1Sig), "Hello, World?", now, ErrNoMatch},
	})
	wrong, _ := NewGitHub("It's a Secret to Nobody")
	if _, err := wrong.Verify(hdr("X-Hub-Signature-256", gh1Sig), []byte(gh1Body), now); !errors.Is(err, ErrNoMatch) {
		t.Fatalf("wrong secret: %v", err)
	}
	// An id from inside the signed body instead of the hash.
	s.ID = JSONField("delivery")
	b := `{"delivery":"d-1"}`
	sig, _ := s.Sign(nil, []byte(b))
	if ev, err := s.Verify(hdr("X-Hub-Signature-256", sig), []byte(b), now); err != nil || ev.ID != "d-1" {
		t.Fatalf("ID from the body: %+v, %v", ev, err)
	}
}

// SH-1-D (derived; Shopify publishes no vector).
func TestShopify(t *testing.T) {
	s, err := NewShopify("shop-secret")
	if err != nil {
		t.Fatal(err)
	}
	const sig = "plW8VGqq0nDMIEhDqaNNW99asdUCy7EIqLZVcQwtAZ0="
	now := time.Unix(1e9, 0)
	ev, err := s.Verify(hdr("X-Shopify-Hmac-Sha256", sig, "X-Shopify-Webhook-Id", "w1"), []byte(`{"id":1}`), now)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := BodyHash([]byte(`{"id":1}`)); ev.ID != want {
		t.Fatalf("id %s, want the body hash", ev.ID)
	}
	rot, _ := NewShopify("new-secret", "shop-secret")
	if _, err := rot.Verify(hdr("X-Shopify-Hmac-Sha256", sig), []byte(`{"id":1}`), now); err != nil {
		t.Fatalf("rotation: %v", err)
	}
	runNegative(t, s, "shop-secret", []verifyCase{
		{"wrong", hdr("X-Shopify-Hmac-Sha256", "AAAA"+sig[4:]), `{"id":1}`, now, ErrNoMatch},
		{"truncated", hdr("X-Shopify-Hmac-Sha256", sig[:20]), `{"id":1}`, now, ErrNoMatch},
		{"hex instead of base64", hdr("X-Shopify-Hmac-Sha256", strings.Repeat("a5", 32)), `{"id":1}`, now, ErrNoMatch},
		{"missing", hdr(), `{"id":1}`, now, ErrNoSignature},
		{"duplicated", hdr("X-Shopify-Hmac-Sha256", sig, "X-Shopify-Hmac-Sha256", sig), `{"id":1}`, now, ErrMalformed},
		{"changed body", hdr("X-Shopify-Hmac-Sha256", sig), `{"id":2}`, now, ErrNoMatch},
		{"not canonical base64", hdr("X-Shopify-Hmac-Sha256", nonCanonical(t, "x,"+sig)[2:]), `{"id":1}`, now, ErrNoMatch},
		{"padding dropped", hdr("X-Shopify-Hmac-Sha256", strings.TrimRight(sig, "=")), `{"id":1}`, now, ErrNoMatch},
	})
	wrong, _ := NewShopify("other")
	if _, err := wrong.Verify(hdr("X-Shopify-Hmac-Sha256", sig), []byte(`{"id":1}`), now); !errors.Is(err, ErrNoMatch) {
		t.Fatalf("wrong secret: %v", err)
	}
}

// SL-1: Slack's docs example, pinned in python-slack-sdk's tests.
const (
	sl1Secret = "8f742231b10e8888abcd99yyyzzz85a5"
	sl1TS     = "1531420618"
	sl1Body   = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
	sl1Sig    = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
)

func TestSlack(t *testing.T) {
	s, err := NewSlack(sl1Secret)
	if err != nil {
		t.Fatal(err)
	}
	now := unix(sl1TS)
	h := hdr("X-Slack-Request-Timestamp", sl1TS, "X-Slack-Signature", sl1Sig)
	if got, _ := s.Sign(h, []byte(sl1Body)); got != sl1Sig {
		t.Fatalf("Sign = %s, want %s", got, sl1Sig)
	}
	ev, err := s.Verify(h, []byte(sl1Body), now)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := BodyHash([]byte(sl1Body)); ev.ID != want || !ev.Timestamp.Equal(now) {
		t.Fatalf("event %+v", ev)
	}
	// Events API: the id is event_id, the same across retries with new
	// timestamps.
	body := `{"type":"event_callback","event_id":"Ev123","event":{}}`
	at := func(ts time.Time) http.Header {
		h := hdr("X-Slack-Request-Timestamp", formatUnix(ts))
		sig, _ := s.Sign(h, []byte(body))
		h.Set("X-Slack-Signature", sig)
		return h
	}
	for _, d := range []time.Duration{0, time.Minute} {
		ev, err := s.Verify(at(now.Add(d)), []byte(body), now.Add(d))
		if err != nil || ev.ID != "Ev123" {
			t.Fatalf("retry after %v: %+v, %v", d, ev, err)
		}
	}
	rot, _ := NewSlack("older", sl1Secret)
	if _, err := rot.Verify(h, []byte(sl1Body), now); err != nil {
		t.Fatalf("rotation: %v", err)
	}
	runNegative(t, s, sl1Secret, []verifyCase{
		{"wrong", hdr("X-Slack-Request-Timestamp", sl1TS, "X-Slack-Signature", "v0="+strings.Repeat("0", 64)), sl1Body, now, ErrNoMatch},
		{"truncated", hdr("X-Slack-Request-Timestamp", sl1TS, "X-Slack-Signature", sl1Sig[:30]), sl1Body, now, ErrNoMatch},
		{"unknown version", hdr("X-Slack-Request-Timestamp", sl1TS, "X-Slack-Signature", "v1="+sl1Sig[3:]), sl1Body, now, ErrUnknownVersion},
		{"missing signature", hdr("X-Slack-Request-Timestamp", sl1TS), sl1Body, now, ErrNoSignature},
		{"missing timestamp", hdr("X-Slack-Signature", sl1Sig), sl1Body, now, ErrNoSignature},
		{"bad timestamp", hdr("X-Slack-Request-Timestamp", "-1", "X-Slack-Signature", sl1Sig), sl1Body, now, ErrMalformed},
		{"duplicated timestamp", hdr("X-Slack-Request-Timestamp", sl1TS, "X-Slack-Request-Timestamp", "1", "X-Slack-Signature", sl1Sig), sl1Body, now, ErrMalformed},
		{"changed timestamp", hdr("X-Slack-Request-Timestamp", "1531420619", "X-Slack-Signature", sl1Sig), sl1Body, now, ErrNoMatch},
		{"stale", h, sl1Body, now.Add(301 * time.Second), ErrTooOld},
		{"future", h, sl1Body, now.Add(-301 * time.Second), ErrTooNew},
	})
	wrong, _ := NewSlack("not-the-secret")
	if _, err := wrong.Verify(h, []byte(sl1Body), now); !errors.Is(err, ErrNoMatch) {
		t.Fatalf("wrong secret: %v", err)
	}
}

func TestGenericHMAC(t *testing.T) {
	// Signed id and timestamp headers, base64url, two signatures separated
	// by spaces.
	cfg := HMACConfig{
		Header:          "X-Sig",
		Prefix:          "s1=",
		Separator:       " ",
		Encoding:        Base64URL,
		Signed:          []Part{HeaderValue("X-Id"), Literal("|"), HeaderValue("X-Ts"), Literal("|"), Body},
		TimestampHeader: "x-ts",
		IDHeader:        "x-id",
		Secrets:         []string{"k1", "k2"},
	}
	s, err := NewHMAC(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	h := hdr("X-Id", "ev_1", "X-Ts", formatUnix(now))
	sig, err := s.Sign(h, []byte("{}"))
	if err != nil || strings.Count(sig, "s1=") != 2 {
		t.Fatalf("Sign = %q, %v", sig, err)
	}
	h.Set("X-Sig", sig)
	ev, err := s.Verify(h, []byte("{}"), now)
	if err != nil || ev.ID != "ev_1" || !ev.Timestamp.Equal(now) {
		t.Fatalf("%+v, %v", ev, err)
	}
	// Only the second secret known to the receiver: still verifies.
	only2 := cfg
	only2.Secrets = []string{"k2"}
	s2, _ := NewHMAC(only2)
	if _, err := s2.Verify(h, []byte("{}"), now); err != nil {
		t.Fatalf("rotation: %v", err)
	}
	hID := hdr("X-Id", "ev|1", "X-Ts", formatUnix(now))
	hID.Set("X-Sig", sig)
	runNegative(t, s, "", []verifyCase{
		{"changed id", hdr("X-Id", "ev_2", "X-Ts", formatUnix(now), "X-Sig", sig), "{}", now, ErrNoMatch},
		{"id with a separator", hID, "{}", now, ErrMalformed},
		{"stale", h, "{}", now.Add(6 * time.Minute), ErrTooOld},
		{"no prefix", hdr("X-Id", "ev_1", "X-Ts", formatUnix(now), "X-Sig", strings.ReplaceAll(sig, "s1=", "")), "{}", now, ErrUnknownVersion},
		{"future", h, "{}", now.Add(-6 * time.Minute), ErrTooNew},
		{"missing signature", hdr("X-Id", "ev_1", "X-Ts", formatUnix(now)), "{}", now, ErrNoSignature},
		{"missing id header", hdr("X-Ts", formatUnix(now), "X-Sig", sig), "{}", now, ErrNoSignature},
		{"truncated", hdr("X-Id", "ev_1", "X-Ts", formatUnix(now), "X-Sig", sig[:12]), "{}", now, ErrNoMatch},
		{"wrong", hdr("X-Id", "ev_1", "X-Ts", formatUnix(now), "X-Sig", "s1="+strings.Repeat("A", 43)), "{}", now, ErrNoMatch},
		// More than 64 entries, the genuine ones first: refused (before, the
		// first 64 were read and this verified).
		{"65 entries", hdr("X-Id", "ev_1", "X-Ts", formatUnix(now), "X-Sig", sig+strings.Repeat(" s1=AAAA", 63)), "{}", now, ErrMalformed},
	})
	// Base64URL: padded or not, but canonical.
	const urlAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	first, _, _ := strings.Cut(sig, " ")
	raw := strings.TrimPrefix(first, "s1=")
	bits := urlAlphabet[strings.IndexByte(urlAlphabet, raw[len(raw)-1])|1]
	for v, want := range map[string]error{
		"s1=" + raw:                               nil,
		"s1=" + raw + "=":                         nil,
		"s1=" + raw + "==":                        ErrNoMatch,
		"s1=" + raw[:len(raw)-1] + string(bits):   ErrNoMatch,
		"s1=" + raw[:20] + "\n" + raw[20:]:        ErrNoMatch,
		"s1=" + strings.ReplaceAll(raw, "_", "/"): ErrNoMatch,
	} {
		hv := hdr("X-Id", "ev_1", "X-Ts", formatUnix(now), "X-Sig", v)
		if _, err := s.Verify(hv, []byte("{}"), now); !errors.Is(err, want) && !(want == nil && err == nil) {
			t.Errorf("X-Sig %q: %v, want %v", v, err, want)
		}
	}
	// 64 entries, the genuine ones last, still verify.
	h64 := hdr("X-Id", "ev_1", "X-Ts", formatUnix(now), "X-Sig", strings.Repeat("s1=AAAA ", 62)+sig)
	if _, err := s.Verify(h64, []byte("{}"), now); err != nil {
		t.Fatalf("64 entries: %v", err)
	}
	other := cfg
	other.Secrets = []string{"k3"}
	s3, _ := NewHMAC(other)
	if _, err := s3.Verify(h, []byte("{}"), now); !errors.Is(err, ErrNoMatch) {
		t.Fatalf("wrong secret: %v", err)
	}
	// An id or timestamp header outside the signed content is refused at
	// construction: an unsigned id could be changed by a replayer.
	bad := cfg
	bad.Signed = []Part{Body}
	if _, err := NewHMAC(bad); err == nil {
		t.Fatal("NewHMAC accepted an unsigned id header")
	}
	if _, err := NewHMAC(HMACConfig{Header: "X-Sig"}); !errors.Is(err, ErrNoSecret) {
		t.Fatalf("no secret: %v", err)
	}
	if _, err := NewHMAC(HMACConfig{Secrets: []string{"k"}}); err == nil {
		t.Fatal("NewHMAC accepted no header")
	}
}

// An id header that touches another variable part of the signed content
// (no literal between them) lets one signed delivery verify under another
// id: id "evt_10" with timestamp 1614265330 signs the same bytes as id
// "evt_1" with timestamp "01614265330", the same instant, so a replay would
// be captured a second time. NewHMAC refuses such a configuration.
func TestGenericHMACIDHeaderDelimited(t *testing.T) {
	now := time.Unix(1614265330, 0)
	for _, signed := range [][]Part{
		{HeaderValue("X-Id"), HeaderValue("X-Ts"), Literal("."), Body},
		{HeaderValue("X-Ts"), Literal("."), HeaderValue("X-Id"), Body},
		{HeaderValue("X-Ts"), HeaderValue("X-Id"), Literal("."), Body},
		{HeaderValue("X-Ts"), Literal(""), HeaderValue("X-Id"), Literal("."), Body},
	} {
		s, err := NewHMAC(HMACConfig{Header: "X-Sig", Signed: signed, TimestampHeader: "X-Ts", IDHeader: "X-Id", Secrets: []string{"k"}})
		if err != nil {
			continue
		}
		h := hdr("X-Id", "evt_10", "X-Ts", "1614265330")
		sig, _ := s.Sign(h, []byte("{}"))
		forged := hdr("X-Id", "evt_1", "X-Ts", "01614265330", "X-Sig", sig)
		if ev, err := s.Verify(forged, []byte("{}"), now); err == nil {
			t.Errorf("parts %v: a delivery signed for evt_10 verified as %q", signed, ev.ID)
		} else {
			t.Errorf("parts %v: accepted an id header not delimited by literals", signed)
		}
	}
	// Delimited on both sides, or at an end of the content: accepted.
	for _, signed := range [][]Part{
		{HeaderValue("X-Id"), Literal("."), HeaderValue("X-Ts"), Literal("."), Body},
		{HeaderValue("X-Ts"), Literal("."), Body, Literal("."), HeaderValue("X-Id")},
	} {
		if _, err := NewHMAC(HMACConfig{Header: "X-Sig", Signed: signed, TimestampHeader: "X-Ts", IDHeader: "X-Id", Secrets: []string{"k"}}); err != nil {
			t.Errorf("parts %v: %v", signed, err)
		}
	}
}

// With a part that may hold a literal's byte on both sides of the id (a
// header, the body), bytes move across the id's boundaries: a delivery of
// tenant "acme.eu", id "evt_1" verifies as tenant "acme", id "eu", with
// "evt_1." prepended to the body, and would be captured a second time.
// NewHMAC refuses such a configuration; it accepts an id anchored on one
// side by literals and the (digits-only) timestamp.
func TestGenericHMACIDHeaderAnchored(t *testing.T) {
	for _, signed := range [][]Part{
		{HeaderValue("X-Tenant"), Literal("."), HeaderValue("X-Id"), Literal("."), Body},
		{Body, Literal("."), HeaderValue("X-Id"), Literal("."), HeaderValue("X-Tenant")},
		{HeaderValue("X-Ts"), Literal("."), HeaderValue("X-Tenant"), Literal("."), HeaderValue("X-Id"), Literal("."), Body},
	} {
		s, err := NewHMAC(HMACConfig{Header: "X-Sig", Signed: signed, TimestampHeader: "X-Ts", IDHeader: "X-Id", Secrets: []string{"k"}})
		if err != nil {
			continue
		}
		h := hdr("X-Tenant", "acme.eu", "X-Id", "evt_1", "X-Ts", "1614265330")
		sig, _ := s.Sign(h, []byte("{}"))
		forged := hdr("X-Tenant", "acme", "X-Id", "eu", "X-Ts", "1614265330", "X-Sig", sig)
		if ev, err := s.Verify(forged, []byte("evt_1.{}"), time.Unix(1614265330, 0)); err == nil {
			t.Errorf("parts %v: a delivery signed for evt_1 verified as %q", signed, ev.ID)
		} else {
			t.Errorf("parts %v: accepted an id with a variable part on both sides", signed)
		}
	}
	for _, signed := range [][]Part{
		{HeaderValue("X-Ts"), Literal("."), HeaderValue("X-Id"), Literal("."), Body},
		{Literal("v1:"), HeaderValue("X-Id"), Literal(":"), HeaderValue("X-Tenant"), Literal(":"), HeaderValue("X-Ts"), Literal(":"), Body},
	} {
		if _, err := NewHMAC(HMACConfig{Header: "X-Sig", Signed: signed, TimestampHeader: "X-Ts", IDHeader: "X-Id", Secrets: []string{"k"}}); err != nil {
			t.Errorf("parts %v: %v", signed, err)
		}
	}
}

func TestEventIDChecks(t *testing.T) {
	s, _ := NewStripe("k")
	now := time.Unix(1e9, 0)
	for _, c := range []struct {
		body string
		want error
	}{
		{`{"id":"evt\u0000x"}`, ErrInvalidEventID},
		{`{"id":"evt\nx"}`, ErrInvalidEventID},
		{"{\"id\":\"evt\xffx\"}", ErrInvalidEventID},
		{`{"id":""}`, ErrNoEventID},
		{`{"id":5}`, ErrNoEventID},
		{`[1]`, ErrNoEventID},
	} {
		_, err := s.Verify(hdr("Stripe-Signature", s.Sign(now, []byte(c.body))), []byte(c.body), now)
		if !errors.Is(err, c.want) || Unauthentic(err) {
			t.Errorf("body %q: %v, want %v", c.body, err, c.want)
		}
	}
	// A Standard Webhooks id that is not UTF-8 (headers may carry any
	// octet): authentic, refused as an invalid id.
	sw := mustStandard(t, sw1Secret)
	id := "msg_\xff\xfe"
	h := swHeader("webhook", id, formatUnix(now), sw.Sign(id, now, []byte("{}")))
	if _, err := sw.Verify(h, []byte("{}"), now); !errors.Is(err, ErrInvalidEventID) {
		t.Fatalf("non-UTF-8 id: %v", err)
	}
}
