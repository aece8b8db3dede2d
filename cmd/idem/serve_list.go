package main

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/cmd/idem/internal/explain"
)

// The operator's read API of idem serve: the list of records, with the
// filters of 'idem ls', and a key's story, with the verdict of 'idem
// explain'.

const (
	// defaultListLimit and maxListLimit bound GET /v1/records' limit.
	defaultListLimit = 100
	maxListLimit     = 1000
)

// listParams are the query parameters GET /v1/records takes; any other is
// refused, so that a mistyped filter does not list every record.
var listParams = map[string]bool{
	"status": true, "stuck": true, "lapsed": true, "indeterminate": true, "prefix": true,
	"updated_after": true, "updated_before": true, "cursor": true, "limit": true,
}

// listPage is the answer of GET /v1/records: records as 'idem ls --json'
// prints them, and the cursor of the next page ("" when this page is the
// last).
type listPage struct {
	Records    []any  `json:"records"`
	NextCursor string `json:"next_cursor,omitempty"`
}

// list answers GET /v1/records.
func (s *server) list(w http.ResponseWriter, r *http.Request, c *call) {
	v, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		s.problem(w, c, http.StatusBadRequest, "invalid-query", "The query string is not properly escaped.", nil)
		return
	}
	for name, vals := range v {
		if !listParams[name] {
			s.problem(w, c, http.StatusBadRequest, "invalid-query", "Unknown query parameter "+strconv.Quote(name)+".", map[string]any{"parameter": name})
			return
		}
		if len(vals) > 1 {
			s.problem(w, c, http.StatusBadRequest, "invalid-query", "The query parameter "+strconv.Quote(name)+" is given more than once.", map[string]any{"parameter": name})
			return
		}
	}
	bad := func(name, detail string) {
		s.problem(w, c, http.StatusBadRequest, "invalid-query", detail, map[string]any{"parameter": name})
	}
	flag := func(name string) (bool, bool) {
		val := v.Get(name)
		if val == "" {
			return false, true
		}
		b, err := strconv.ParseBool(val)
		if err != nil {
			bad(name, name+" must be true or false, got "+strconv.Quote(val)+".")
			return false, false
		}
		return b, true
	}
	stuck, ok := flag("stuck")
	if !ok {
		return
	}
	lapsed, ok := flag("lapsed")
	if !ok {
		return
	}
	indeterminate, ok := flag("indeterminate")
	if !ok {
		return
	}
	q, want, err := listFilter("status", v.Get("status"), stuck || lapsed, indeterminate)
	if err != nil {
		bad("status", err.Error()+".")
		return
	}
	q.Prefix = v.Get("prefix")
	limit := defaultListLimit
	if val := v.Get("limit"); val != "" {
		n, err := strconv.Atoi(val)
		if err != nil || n < 1 || n > maxListLimit {
			bad("limit", "limit must be a whole number from 1 to "+strconv.Itoa(maxListLimit)+", got "+strconv.Quote(val)+".")
			return
		}
		limit = n
	}
	if val := v.Get("cursor"); val != "" {
		if q.After, err = s.openCursor(val); err != nil {
			bad("cursor", "cursor must be a next_cursor this server returned.")
			return
		}
	}
	now, err := s.store.Now(r.Context())
	if err != nil {
		s.storeFailed(w, c, "now", err)
		return
	}
	for _, b := range []struct {
		name string
		t    *time.Time
	}{{"updated_after", &q.UpdatedAfter}, {"updated_before", &q.UpdatedBefore}} {
		if *b.t, err = timeBound(v.Get(b.name), now); err != nil {
			bad(b.name, b.name+": "+err.Error()+".")
			return
		}
	}

	it := &lister{s: s.store, q: q, now: now, want: want, page: limit + 1}
	page := listPage{Records: make([]any, 0, limit)}
	last := ""
	for len(page.Records) <= limit {
		row, ok, err := it.next(r.Context())
		if err != nil {
			s.storeFailed(w, c, "list", err)
			return
		}
		if !ok {
			break
		}
		if len(page.Records) == limit {
			page.NextCursor = s.sealCursor(last)
			break
		}
		last = row.rec.Key
		page.Records = append(page.Records, s.listRow(row, now))
	}
	c.outcome = "list"
	c.extra = append(c.extra, slog.Int("records", len(page.Records)))
	s.reply(w, c, page)
}

// listRow is one row of the list: the record as 'idem ls --json' prints
// it, or a record the store cannot decode. With --hash-keys the key is
// replaced by its hash (key_hash), in the reason too.
func (s *server) listRow(row listed, now time.Time) any {
	if row.corrupt != nil {
		cj := corruptJSON{Key: row.corrupt.Key, State: stateCorrupt, Error: row.corrupt.Error()}
		if s.hashKeys {
			cj.Key, cj.KeyHash, cj.Error = "", s.keyHash(row.corrupt.Key), s.redact(row.corrupt.Key, cj.Error)
		}
		return cj
	}
	rj := toJSON(&row.rec, now, false)
	if s.hashKeys {
		rj.Key, rj.KeyHash, rj.Reason = "", s.keyHash(row.rec.Key), s.redact(row.rec.Key, rj.Reason)
	}
	return rj
}

// keyHash is key as --hash-keys logs it (key_hash).
func (s *server) keyHash(key string) string { return s.ledger.LogKey(key).Value.String() }

// redact replaces key, raw or quoted, in text with its hash, as errAttr
// does in the log.
func (s *server) redact(key, text string) string {
	if key == "" {
		return text
	}
	hash := "key_hash:" + s.keyHash(key)
	return strings.ReplaceAll(strings.ReplaceAll(text, strconv.Quote(key), hash), key, hash)
}

// storyJSON is the answer of GET /v1/records/{key}/story: 'idem explain
// --json', and with --hash-keys the key's hash.
type storyJSON struct {
	explain.Explanation
	KeyHash string `json:"key_hash,omitempty"`
}

// story answers GET /v1/records/{key}/story with the key's story and the
// verdict of 'idem explain'. With --hash-keys the answer names the key by
// its hash only: the key is replaced in the story's texts.
func (s *server) story(w http.ResponseWriter, r *http.Request, c *call, key string) {
	members := map[string]any{"key": key}
	if s.hashKeys {
		members = map[string]any{"key_hash": s.keyHash(key)}
	}
	rec, now, ok := s.recordNow(w, r, c, key, members)
	if !ok {
		return
	}
	c.outcome, c.fence, c.attempt = "story", rec.Fence, rec.Attempt
	x := storyJSON{Explanation: explain.Explain(rec, now)}
	x.Key = key
	if s.hashKeys {
		x.Key, x.KeyHash = "", s.keyHash(key)
		red := func(t string) string { return s.redact(key, t) }
		for i := range x.Story {
			x.Story[i].Text = red(x.Story[i].Text)
		}
		for i := range x.Steps {
			x.Steps[i].Why = red(x.Steps[i].Why)
		}
		x.Verdict.Text, x.Current = red(x.Verdict.Text), red(x.Current)
	}
	c.extra = append(c.extra, slog.String("verdict", x.Verdict.Code))
	s.reply(w, c, x)
}

// sealCursor makes the next_cursor that lists on after key: the key in
// base64url, or with --hash-keys the key sealed with the server's cursor
// key (AES-GCM), so that no raw key leaves the server. Such a cursor is
// good until the server stops.
func (s *server) sealCursor(key string) string {
	if s.cursorAEAD == nil {
		return base64.RawURLEncoding.EncodeToString([]byte(key))
	}
	nonce := make([]byte, s.cursorAEAD.NonceSize(), s.cursorAEAD.NonceSize()+len(key)+s.cursorAEAD.Overhead())
	_, _ = rand.Read(nonce)
	return base64.RawURLEncoding.EncodeToString(s.cursorAEAD.Seal(nonce, nonce, []byte(key), nil))
}

// openCursor returns the key a cursor of sealCursor lists on after.
func (s *server) openCursor(cursor string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil {
		return "", err
	}
	if s.cursorAEAD == nil {
		return string(b), nil
	}
	n := s.cursorAEAD.NonceSize()
	if len(b) < n {
		return "", errors.New("short cursor")
	}
	key, err := s.cursorAEAD.Open(nil, b[:n], b[n:], nil)
	return string(key), err
}

// newCursorAEAD returns the AES-GCM of a server's cursors under
// --hash-keys, with a random key of its own.
func newCursorAEAD() cipher.AEAD {
	var k [32]byte
	_, _ = rand.Read(k[:])
	block, err := aes.NewCipher(k[:])
	if err != nil {
		panic(err) // a 32-byte key is always valid
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return aead
}
