package httpidem

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

// TestLegacyFingerprintGolden: the legacy fingerprint is, byte for byte,
// what httpidem stored with WithCanonicalJSON before it canonicalised JSON
// per RFC 8785 (the values were computed by that version), and the new one
// differs for every JSON body it canonicalises: records written before the
// upgrade need the fallback.
func TestLegacyFingerprintGolden(t *testing.T) {
	m := New(idem.New(memstore.New()), WithCanonicalJSON(true))
	for _, c := range []struct {
		body, was string
		changed   bool
	}{
		{`{"b":1.0,"a":"x"}`, "80f719ad09319f569b6a96ec2bf8a98b6cd977472e5a6be2756d448a175adc7d", true},
		{`{"amount":1000,"currency":"eur"}`, "23809e0c8374b01e5a5fa288de1678f3f0129d5f269c5bf535fce80710abc1e0", true},
		{`{"a":"\ufffd"}`, "ca0f0e2b903d2bae92bf01f27765891c50d254b0badcf4ded510a6d0f4bda87a", true},
		{`[9007199254740993]`, "d3904fd87c840a538038578e1ee242b400220622bc7f5006b7ce6d2168959042", true},
		{`not json`, "2a9dd38a08791418c2a2dda92f872d2be19cafd9bf439cfd76206299ee23b09b", false},
	} {
		r := httptest.NewRequest(http.MethodPost, "/charges?b=2&a=1", strings.NewReader(c.body))
		r.Header.Set("Content-Type", "application/json; charset=utf-8")
		if got := store.FingerprintOf(m.fingerprintWith(r, []byte(c.body), legacyCanonicalJSON)); got != c.was {
			t.Errorf("%s: legacy fingerprint %s, want %s (the old version's)", c.body, got, c.was)
		}
		legacy, ok := m.legacyFingerprint(r, []byte(c.body))
		if now := store.FingerprintOf(m.fingerprint(r, []byte(c.body))); (now != c.was) != c.changed || ok != c.changed ||
			(ok && store.FingerprintOf(legacy) != c.was) {
			t.Errorf("%s: fingerprint %s (was %s), legacy %x, %v; want changed %v", c.body, now, c.was, legacy, ok, c.changed)
		}
	}
}

// TestUpgradeFromLegacyCanonicalJSON: a key recorded by an httpidem that
// canonicalised JSON the old way (its record carries the old fingerprint)
// is, after the upgrade, still "the same request" for a retry: completed,
// the retry is replayed (not refused with 422 key-reused); lapsed, the
// retry takes it over. Another request under such a key still gets 422.
func TestUpgradeFromLegacyCanonicalJSON(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	l := idem.New(s, idem.WithLogger(slog.New(slog.DiscardHandler)))
	m := New(l, WithCanonicalJSON(true), WithLogger(slog.New(slog.DiscardHandler)))
	runs := 0
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "made")
	}))
	send := func(key, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set(HeaderKey, `"`+key+`"`)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	// oldFingerprint is what the old version gave idem.Fingerprint.
	oldFingerprint := func(body string) []byte {
		r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		old := m.fingerprintWith(r, []byte(body), legacyCanonicalJSON)
		if bytes.Equal(old, m.fingerprint(r, []byte(body))) {
			t.Fatalf("%s: the fingerprint did not change; the test shows nothing", body)
		}
		return old
	}
	const body = `{"b":1.0,"a":"x","n":[1e2]}`

	// Completed by the old version: its response is replayed.
	_, err := l.Do(ctx, idem.Key("http", "done"), func(context.Context) ([]byte, error) {
		return (&response{status: http.StatusCreated, body: []byte("first")}).encode(), nil
	}, idem.Fingerprint(oldFingerprint(body)))
	if err != nil {
		t.Fatal(err)
	}
	for _, retry := range []string{body, `{ "n": [1e2], "a": "x", "b": 1.0 }`} {
		if w := send("done", retry); w.Code != http.StatusCreated || w.Body.String() != "first" || w.Header().Get(HeaderReplayed) != "true" || runs != 0 {
			t.Errorf("retry %s after the upgrade: %d %q replayed=%q, handler ran %d times; want the first response replayed",
				retry, w.Code, w.Body, w.Header().Get(HeaderReplayed), runs)
		}
	}
	// 1.0 and 1 were different requests to the old version (numbers as
	// written), so a record it wrote for one is not found for the other;
	// nor is another request.
	for _, other := range []string{`{"b":1,"a":"x","n":[100]}`, `{"b":2.0,"a":"x","n":[1e2]}`} {
		if w := send("done", other); w.Code != http.StatusUnprocessableEntity || runs != 0 {
			t.Errorf("%s under the old record's key: %d %q, handler ran %d times; want 422", other, w.Code, w.Body, runs)
		}
	}

	// Lapsed under the old version (its process died): a retry takes it
	// over and runs; another request does not.
	for _, key := range []string{"lapsed-same", "lapsed-other"} {
		_, err = s.Claim(ctx, store.ClaimRequest{Key: idem.Key("http", key).String(), AttemptID: store.NewAttemptID(), Owner: "old",
			Lease: time.Millisecond, Retention: time.Hour, Fingerprint: store.FingerprintOf(oldFingerprint(body))})
		if err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond)
	if w := send("lapsed-other", `{"b":2.0,"a":"x","n":[1e2]}`); w.Code != http.StatusUnprocessableEntity || runs != 0 {
		t.Errorf("another request on a lapsed old attempt: %d %q, handler ran %d times; want 422", w.Code, w.Body, runs)
	}
	if w := send("lapsed-same", `{"a":"x","b":1.0,"n":[1e2]}`); w.Code != http.StatusCreated || w.Body.String() != "made" || runs != 1 {
		t.Errorf("retry of a lapsed old attempt: %d %q, handler ran %d times; want it taken over", w.Code, w.Body, runs)
	}
	// The attempt that took over ran under the old fingerprint (the one
	// the record had), so the key keeps the old version's "same request":
	// 1.0 and 1 differ there until the record expires.
	if w := send("lapsed-same", `{"n":[1e2],"b":1.0,"a":"x"}`); w.Code != http.StatusCreated || w.Body.String() != "made" || w.Header().Get(HeaderReplayed) != "true" || runs != 1 {
		t.Errorf("retry after the takeover: %d %q, handler ran %d times; want the replay", w.Code, w.Body, runs)
	}
	// What the new version records, RFC 8785 decides: 1.0 and 1 are one.
	if w := send("new", body); w.Code != http.StatusCreated || runs != 2 {
		t.Fatalf("new key: %d %q, handler ran %d times", w.Code, w.Body, runs)
	}
	if w := send("new", `{"n":[100],"a":"x","b":1}`); w.Code != http.StatusCreated || w.Body.String() != "made" || w.Header().Get(HeaderReplayed) != "true" || runs != 2 {
		t.Errorf("retry of a new key, numbers written otherwise: %d %q, handler ran %d times; want the replay", w.Code, w.Body, runs)
	}
}
