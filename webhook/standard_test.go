package webhook

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/store"
)

// Official vectors: standard-webhooks libraries' TestWebhookSign (SW-1) and
// the Rust library's test_sign (SW-2); SW-v1a-D is derived from RFC 8032
// TEST 1 (no official v1a vector exists).
const (
	sw1Secret  = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	sw1ID      = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	sw1TS      = "1614265330"
	sw1Body    = `{"test": 2432232314}`
	sw1Sig     = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	sw2Secret  = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
	sw2ID      = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk"
	sw2TS      = "1649367553"
	sw2Body    = `{"email":"test@example.com","username":"test_user"}`
	sw2Sig     = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="
	swv1aPub   = "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="
	swv1aSeed  = "nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A="
	swv1aSig   = "v1a,fldxM4gAKugP6nnt1hdz3sgGfZ6d99nzrMFnZOELIxbzEHoVmAb2ADpkJK7zgPePmPsle0zV9jSeGlHFG2NVAw=="
	swWrongSig = "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="
)

func unix(s string) time.Time {
	t, err := parseUnix(s)
	if err != nil {
		panic(err)
	}
	return t
}

func swHeader(prefix, id, ts, sig string) http.Header {
	h := http.Header{}
	h.Set(prefix+"-id", id)
	h.Set(prefix+"-timestamp", ts)
	h.Set(prefix+"-signature", sig)
	return h
}

func mustStandard(t *testing.T, keys ...string) *Standard {
	t.Helper()
	s, err := NewStandard(keys...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestStandardOfficialVectors(t *testing.T) {
	for _, v := range []struct{ name, secret, id, ts, body, sig string }{
		{"SW-1", sw1Secret, sw1ID, sw1TS, sw1Body, sw1Sig},
		{"SW-2", sw2Secret, sw2ID, sw2TS, sw2Body, sw2Sig},
	} {
		t.Run(v.name, func(t *testing.T) {
			s := mustStandard(t, v.secret)
			if got := s.Sign(v.id, unix(v.ts), []byte(v.body)); got != v.sig {
				t.Fatalf("Sign = %s, want the official %s", got, v.sig)
			}
			for _, prefix := range []string{"webhook", "svix"} {
				ev, err := s.Verify(swHeader(prefix, v.id, v.ts, v.sig), []byte(v.body), unix(v.ts))
				if err != nil {
					t.Fatalf("%s headers: %v", prefix, err)
				}
				if ev.ID != v.id || !ev.Timestamp.Equal(unix(v.ts)) {
					t.Fatalf("%s headers: event %+v", prefix, ev)
				}
			}
			// Without the whsec_ prefix the secret verifies the same.
			s2 := mustStandard(t, strings.TrimPrefix(v.secret, "whsec_"))
			if _, err := s2.Verify(swHeader("webhook", v.id, v.ts, v.sig), []byte(v.body), unix(v.ts)); err != nil {
				t.Fatalf("secret without prefix: %v", err)
			}
		})
	}
}

func TestStandardV1aDerivedVector(t *testing.T) {
	seed, _ := base64.StdEncoding.DecodeString(swv1aSeed)
	priv := ed25519.NewKeyFromSeed(seed)
	if got := "whpk_" + base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey)); got != swv1aPub {
		t.Fatalf("public key of the seed = %s, want %s", got, swv1aPub)
	}
	s := mustStandard(t, swv1aPub)
	ev, err := s.Verify(swHeader("webhook", sw1ID, sw1TS, swv1aSig), []byte(sw1Body), unix(sw1TS))
	if err != nil || ev.ID != sw1ID {
		t.Fatalf("v1a: %+v, %v", ev, err)
	}
	// A public key never verifies a v1 HMAC, nor an HMAC secret a v1a.
	if _, err := s.Verify(swHeader("webhook", sw1ID, sw1TS, sw1Sig), []byte(sw1Body), unix(sw1TS)); !errors.Is(err, ErrUnknownVersion) {
		t.Fatalf("v1 under a v1a-only scheme: %v, want ErrUnknownVersion", err)
	}
	// Mixed keys: either signature verifies.
	both := mustStandard(t, sw1Secret, swv1aPub)
	for _, sig := range []string{sw1Sig, swv1aSig, "v1a,AAAA " + swv1aSig} {
		if _, err := both.Verify(swHeader("webhook", sw1ID, sw1TS, sig), []byte(sw1Body), unix(sw1TS)); err != nil {
			t.Fatalf("%q: %v", sig, err)
		}
	}
	// A changed body fails under v1a.
	if _, err := s.Verify(swHeader("webhook", sw1ID, sw1TS, swv1aSig), []byte(sw1Body+" "), unix(sw1TS)); !errors.Is(err, ErrNoMatch) {
		t.Fatalf("changed body: %v", err)
	}
}

func TestStandardRotation(t *testing.T) {
	// Old and new secret configured: a signature under either verifies, and
	// the reference's multi-signature header (unknown v2 skipped) passes.
	s := mustStandard(t, sw2Secret, sw1Secret)
	h := swHeader("webhook", sw1ID, sw1TS, "v1,"+strings.Repeat("A", 43)+"= v2,abc "+sw1Sig+" v1,bad")
	if _, err := s.Verify(h, []byte(sw1Body), unix(sw1TS)); err != nil {
		t.Fatal(err)
	}
}

func TestStandardNegative(t *testing.T) {
	s := mustStandard(t, sw1Secret)
	now := unix(sw1TS)
	body := []byte(sw1Body)
	at := func(ts time.Time) http.Header {
		v := s.Sign(sw1ID, ts, body)
		return swHeader("webhook", sw1ID, formatUnix(ts), v)
	}
	dup := swHeader("webhook", sw1ID, sw1TS, sw1Sig)
	dup.Add("Webhook-Id", "msg_other")
	dupSig := swHeader("webhook", sw1ID, sw1TS, sw1Sig)
	dupSig.Add("Webhook-Signature", sw1Sig)
	for _, c := range []struct {
		name string
		h    http.Header
		body string
		now  time.Time
		want error
	}{
		{"wrong signature", swHeader("webhook", sw1ID, sw1TS, swWrongSig), sw1Body, now, ErrNoMatch},
		{"empty signature", swHeader("webhook", sw1ID, sw1TS, "v1,"), sw1Body, now, ErrNoMatch},
		{"truncated signature", swHeader("webhook", sw1ID, sw1TS, sw1Sig[:8]), sw1Body, now, ErrNoMatch},
		{"signature without comma", swHeader("webhook", sw1ID, sw1TS, "v1"+sw1Sig[3:]), sw1Body, now, ErrUnknownVersion},
		{"unknown version only", swHeader("webhook", sw1ID, sw1TS, "v2"+sw1Sig[2:]), sw1Body, now, ErrUnknownVersion},
		{"changed body", swHeader("webhook", sw1ID, sw1TS, sw1Sig), sw1Body + "\n", now, ErrNoMatch},
		{"re-serialized body", swHeader("webhook", sw1ID, sw1TS, sw1Sig), `{"test":2432232314}`, now, ErrNoMatch},
		{"changed id", swHeader("webhook", "msg_other", sw1TS, sw1Sig), sw1Body, now, ErrNoMatch},
		{"changed timestamp", swHeader("webhook", sw1ID, "946684800", sw1Sig), sw1Body, now, ErrNoMatch},
		{"wrong secret", swHeader("webhook", sw2ID, sw2TS, sw2Sig), sw2Body, unix(sw2TS), ErrNoMatch},
		{"missing id", swHeader("webhook", "", sw1TS, sw1Sig), sw1Body, now, ErrNoSignature},
		{"missing timestamp", swHeader("webhook", sw1ID, "", sw1Sig), sw1Body, now, ErrNoSignature},
		{"missing signature", swHeader("webhook", sw1ID, sw1TS, ""), sw1Body, now, ErrNoSignature},
		{"no headers", http.Header{}, sw1Body, now, ErrNoSignature},
		{"non-numeric timestamp", swHeader("webhook", sw1ID, "16142653a0", sw1Sig), sw1Body, now, ErrMalformed},
		{"signed timestamp", swHeader("webhook", sw1ID, "+1614265330", sw1Sig), sw1Body, now, ErrMalformed},
		{"id with a dot", swHeader("webhook", "msg.1", sw1TS, sw1Sig), sw1Body, now, ErrMalformed},
		{"duplicated id header", dup, sw1Body, now, ErrMalformed},
		{"duplicated signature header", dupSig, sw1Body, now, ErrMalformed},
		{"stale: now-5m", at(now.Add(-5 * time.Minute)), sw1Body, now.Add(time.Second / 2), ErrTooOld},
		{"stale: an hour", swHeader("webhook", sw1ID, sw1TS, sw1Sig), sw1Body, now.Add(time.Hour), ErrTooOld},
		{"future: now+5m+1s", at(now.Add(5*time.Minute + time.Second)), sw1Body, now, ErrTooNew},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := s.Verify(c.h, []byte(c.body), c.now)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if !Unauthentic(err) {
				t.Fatalf("%v is not reported as unauthentic (401)", err)
			}
			if strings.Contains(err.Error(), "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw") {
				t.Fatalf("error echoes the secret: %v", err)
			}
		})
	}
	// Inside the tolerance either way, and with the check off, it passes.
	for _, d := range []time.Duration{-5*time.Minute + time.Second, 5 * time.Minute} {
		if _, err := s.Verify(at(now.Add(d)), body, now); err != nil {
			t.Fatalf("timestamp now%+v: %v", d, err)
		}
	}
	loose := mustStandard(t, sw1Secret)
	loose.Tolerance = -1
	if _, err := loose.Verify(swHeader("webhook", sw1ID, sw1TS, sw1Sig), body, now.Add(24*time.Hour)); err != nil {
		t.Fatalf("tolerance off: %v", err)
	}
	if _, err := loose.Verify(swHeader("webhook", sw1ID, "946684800", sw1Sig), body, now); !errors.Is(err, ErrNoMatch) {
		t.Fatalf("tolerance off, changed timestamp: %v (the timestamp is signed)", err)
	}
	wide := mustStandard(t, sw1Secret)
	wide.Tolerance = 2 * time.Hour
	if _, err := wide.Verify(swHeader("webhook", sw1ID, sw1TS, sw1Sig), body, now.Add(time.Hour)); err != nil {
		t.Fatalf("tolerance 2h, an hour old: %v", err)
	}
}

func TestStandardSecrets(t *testing.T) {
	for _, k := range []string{"", "whsec_", "whsec_!!!", "whpk_AAAA", "whpk_"} {
		if _, err := NewStandard(k); !errors.Is(err, ErrNoSecret) {
			t.Errorf("NewStandard(%q): %v, want ErrNoSecret", k, err)
		}
	}
	if _, err := NewStandard(); !errors.Is(err, ErrNoSecret) {
		t.Errorf("NewStandard(): %v", err)
	}
	s := mustStandard(t, sw1Secret, swv1aPub)
	if str := s.String(); strings.Contains(str, "MfKQ") {
		t.Fatalf("String() shows a secret: %s", str)
	}
}

// nonCanonical rewrites a "<version>,<base64>" signature so that it decodes
// to the same bytes under a lenient decoder but is not the canonical
// encoding: the last character before the padding gets an unused bit set.
func nonCanonical(t *testing.T, sig string) string {
	t.Helper()
	version, b64, _ := strings.Cut(sig, ",")
	trimmed := strings.TrimRight(b64, "=")
	last := strings.IndexByte(base64Alphabet, trimmed[len(trimmed)-1])
	out := version + "," + trimmed[:len(trimmed)-1] + string(base64Alphabet[last|1]) + b64[len(trimmed):]
	want, _ := base64.StdEncoding.DecodeString(b64)
	got, err := base64.StdEncoding.DecodeString(out[len(version)+1:])
	if err != nil || string(got) != string(want) || out == sig {
		t.Fatalf("%s is not a non-canonical spelling of %s (%v)", out, sig, err)
	}
	return out
}

const base64Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

// The signature header is read as strictly as the references write it, and
// in the cases the package doc lists, more strictly than their libraries:
// each case below verified before (except where noted) and is refused now,
// by Verify and by a Receiver (401, nothing claimed, nothing captured).
func TestStandardStrictHeaders(t *testing.T) {
	s := mustStandard(t, sw1Secret, swv1aPub)
	now := unix(sw1TS)
	many := func(n int, last string) string {
		return strings.TrimSpace(strings.Repeat(swWrongSig+" ", n-1) + last)
	}
	both := swHeader("webhook", sw1ID, sw1TS, sw1Sig)
	for k, v := range swHeader("svix", sw1ID, sw1TS, sw1Sig) {
		both[k] = v
	}
	bothDiffer := swHeader("webhook", sw1ID, sw1TS, sw1Sig)
	for k, v := range swHeader("svix", sw1ID, sw1TS, swWrongSig) {
		bothDiffer[k] = v
	}
	stray := swHeader("svix", sw1ID, sw1TS, sw1Sig)
	stray.Set("Webhook-Id", sw1ID)
	dupTS := swHeader("webhook", sw1ID, sw1TS, sw1Sig)
	dupTS.Add("Webhook-Timestamp", sw1TS)
	dupSig := swHeader("webhook", sw1ID, sw1TS, sw1Sig)
	dupSig.Add("Webhook-Signature", sw1Sig)
	sig := func(v string) http.Header { return swHeader("webhook", sw1ID, sw1TS, v) }
	for _, c := range []struct {
		name string
		h    http.Header
		want error
	}{
		// Separators: one ASCII space, nothing else.
		{"two spaces", sig(swWrongSig + "  " + sw1Sig), ErrMalformed},
		{"tab", sig(swWrongSig + "\t" + sw1Sig), ErrMalformed},
		{"NBSP", sig(swWrongSig + "\u00a0" + sw1Sig), ErrMalformed},
		{"CRLF", sig(swWrongSig + "\r\n" + sw1Sig), ErrMalformed},
		{"folded line", sig(swWrongSig + "\r\n " + sw1Sig), ErrMalformed},
		{"LF", sig(swWrongSig + "\n" + sw1Sig), ErrMalformed},
		{"leading space", sig(" " + sw1Sig), ErrMalformed},
		{"trailing space", sig(sw1Sig + " "), ErrMalformed},
		{"trailing CRLF", sig(sw1Sig + "\r\n"), ErrMalformed},
		{"line break inside the base64", sig(sw1Sig[:20] + "\n" + sw1Sig[20:]), ErrMalformed}, // before: ErrNoMatch
		// Canonical base64 only.
		{"v1, unused bits set", sig(nonCanonical(t, sw1Sig)), ErrNoMatch},
		{"v1a, unused bits set", sig(nonCanonical(t, swv1aSig)), ErrNoMatch},
		{"v1, padding dropped", sig(strings.TrimRight(sw1Sig, "=")), ErrNoMatch}, // before: ErrNoMatch too
		{"v1, URL alphabet", sig(strings.NewReplacer("+", "-", "/", "_").Replace(sw1Sig)), ErrNoMatch},
		// Stricter than the libraries (see the package doc).
		{"65 signatures, the genuine one first", sig(sw1Sig + " " + many(64, swWrongSig)), ErrMalformed},
		{"65 signatures, the genuine one last", sig(many(65, sw1Sig)), ErrMalformed}, // before: ErrNoMatch (not read)
		{"webhook-* and svix-* that differ", bothDiffer, ErrMalformed},
		{"svix-* and a stray webhook-id", stray, ErrMalformed}, // before: ErrNoSignature
		{"repeated timestamp header", dupTS, ErrMalformed},     // before: ErrMalformed too
		{"repeated signature header", dupSig, ErrMalformed},    // before: ErrMalformed too
		{"timestamp with a sign", swHeader("webhook", sw1ID, "+"+sw1TS, sw1Sig), ErrMalformed},
		{"timestamp with leading space", swHeader("webhook", sw1ID, " "+sw1TS, sw1Sig), ErrMalformed},
		{"timestamp in milliseconds", swHeader("webhook", sw1ID, sw1TS+"000000", sw1Sig), ErrMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := s.Verify(c.h, []byte(sw1Body), now); !errors.Is(err, c.want) || !Unauthentic(err) {
				t.Fatalf("Verify: %v, want %v (401)", err, c.want)
			}
			e := newEnv(t)
			rc, err := NewReceiver("acme", s, e.l, PublishTx[*sql.Tx](e.pub), WithLogger(quiet),
				WithClock(func() time.Time { return now }))
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest(http.MethodPost, "/hooks", strings.NewReader(sw1Body))
			r.Header = c.h.Clone()
			a := serve(rc, r)
			if a.status != http.StatusUnauthorized {
				t.Fatalf("Receiver: %d %s, want 401", a.status, a.body)
			}
			if p := problemOf(t, a); p.Type != ProblemTypePrefix+"signature-invalid" {
				t.Fatalf("problem %+v", p)
			}
			if n := len(e.pub.messages(t)); n != 0 {
				t.Fatalf("a refused delivery was captured (%d messages)", n)
			}
			if _, err := e.l.Store().Get(context.Background(), Key("acme", sw1ID).String()); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("a refused delivery touched the ledger: Get = %v, want ErrNotFound", err)
			}
		})
	}
	// The same signatures, written as the references write them, verify.
	for _, v := range []string{sw1Sig, swv1aSig, swWrongSig + " " + sw1Sig, many(64, sw1Sig), "v2,x " + swv1aSig} {
		if _, err := s.Verify(sig(v), []byte(sw1Body), now); err != nil {
			t.Errorf("%.40q...: %v", v, err)
		}
	}
	if _, err := s.Verify(swHeader("svix", sw1ID, sw1TS, sw1Sig), []byte(sw1Body), now); err != nil {
		t.Errorf("svix-* alone: %v", err)
	}
	if _, err := s.Verify(both, []byte(sw1Body), now); err != nil {
		t.Errorf("webhook-* and svix-* saying the same: %v", err)
	}
}
