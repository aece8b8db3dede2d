package main

import (
	"context"
	"encoding/base64"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// seedList writes, by the store's calls, one record of each state a
// console lists, and returns the time of the last change: invoice:2 was
// claimed after the others lapsed.
//
//	invoice:1 completed   invoice:2 in_progress (running)
//	order:1   completed   order:2   failed (its reason names the key)
//	order:3   indeterminate (at_most_once, lapsed)   order:4 lapsed
func seedList(t *testing.T, s store.Store, advance func(time.Duration)) idem.Record {
	t.Helper()
	ctx := context.Background()
	claim := func(key string, p idem.Policy, lease time.Duration) store.ClaimResult {
		t.Helper()
		cr, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: key, Owner: "w", Policy: p, Lease: lease, Retention: time.Hour})
		if err != nil || !cr.Acquired {
			t.Fatalf("claim %s: %v %+v", key, err, cr)
		}
		return cr
	}
	finish := func(cr store.ClaimResult, o store.Outcome, reason string) {
		t.Helper()
		if err := s.Finish(ctx, store.FinishRequest{Key: cr.Record.Key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID,
			Outcome: o, Result: []byte("r"), Reason: reason, Retention: time.Hour}); err != nil {
			t.Fatalf("finish %s: %v", cr.Record.Key, err)
		}
	}
	finish(claim("invoice:1", idem.AtLeastOnce, time.Minute), store.OutcomeCompleted, "")
	finish(claim("order:1", idem.AtLeastOnce, time.Minute), store.OutcomeCompleted, "")
	finish(claim("order:2", idem.AtLeastOnce, time.Minute), store.OutcomeFailed, `card declined for "order:2"`)
	claim("order:3", idem.AtMostOnce, 300*time.Millisecond)
	claim("order:4", idem.AtLeastOnce, 300*time.Millisecond)
	advance(time.Second)
	claim("invoice:2", idem.AtLeastOnce, time.Hour)
	rec, err := s.Get(ctx, "invoice:2")
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// listKeys reads GET /v1/records?query, following next_cursor to the end
// with pages of limit, and returns the keys (key_hash when key is absent)
// and the states of the records listed.
func listKeys(t *testing.T, c *api, query string, limit int) (keys, states []string) {
	t.Helper()
	v, err := url.ParseQuery(query)
	if err != nil {
		t.Fatal(err)
	}
	v.Set("limit", strconv.Itoa(limit))
	for range 20 {
		a := c.do("GET", "/v1/records?"+v.Encode(), "").expect(t, 200, "")
		recs, ok := a.body["records"].([]any)
		if !ok {
			t.Fatalf("GET /v1/records?%s: no records array: %s", v.Encode(), a)
		}
		if len(recs) > limit {
			t.Fatalf("GET /v1/records?%s: %d records", v.Encode(), len(recs))
		}
		for _, r := range recs {
			m := r.(map[string]any)
			k, _ := m["key"].(string)
			if k == "" {
				k, _ = m["key_hash"].(string)
			}
			st, _ := m["state"].(string)
			keys, states = append(keys, k), append(states, st)
		}
		next := a.str("next_cursor")
		if next == "" {
			return keys, states
		}
		if len(recs) != limit {
			t.Fatalf("GET /v1/records?%s: a page of %d records before the last, want %d: %s", v.Encode(), len(recs), limit, a)
		}
		v.Set("cursor", next)
	}
	t.Fatalf("GET /v1/records?%s: more than 20 pages", query)
	return nil, nil
}

// TestServeList lists records through GET /v1/records with each filter,
// a page at a time, and reads a key's story, on each store.
func TestServeList(t *testing.T) {
	for _, b := range serveBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			s, advance := b.open(t)
			last := seedList(t, s, advance)
			c, logs := newServeTest(t, s, "", false)
			after := last.UpdatedAt.Add(-time.Nanosecond).UTC().Format(time.RFC3339Nano)
			before := last.UpdatedAt.UTC().Format(time.RFC3339Nano)
			for _, tc := range []struct {
				query  string
				keys   string
				states string
			}{
				{"", "invoice:1 invoice:2 order:1 order:2 order:3 order:4", "completed in_progress completed failed indeterminate lapsed"},
				{"indeterminate=true", "order:3", "indeterminate"},
				{"status=indeterminate", "order:3", "indeterminate"},
				{"stuck=true", "order:3 order:4", "indeterminate lapsed"},
				{"lapsed=1", "order:3 order:4", "indeterminate lapsed"},
				{"status=lapsed", "order:4", "lapsed"},
				{"status=in_progress", "invoice:2", "in_progress"},
				{"status=completed", "invoice:1 order:1", "completed completed"},
				{"prefix=order:&status=failed", "order:2", "failed"},
				{"prefix=order:", "order:1 order:2 order:3 order:4", "completed failed indeterminate lapsed"},
				{"prefix=invoice", "invoice:1 invoice:2", "completed in_progress"},
				{"prefix=nope", "", ""},
				{"updated_after=" + after, "invoice:2", "in_progress"},
				{"updated_before=" + before + "&prefix=order:&stuck=true", "order:3 order:4", "indeterminate lapsed"},
				{"updated_after=" + before, "", ""},
			} {
				for _, limit := range []int{1, 2, 7} {
					keys, states := listKeys(t, c, tc.query, limit)
					if strings.Join(keys, " ") != tc.keys || strings.Join(states, " ") != tc.states {
						t.Fatalf("GET /v1/records?%s (pages of %d): %q %q, want %s (%s)", tc.query, limit, keys, states, tc.keys, tc.states)
					}
				}
			}

			// One page: every field of 'idem ls --json', and no cursor
			// when nothing follows.
			a := c.do("GET", "/v1/records?prefix=order:2", "").expect(t, 200, "")
			recs := a.body["records"].([]any)
			r := recs[0].(map[string]any)
			if len(recs) != 1 || r["key"] != "order:2" || r["status"] != "failed" || r["reason"] != `card declined for "order:2"` || r["fence"].(float64) <= 0 ||
				r["updated_at"] == "" || r["policy"] != "at_least_once" || a.str("next_cursor") != "" {
				t.Fatalf("GET /v1/records?prefix=order:2: %s", a)
			}
			if _, ok := r["journal"]; ok {
				t.Fatalf("the list has the journal, as ls --json does not: %s", a)
			}

			// Bad values are 400 invalid-query, naming the parameter.
			for q, param := range map[string]string{
				"status=bogus":                  "status",
				"status=completed&stuck=true":   "status",
				"status=lapsed&indeterminate=1": "status",
				"stuck=maybe":                   "stuck",
				"indeterminate=yes":             "indeterminate",
				"limit=0":                       "limit",
				"limit=1001":                    "limit",
				"limit=ten":                     "limit",
				"cursor=%21%21":                 "cursor",
				"updated_after=yesterday":       "updated_after",
				"updated_before=2026-13-01":     "updated_before",
				"sort=key":                      "sort",
				"status=failed&status=released": "status",
			} {
				if p := c.do("GET", "/v1/records?"+q, "").expect(t, 400, "invalid-query"); p.str("parameter") != param {
					t.Errorf("GET /v1/records?%s: parameter %q, want %q: %s", q, p.str("parameter"), param, p)
				}
			}
			c.do("POST", "/v1/records", "{}").expect(t, 405, "method-not-allowed")

			// The story: explain's verdict.
			st := c.do("GET", "/v1/records/order:3/story", "").expect(t, 200, "")
			v, _ := st.body["verdict"].(map[string]any)
			if st.str("key") != "order:3" || st.str("state") != "indeterminate" || v["code"] != "indeterminate" || len(st.body["story"].([]any)) == 0 {
				t.Fatalf("GET /v1/records/order:3/story: %s", st)
			}
			st = c.do("GET", "/v1/records/order:4/story", "").expect(t, 200, "")
			if st.str("state") != "lapsed" || !strings.Contains(st.str("current"), "takes over") {
				t.Fatalf("GET /v1/records/order:4/story: %s", st)
			}
			c.do("GET", "/v1/records/"+url.PathEscape("nope")+"/story", "").expect(t, 404, "not-found")
			// The record of a key that ends in /story, its slash escaped.
			c.do("GET", "/v1/records/order%2Fstory", "").expect(t, 404, "not-found")
			if !strings.Contains(logs.String(), "idem serve list") || !strings.Contains(logs.String(), "verdict=indeterminate") {
				t.Errorf("no log lines for the list and the story:\n%s", logs)
			}
		})
	}
}

// TestServeListHashKeys: with --hash-keys, neither the list, its cursors,
// nor a story names a key: each is its key_hash.
func TestServeListHashKeys(t *testing.T) {
	b := serveBackends()[0] // sqlite
	s, advance := b.open(t)
	seedList(t, s, advance)
	c, logs := newServeTest(t, s, "", true)
	keys, _ := listKeys(t, c, "", 2)
	l := idem.New(s, idem.WithHashedKeysInLogs())
	var want []string
	for _, k := range []string{"invoice:1", "invoice:2", "order:1", "order:2", "order:3", "order:4"} {
		want = append(want, l.LogKey(k).Value.String())
	}
	if !slices.Equal(keys, want) {
		t.Fatalf("keys listed under --hash-keys: %q, want the hashes %q", keys, want)
	}
	var raws []string
	v := url.Values{"limit": {"1"}}
	for range 7 {
		a := c.do("GET", "/v1/records?"+v.Encode(), "").expect(t, 200, "")
		raws = append(raws, a.raw)
		if a.str("next_cursor") == "" {
			break
		}
		v.Set("cursor", a.str("next_cursor"))
	}
	raws = append(raws, c.do("GET", "/v1/records/order:3/story", "").expect(t, 200, "").raw,
		c.do("GET", "/v1/records/order:2/story", "").expect(t, 200, "").raw,
		c.do("GET", "/v1/records/gone/story", "").expect(t, 404, "not-found").raw)
	for _, raw := range raws {
		for _, k := range []string{"invoice:", "order:", "gone", base64.RawURLEncoding.EncodeToString([]byte("order:"))[:6]} {
			if strings.Contains(raw, k) {
				t.Fatalf("an answer under --hash-keys holds %q:\n%s", k, raw)
			}
		}
	}
	if strings.Contains(logs.String(), "order:") {
		t.Fatalf("the log under --hash-keys names a key:\n%s", logs)
	}
	// A cursor of another server (or a made-up one) is refused.
	c.do("GET", "/v1/records?cursor="+base64.RawURLEncoding.EncodeToString([]byte("order:1")), "").expect(t, 400, "invalid-query")
}

// TestServeListAuth: the list and the story need the token like every
// other endpoint.
func TestServeListAuth(t *testing.T) {
	s, _ := serveBackends()[0].open(t)
	c, _ := newServeTest(t, s, "s3cret", false)
	c.do("GET", "/v1/records", "").expect(t, 200, "")
	c.token = ""
	c.do("GET", "/v1/records", "").expect(t, 401, "unauthorized")
	c.do("GET", "/v1/records/k/story", "").expect(t, 401, "unauthorized")
}
