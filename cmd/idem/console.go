package main

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/explain"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store"
)

//go:embed console
var consoleFS embed.FS

// Console limits: a page of the records list, the records the overview
// reads to count them, the keys it lists as needing a decision, the
// journal events it shows, and the dead letters shown per queue.
const (
	consolePage        = 50
	consoleScan        = 10000
	consoleDecide      = 50
	consoleEvents      = 15
	consoleDeadLetters = 20
	// consoleConfirmScan: how many of a queue's oldest dead letters a
	// redrive's confirmation looks through for the one it names.
	consoleConfirmScan = 1000
	consoleBy          = "idem console"
)

// console is the operations console of `idem serve`, under /console/:
// server-rendered pages over the store (overview, records, a key, queues)
// and the actions an operator takes on a key or a queue, each a POST
// behind a confirmation page and a CSRF token.
type console struct {
	store    store.Store
	ledger   *idem.Ledger // LogKey: a key's hash under --hash-keys
	hashKeys bool
	secret   []byte      // the per-process secret: CSRF tokens
	aead     cipher.AEAD // seals keys into URLs under --hash-keys
	pages    map[string]*template.Template
	// queues opens the store's sqlqueue tables (errNoQueues, or an error
	// wrapping sqlqueue.ErrNoTables, when it has none).
	queues func(ctx context.Context) (*queueAdmin, error)
	// counters reads serve's metrics since the process started (nil:
	// --metrics=false).
	counters func() map[string]float64
	log      *slog.Logger
}

var consolePages = []string{"overview", "records", "key", "confirm", "queues", "queueconfirm", "error"}

func newConsole(s store.Store, ledger *idem.Ledger, hashKeys bool, storeURL string, log *slog.Logger) (*console, error) {
	c := &console{store: s, ledger: ledger, hashKeys: hashKeys, secret: make([]byte, 32), pages: map[string]*template.Template{}, log: log}
	if _, err := rand.Read(c.secret); err != nil {
		return nil, err
	}
	sealKey := make([]byte, 32)
	if _, err := rand.Read(sealKey); err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(sealKey)
	if err != nil {
		return nil, err
	}
	if c.aead, err = cipher.NewGCM(block); err != nil {
		return nil, err
	}
	funcs := template.FuncMap{"stamp": stamp, "dur": explain.Dur}
	for _, p := range consolePages {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(consoleFS, "console/layout.html", "console/"+p+".html")
		if err != nil {
			return nil, err
		}
		c.pages[p] = t
	}
	c.queues = func(ctx context.Context) (*queueAdmin, error) { return queuesOf(ctx, s, storeURL, "") }
	return c, nil
}

// consolePath reports whether path is the console's.
func consolePath(path string) bool { return path == "/console" || strings.HasPrefix(path, "/console/") }

// consoleSafe is the console's browser guard, in place of browserSafe:
// the console is a web page, so its own requests carry Origin (on a POST)
// and Sec-Fetch-Site, which must name the console's own origin; a request
// from any other site is refused, and without a token so is a Host that
// is not a loopback name (DNS rebinding).
func (s *server) consoleSafe(r *http.Request) (int, string) {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "none", "same-origin":
	default:
		return http.StatusForbidden, "Requests from other sites are refused."
	}
	if o := r.Header.Values("Origin"); len(o) > 0 {
		if len(o) != 1 || (o[0] != "http://"+r.Host && o[0] != "https://"+r.Host) {
			return http.StatusForbidden, "Requests from other origins are refused."
		}
	}
	if !s.auth && !loopbackHost(r.Host) {
		return http.StatusForbidden, "Without a token the console answers only requests addressed to a loopback host (localhost, 127.0.0.1, [::1])."
	}
	if s.auth && !s.authorized(r) {
		return http.StatusUnauthorized, "Send Authorization: Bearer TOKEN with the server's token."
	}
	return 0, ""
}

// serveConsole answers a request under /console/.
func (s *server) serveConsole(w http.ResponseWriter, r *http.Request, c *call) {
	cs := s.console
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	// A key in a console URL must not leave in a Referer to another site
	// (no-referrer would make a form's Origin "null", which is refused).
	h.Set("Referrer-Policy", "same-origin")
	c.outcome = "console"
	if status, why := s.consoleSafe(r); status != 0 {
		if status == http.StatusUnauthorized {
			h.Set("WWW-Authenticate", `Bearer realm="idem"`)
		}
		c.outcome = "console-refused"
		cs.fail(w, r, c, status, why)
		return
	}
	path := r.URL.Path
	get := map[string]func(http.ResponseWriter, *http.Request, *call){
		"/console/":               cs.overview,
		"/console/records":        cs.records,
		"/console/key":            cs.key,
		"/console/confirm":        cs.confirm,
		"/console/queues":         cs.queuesPage,
		"/console/queues/confirm": cs.queueConfirm,
	}
	post := map[string]func(http.ResponseWriter, *http.Request, *call){
		"/console/act":            cs.act,
		"/console/queues/redrive": cs.redrive,
	}
	if path == "/console" {
		c.status = http.StatusMovedPermanently
		http.Redirect(w, r, "/console/", c.status)
		return
	}
	if f, ok := get[path]; ok {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET")
			cs.fail(w, r, c, http.StatusMethodNotAllowed, "Use GET.")
			return
		}
		f(w, r, c)
		return
	}
	if f, ok := post[path]; ok {
		if r.Method != http.MethodPost {
			h.Set("Allow", "POST")
			cs.fail(w, r, c, http.StatusMethodNotAllowed, "Use POST.")
			return
		}
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/x-www-form-urlencoded" {
			cs.fail(w, r, c, http.StatusUnsupportedMediaType, "Send the console's form.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if err := r.ParseForm(); err != nil {
			cs.fail(w, r, c, http.StatusBadRequest, "The form could not be read.")
			return
		}
		f(w, r, c)
		return
	}
	cs.fail(w, r, c, http.StatusNotFound, "No such console page.")
}

// render writes page with data, status 200.
func (cs *console) render(w http.ResponseWriter, c *call, status int, page, title string, data any) {
	var b strings.Builder
	err := cs.pages[page].Execute(&b, map[string]any{"Title": title, "Page": page, "D": data, "HashKeys": cs.hashKeys})
	if err != nil {
		c.status = http.StatusInternalServerError
		c.extra = append(c.extra, slog.Any("error", err))
		http.Error(w, "the page could not be rendered", c.status)
		return
	}
	c.status = status
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

// fail answers an error page.
func (cs *console) fail(w http.ResponseWriter, r *http.Request, c *call, status int, why string) {
	cs.render(w, c, status, "error", http.StatusText(status), map[string]any{"Status": status, "Why": why})
}

// storeFailed answers 503 for a store call that failed.
func (cs *console) storeFailed(w http.ResponseWriter, r *http.Request, c *call, op string, err error) {
	c.outcome = "store-error"
	c.extra = append(c.extra, slog.String("op", op), slog.Any("error", cs.redactErr(err)))
	w.Header().Set("Retry-After", "1")
	cs.fail(w, r, c, http.StatusServiceUnavailable, "The store did not answer ("+op+"); nothing is known. Reload the page to retry.")
}

// name is a key as the console shows it: the key, or under --hash-keys
// its hash (as serve's logs write it).
func (cs *console) name(key string) string {
	if cs.hashKeys {
		return "key_hash " + cs.ledger.LogKey(key).Value.String()
	}
	return key
}

// redact replaces key with its name in text written about it.
func (cs *console) redact(text, key string) string {
	if !cs.hashKeys || key == "" {
		return text
	}
	return strings.ReplaceAll(text, key, cs.name(key))
}

func (cs *console) redactErr(err error) string {
	if err == nil {
		return ""
	}
	if cs.hashKeys {
		return "(details withheld under --hash-keys: they may hold a key)"
	}
	return err.Error()
}

// ref is how a URL or a form names key: the key itself, or under
// --hash-keys the key sealed with the process's secret, so that no page
// holds a raw key.
func (cs *console) ref(key string) string {
	if !cs.hashKeys {
		return key
	}
	nonce := make([]byte, cs.aead.NonceSize())
	_, _ = rand.Read(nonce)
	return base64.RawURLEncoding.EncodeToString(cs.aead.Seal(nonce, nonce, []byte(key), nil))
}

// unref returns the key ref names.
func (cs *console) unref(ref string) (string, error) {
	if !cs.hashKeys || ref == "" {
		return ref, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(ref)
	if err != nil || len(b) < cs.aead.NonceSize() {
		return "", errors.New("bad key reference")
	}
	key, err := cs.aead.Open(nil, b[:cs.aead.NonceSize()], b[cs.aead.NonceSize():], nil)
	if err != nil {
		return "", errors.New("bad key reference (from another process?)")
	}
	return string(key), nil
}

// keyURL is the key page of key.
func (cs *console) keyURL(key string) string { return "/console/key?k=" + url.QueryEscape(cs.ref(key)) }

// csrf is the token a form acting on scope carries: an HMAC of the scope
// with the per-process secret. A page of another site cannot read it.
func (cs *console) csrf(scope string) string {
	m := hmac.New(sha256.New, cs.secret)
	m.Write([]byte("idem-console-csrf\x00" + scope))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// csrfOK checks a form's token against scope, in constant time.
func (cs *console) csrfOK(r *http.Request, scope string) bool {
	got, err := base64.RawURLEncoding.DecodeString(r.PostFormValue("csrf"))
	if err != nil {
		return false
	}
	want, _ := base64.RawURLEncoding.DecodeString(cs.csrf(scope))
	return hmac.Equal(got, want)
}

// row is a record in a list.
type row struct {
	URL, Name string
	State     explain.State
	Corrupt   string
	Fence     int64
	Attempt   int
	Owner     string
	Policy    string
	Updated   string
	Expires   string
	Reason    string
}

func (cs *console) row(l listed, now time.Time) row {
	if l.corrupt != nil {
		return row{URL: cs.keyURL(l.corrupt.Key), Name: cs.name(l.corrupt.Key), State: stateCorrupt, Corrupt: cs.redact(l.corrupt.Detail, l.corrupt.Key)}
	}
	r := &l.rec
	return row{URL: cs.keyURL(r.Key), Name: cs.name(r.Key), State: explain.StateOf(r, now), Fence: r.Fence, Attempt: r.Attempt,
		Owner: orDash(r.Owner), Policy: r.Policy.String(), Updated: rel(r.UpdatedAt, now), Expires: rel(r.ExpiresAt, now),
		Reason: cs.redact(r.Reason, r.Key)}
}

// event is a takeover or a lease loss found in a journal.
type event struct {
	At              time.Time
	When, Kind      string
	URL, Name, Text string
}

func (cs *console) overview(w http.ResponseWriter, r *http.Request, c *call) {
	ctx := r.Context()
	now, err := storeNow(ctx, cs.store)
	if err != nil {
		cs.storeFailed(w, r, c, "now", err)
		return
	}
	counts := map[explain.State]int{}
	var decide []row
	var events []event
	it := &lister{s: cs.store, now: now, page: 500}
	scanned, corrupt := 0, 0
	for scanned < consoleScan {
		l, ok, err := it.next(ctx)
		if err != nil {
			cs.storeFailed(w, r, c, "list", err)
			return
		}
		if !ok {
			break
		}
		scanned++
		if l.corrupt != nil {
			corrupt++
			if len(decide) < consoleDecide {
				decide = append(decide, cs.row(l, now))
			}
			continue
		}
		st := explain.StateOf(&l.rec, now)
		counts[st]++
		if (st.Stuck() || st == explain.StateFailed) && len(decide) < consoleDecide {
			decide = append(decide, cs.row(l, now))
		}
		for _, e := range l.rec.Journal {
			if e.Takeover {
				events = append(events, event{At: e.Started, Kind: "takeover", URL: cs.keyURL(l.rec.Key), Name: cs.name(l.rec.Key),
					Text: fmt.Sprintf("attempt %d (owner %s) took over a lapsed attempt", e.Attempt, orDash(e.Owner))})
			}
			if !e.LateFinish.IsZero() {
				events = append(events, event{At: e.LateFinish, Kind: "lease lost", URL: cs.keyURL(l.rec.Key), Name: cs.name(l.rec.Key),
					Text: fmt.Sprintf("attempt %d (owner %s) was still running after its lease was taken over", e.Attempt, orDash(e.Owner))})
			}
		}
	}
	more := false
	if scanned == consoleScan {
		_, more, _ = it.next(ctx)
	}
	sort.Slice(events, func(i, j int) bool { return events[i].At.After(events[j].At) })
	if len(events) > consoleEvents {
		events = events[:consoleEvents]
	}
	for i := range events {
		events[i].When = rel(events[i].At, now)
	}
	states := []explain.State{explain.StateInProgress, explain.StateLapsed, explain.StateIndeterminate,
		explain.StateCompleted, explain.StateFailed, explain.StateReleased}
	type count struct {
		State explain.State
		N     int
		URL   string
		Alert bool
	}
	var cts []count
	for _, st := range states {
		cts = append(cts, count{st, counts[st], "/console/records?state=" + string(st), counts[st] > 0 && (st.Stuck() || st == explain.StateFailed)})
	}
	data := map[string]any{"Counts": cts, "Scanned": scanned, "More": more, "Corrupt": corrupt, "Decide": decide,
		"Events": events, "Now": stamp(now)}
	if cs.counters != nil {
		m := cs.counters()
		data["Metrics"] = []struct {
			Name string
			V    float64
		}{
			{"takeovers", m["idem_takeovers_total"]},
			{"lease losses", m["idem_lease_losses_total"]},
			{"indeterminate answers", m["idem_indeterminate_total"]},
		}
	}
	if qs, err := cs.queueStats(ctx); err == nil {
		data["Queues"] = qs
	} else if !errors.Is(err, errNoQueues) && !errors.Is(err, sqlqueue.ErrNoTables) {
		data["QueueError"] = cs.redactErr(err)
	}
	cs.render(w, c, http.StatusOK, "overview", "Overview", data)
}

// queueRow is a queue's stats as the console shows them.
type queueRow struct {
	sqlqueue.Stats
	Oldest string
}

func (cs *console) queueStats(ctx context.Context) ([]queueRow, error) {
	h, err := cs.queues(ctx)
	if err != nil {
		return nil, err
	}
	defer h.close()
	sts, err := h.stats(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]queueRow, 0, len(sts))
	for _, st := range sts {
		o := "-"
		if st.OldestAge > 0 {
			o = explain.Dur(st.OldestAge.Round(time.Millisecond))
		}
		out = append(out, queueRow{st, o})
	}
	return out, nil
}

// recordsFilter is the records page's form.
type recordsFilter struct {
	State   string
	Prefix  string
	After   string // a key ref
	Updated struct{ After, Before string }
}

// datetime-local inputs send "2006-01-02T15:04" (UTC here); RFC 3339 is
// accepted too.
func parseWhen(v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, v, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a time (want 2006-01-02T15:04, in UTC)", v)
}

func (cs *console) records(w http.ResponseWriter, r *http.Request, c *call) {
	ctx := r.Context()
	q := r.URL.Query()
	var f recordsFilter
	f.State, f.Prefix, f.After = q.Get("state"), q.Get("prefix"), q.Get("after")
	f.Updated.After, f.Updated.Before = q.Get("updated_after"), q.Get("updated_before")
	if k := q.Get("key"); k != "" {
		// A search by key: its page.
		c.status = http.StatusSeeOther
		http.Redirect(w, r, cs.keyURL(k), c.status)
		return
	}
	ua, err := parseWhen(f.Updated.After)
	if err != nil {
		cs.fail(w, r, c, http.StatusBadRequest, "updated after: "+err.Error())
		return
	}
	ub, err := parseWhen(f.Updated.Before)
	if err != nil {
		cs.fail(w, r, c, http.StatusBadRequest, "updated before: "+err.Error())
		return
	}
	after, err := cs.unref(f.After)
	if err != nil {
		cs.fail(w, r, c, http.StatusBadRequest, err.Error())
		return
	}
	st := f.State
	stuck := st == "stuck"
	if stuck {
		st = ""
	}
	lq, want, err := listFilter("state", st, stuck, false)
	if err != nil {
		cs.fail(w, r, c, http.StatusBadRequest, err.Error()+".")
		return
	}
	lq.After, lq.Prefix, lq.UpdatedAfter, lq.UpdatedBefore = after, f.Prefix, ua, ub
	now, err := storeNow(ctx, cs.store)
	if err != nil {
		cs.storeFailed(w, r, c, "now", err)
		return
	}
	var rows []row
	it := &lister{s: cs.store, q: lq, now: now, want: want, page: consolePage + 1}
	last, more := "", false
	for {
		l, ok, err := it.next(ctx)
		if err != nil {
			cs.storeFailed(w, r, c, "list", err)
			return
		}
		if !ok {
			break
		}
		if len(rows) == consolePage {
			more = true
			break
		}
		last = l.rec.Key
		if l.corrupt != nil {
			last = l.corrupt.Key
		}
		rows = append(rows, cs.row(l, now))
	}
	next := ""
	if more {
		v := url.Values{}
		for _, p := range []string{"state", "prefix", "updated_after", "updated_before"} {
			if q.Get(p) != "" {
				v.Set(p, q.Get(p))
			}
		}
		v.Set("after", cs.ref(last))
		next = "/console/records?" + v.Encode()
	}
	states := []string{"", "stuck", string(explain.StateInProgress), string(explain.StateLapsed), string(explain.StateIndeterminate),
		string(explain.StateCompleted), string(explain.StateFailed), string(explain.StateReleased)}
	cs.render(w, c, http.StatusOK, "records", "Records", map[string]any{"F": f, "Rows": rows, "Next": next, "States": states,
		"First": f.After != ""})
}

// action is what the console can do to a key.
type action struct {
	Do, Label, Verb string
}

var keyActions = []action{
	{"done", "Resolve: done", "resolve"},
	{"notdone", "Resolve: not done", "resolve"},
	{"release", "Release", "release"},
	{"delete", "Delete", "delete"},
}

func actionOf(do string) (action, bool) {
	for _, a := range keyActions {
		if a.Do == do {
			return a, true
		}
	}
	return action{}, false
}

// keyFrom reads the key a page or form names (k); ok false once it has
// answered.
func (cs *console) keyFrom(w http.ResponseWriter, r *http.Request, c *call, ref string) (string, bool) {
	key, err := cs.unref(ref)
	if err != nil {
		cs.fail(w, r, c, http.StatusBadRequest, err.Error())
		return "", false
	}
	if key == "" {
		cs.fail(w, r, c, http.StatusBadRequest, "Name a key.")
		return "", false
	}
	c.key = key
	return key, true
}

// entryRow is a journal entry as the timeline shows it.
type entryRow struct {
	Attempt                    int
	Fence                      int64
	Owner, Policy, Correlation string
	Started, Ended, Lease      string
	Outcome, Reason, By        string
	Takeover, Late, Decision   bool
	Running                    bool
}

func (cs *console) key(w http.ResponseWriter, r *http.Request, c *call) {
	ctx := r.Context()
	key, ok := cs.keyFrom(w, r, c, r.URL.Query().Get("k"))
	if !ok {
		return
	}
	rec, err := cs.store.Get(ctx, key)
	var ce *idem.CorruptError
	data := map[string]any{"Name": cs.name(key), "Ref": cs.ref(key), "Msg": consoleMsgs[r.URL.Query().Get("msg")]}
	switch {
	case errors.As(err, &ce):
		data["Corrupt"] = cs.redact(ce.Detail, key)
		data["Actions"] = []action{{"delete", "Delete", "delete"}}
		cs.render(w, c, http.StatusOK, "key", cs.name(key), data)
		return
	case errors.Is(err, store.ErrNotFound):
		data["Missing"] = true
		cs.render(w, c, http.StatusNotFound, "key", cs.name(key), data)
		return
	case err != nil:
		cs.storeFailed(w, r, c, "get", err)
		return
	}
	now, err := storeNow(ctx, cs.store)
	if err != nil {
		cs.storeFailed(w, r, c, "now", err)
		return
	}
	x := explain.Explain(rec, now)
	for i := range x.Story {
		x.Story[i].Text = cs.redact(x.Story[i].Text, key)
	}
	for i := range x.Steps {
		x.Steps[i].Why = cs.redact(x.Steps[i].Why, key)
	}
	x.Verdict.Text = cs.redact(x.Verdict.Text, key)
	x.Current = cs.redact(x.Current, key)
	var journal []entryRow
	for _, e := range rec.Journal {
		journal = append(journal, entryRow{Attempt: e.Attempt, Fence: e.Fence, Owner: cs.redact(orDash(e.Owner), key), Policy: e.Policy,
			Correlation: cs.redact(e.Correlation, key), Started: stamp(e.Started), Ended: stamp(e.Ended), Lease: stamp(e.LeaseUntil),
			Outcome: string(e.Outcome), Reason: cs.redact(e.Reason, key), By: e.ResolvedBy, Takeover: e.Takeover,
			Late: !e.LateFinish.IsZero(), Decision: e.Decision, Running: e.Outcome == "" && e.Ended.IsZero()})
	}
	st := explain.StateOf(&rec, now)
	data["Rec"] = map[string]any{"State": st, "Describe": st.DescribeFor(&rec), "Status": rec.Status, "Policy": rec.Policy.String(),
		"Fence": rec.Fence, "Attempt": rec.Attempt, "Owner": orDash(rec.Owner), "Lease": stamp(rec.LeaseUntil),
		"LeaseRel": rel(rec.LeaseUntil, now), "Created": stamp(rec.CreatedAt), "Updated": stamp(rec.UpdatedAt),
		"Expires": stamp(rec.ExpiresAt), "ExpiresRel": rel(rec.ExpiresAt, now), "Reason": cs.redact(rec.Reason, key),
		"ResultSize": len(rec.Result), "Fingerprint": rec.Fingerprint != ""}
	data["X"] = x
	data["Journal"] = journal
	data["Actions"] = keyActions
	data["Stuck"] = st.Stuck()
	cs.render(w, c, http.StatusOK, "key", cs.name(key), data)
}

// consoleMsgs are the notes a page shows after an action (its msg
// parameter).
var consoleMsgs = map[string]string{
	"done":    "Resolved as done: duplicates now get the stored result and the operation does not run again.",
	"notdone": "Resolved as not done: the key is released; the next delivery runs the operation.",
	"release": "Released: the next delivery runs the operation.",
	"noop":    "The key was already released: nothing changed.",
	"deleted": "Deleted: the key's next delivery runs it as a new operation.",
}

// plan checks what do would do to rec at now, as the CLI checks it; with
// force as the operator asked. It returns the decision to write (nil for
// delete), whether there is nothing to do, and the CLI's refusal.
func (cs *console) plan(a action, key string, rec *idem.Record, now time.Time, fence int64, force bool, reason string) (*decision, bool, error) {
	if a.Do == "delete" {
		if fence != 0 && rec.Fence != fence {
			return nil, false, refused("%q is at fence %d, not %d: it changed since you inspected it; nothing done, inspect it again", cs.name(key), rec.Fence, fence)
		}
		_, err := checkDelete(rec, now, force, cs.name(key))
		return nil, false, err
	}
	d := &decision{key: key, fence: fence, force: force}
	d.res.By = consoleBy
	d.res.Done = a.Do == "done"
	if d.res.Done {
		d.res.Retention = idem.DefaultRetention
	}
	d.res.Reason = reason
	if d.res.Reason == "" {
		d.res.Reason = map[string]string{"done": "resolved as done in idem console", "notdone": "resolved as not done in idem console",
			"release": "released in idem console"}[a.Do]
	}
	_, noop, err := planDecision(d, a.Verb, rec, now, cs.name(key))
	return d, noop, err
}

// consequence says what the next delivery of the key does after a.
func consequence(a action, rec *idem.Record) string {
	switch a.Do {
	case "done":
		return fmt.Sprintf("The key becomes completed at fence %d. The next delivery does not run the operation: it is answered as a duplicate, with an empty stored result, for 7 days. Choose this only if the effect happened (check the provider's log first).", rec.Fence+1)
	case "notdone", "release":
		return fmt.Sprintf("The key is released at fence %d. The next delivery runs the operation again, as attempt %d. Choose this only if the effect did not happen, or must happen again.", rec.Fence+1, rec.Attempt+1)
	}
	return "The record and its journal are removed. The next delivery runs the operation as a new one (attempt 1, at a fence above every fence the key had). Prefer resolve or release: they keep the journal."
}

func (cs *console) confirm(w http.ResponseWriter, r *http.Request, c *call) {
	ctx := r.Context()
	q := r.URL.Query()
	a, ok := actionOf(q.Get("do"))
	if !ok {
		cs.fail(w, r, c, http.StatusBadRequest, "Unknown action.")
		return
	}
	key, ok := cs.keyFrom(w, r, c, q.Get("k"))
	if !ok {
		return
	}
	data := map[string]any{"A": a, "Name": cs.name(key), "Ref": cs.ref(key), "CSRF": cs.csrf("key\x00" + key), "KeyURL": cs.keyURL(key)}
	rec, err := cs.store.Get(ctx, key)
	var ce *idem.CorruptError
	switch {
	case errors.As(err, &ce) && a.Do == "delete":
		data["Corrupt"], data["Fence"] = cs.redact(ce.Detail, key), int64(0)
		data["Refusal"] = "Its record is corrupt: its lease cannot be read, so an attempt may still hold the key."
		data["Consequence"] = consequence(a, nil)
		cs.render(w, c, http.StatusOK, "confirm", a.Label, data)
		return
	case errors.As(err, &ce):
		cs.fail(w, r, c, http.StatusConflict, "The record is corrupt: only delete applies to it.")
		return
	case errors.Is(err, store.ErrNotFound):
		cs.fail(w, r, c, http.StatusNotFound, "No record for "+cs.name(key)+" (never claimed, or expired or swept).")
		return
	case err != nil:
		cs.storeFailed(w, r, c, "get", err)
		return
	}
	now, err := storeNow(ctx, cs.store)
	if err != nil {
		cs.storeFailed(w, r, c, "now", err)
		return
	}
	_, noop, perr := cs.plan(a, key, &rec, now, rec.Fence, false, "")
	st := explain.StateOf(&rec, now)
	data["State"], data["Fence"], data["Attempt"], data["Owner"] = st, rec.Fence, rec.Attempt, orDash(rec.Owner)
	data["Describe"] = cs.redact(st.DescribeFor(&rec), key)
	data["Consequence"] = consequence(a, &rec)
	data["Noop"] = noop
	if perr != nil {
		data["Refusal"] = perr.Error()
	}
	if st == explain.StateInProgress {
		data["Running"] = fmt.Sprintf("Attempt %d may still be running: its writes are refused from then on, but its effect may still happen.", rec.Attempt)
	}
	cs.render(w, c, http.StatusOK, "confirm", a.Label, data)
}

func (cs *console) act(w http.ResponseWriter, r *http.Request, c *call) {
	ctx := r.Context()
	a, ok := actionOf(r.PostFormValue("do"))
	if !ok {
		cs.fail(w, r, c, http.StatusBadRequest, "Unknown action.")
		return
	}
	key, ok := cs.keyFrom(w, r, c, r.PostFormValue("k"))
	if !ok {
		return
	}
	if !cs.csrfOK(r, "key\x00"+key) {
		c.outcome = "csrf-refused"
		cs.fail(w, r, c, http.StatusForbidden, "The form's CSRF token is missing or wrong: reload the key's page and try again.")
		return
	}
	fence, err := strconv.ParseInt(r.PostFormValue("fence"), 10, 64)
	if err != nil {
		cs.fail(w, r, c, http.StatusBadRequest, "The form names no fence.")
		return
	}
	force := r.PostFormValue("force") == "yes"
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	c.outcome = "console-" + a.Do
	c.extra = append(c.extra, slog.Bool("force", force))
	rec, err := cs.store.Get(ctx, key)
	var ce *idem.CorruptError
	switch {
	case errors.As(err, &ce) && a.Do == "delete" && force:
		rec = idem.Record{Key: key}
	case errors.As(err, &ce):
		cs.fail(w, r, c, http.StatusConflict, "The record is corrupt: only delete with force applies to it.")
		return
	case errors.Is(err, store.ErrNotFound):
		cs.fail(w, r, c, http.StatusNotFound, "No record for "+cs.name(key)+" (never claimed, or expired or swept).")
		return
	case err != nil:
		cs.storeFailed(w, r, c, "get", err)
		return
	}
	now, err := storeNow(ctx, cs.store)
	if err != nil {
		cs.storeFailed(w, r, c, "now", err)
		return
	}
	if ce != nil {
		fence = 0
	}
	d, noop, perr := cs.plan(a, key, &rec, now, fence, force, reason)
	if perr != nil {
		c.outcome = "console-refused"
		cs.fail(w, r, c, http.StatusConflict, perr.Error())
		return
	}
	msg := a.Do
	switch {
	case noop:
		msg = "noop"
	case a.Do == "delete":
		if err := cs.store.Delete(ctx, key); errors.Is(err, store.ErrNotFound) {
			cs.fail(w, r, c, http.StatusNotFound, "No record for "+cs.name(key)+": someone else removed it.")
			return
		} else if err != nil {
			cs.storeFailed(w, r, c, "delete", err)
			return
		}
		msg = "deleted"
	default:
		after, err := cs.store.Resolve(ctx, d.res)
		switch {
		case errors.Is(err, idem.ErrLeaseLost):
			c.outcome = "console-refused"
			cs.fail(w, r, c, http.StatusConflict, cs.name(key)+" changed while it was being decided (a heartbeat revived its lease, another attempt claimed it, or someone resolved it); nothing done, inspect it again.")
			return
		case errors.Is(err, store.ErrNotFound):
			cs.fail(w, r, c, http.StatusNotFound, "No record for "+cs.name(key)+": someone else removed it.")
			return
		case err != nil:
			cs.storeFailed(w, r, c, "resolve", err)
			return
		}
		c.fence, c.attempt = after.Fence, after.Attempt
	}
	cs.log.LogAttrs(ctx, slog.LevelInfo, "idem console: "+a.Label, cs.ledger.LogKey(key), slog.Int64("fence", rec.Fence),
		slog.String("was", string(explain.StateOf(&rec, now))), slog.Bool("force", force))
	c.status = http.StatusSeeOther
	http.Redirect(w, r, cs.keyURL(key)+"&msg="+msg, c.status)
}

// deadRow is a dead letter as the queues page shows it (its body's size,
// not the body: it may hold secrets).
type deadRow struct {
	ID, Reason, At string
	Receives       int
	Size           int
	Group          string
	RedriveURL     string // its confirmation (the queues page)
}

func (cs *console) queuesPage(w http.ResponseWriter, r *http.Request, c *call) {
	ctx := r.Context()
	data := map[string]any{}
	if q := r.URL.Query(); q.Has("redriven") {
		n, _ := strconv.Atoi(q.Get("redriven"))
		data["Msg"] = fmt.Sprintf("%d dead letter(s) of %s redriven: back in the queue, visible at once.", n, q.Get("queue"))
	}
	h, err := cs.queues(ctx)
	switch {
	case errors.Is(err, errNoQueues):
		data["None"] = "This store keeps no queues: sqlqueue lives in SQLite and PostgreSQL databases."
		cs.render(w, c, http.StatusOK, "queues", "Queues", data)
		return
	case errors.Is(err, sqlqueue.ErrNoTables):
		data["None"] = "The store's database holds no sqlqueue tables (the workers' sqlqueue.NewSQLite or NewPostgres creates them)."
		cs.render(w, c, http.StatusOK, "queues", "Queues", data)
		return
	case err != nil:
		cs.storeFailed(w, r, c, "queues", err)
		return
	}
	defer h.close()
	sts, err := h.stats(ctx)
	if err != nil {
		cs.storeFailed(w, r, c, "queue stats", err)
		return
	}
	type queueView struct {
		queueRow
		Dead   []deadRow
		AllURL string
	}
	var views []queueView
	for _, st := range sts {
		v := queueView{queueRow: queueRow{st, "-"}}
		if st.OldestAge > 0 {
			v.Oldest = explain.Dur(st.OldestAge.Round(time.Millisecond))
		}
		if st.DeadLettered > 0 {
			dls, err := h.deadLetters(ctx, st.Queue, consoleDeadLetters)
			if err != nil {
				cs.storeFailed(w, r, c, "dead letters", err)
				return
			}
			for _, dl := range dls {
				v.Dead = append(v.Dead, deadRow{ID: dl.Message.ID, Reason: dl.Reason, At: stamp(dl.At), Receives: dl.Message.ReceiveCount,
					Size: len(dl.Message.Body), Group: dl.Message.GroupID,
					RedriveURL: "/console/queues/confirm?" + url.Values{"queue": {st.Queue}, "do": {"one"}, "id": {dl.Message.ID}}.Encode()})
			}
			v.AllURL = "/console/queues/confirm?" + url.Values{"queue": {st.Queue}, "do": {"all"}}.Encode()
		}
		views = append(views, v)
	}
	data["Queues"] = views
	cs.render(w, c, http.StatusOK, "queues", "Queues", data)
}

// deadLetterOf returns the queue's dead letter id (nil when it is not
// among the oldest consoleConfirmScan) and how many the queue has.
func (cs *console) deadLetterOf(ctx context.Context, h *queueAdmin, queue, id string) (*sqlqueue.DeadLetter, int64, error) {
	sts, err := h.stats(ctx)
	if err != nil {
		return nil, 0, err
	}
	var n int64
	for _, st := range sts {
		if st.Queue == queue {
			n = st.DeadLettered
		}
	}
	if n == 0 || id == "" {
		return nil, n, nil
	}
	dls, err := h.deadLetters(ctx, queue, consoleConfirmScan)
	if err != nil {
		return nil, n, err
	}
	for i := range dls {
		if dls[i].Message.ID == id {
			return &dls[i], n, nil
		}
	}
	return nil, n, nil
}

func (cs *console) queueConfirm(w http.ResponseWriter, r *http.Request, c *call) {
	ctx := r.Context()
	q := r.URL.Query()
	name, do := q.Get("queue"), q.Get("do")
	if do != "one" && do != "all" {
		cs.fail(w, r, c, http.StatusBadRequest, "Unknown action.")
		return
	}
	h, err := cs.queues(ctx)
	if err != nil {
		cs.fail(w, r, c, http.StatusNotFound, "This store's database holds no queues.")
		return
	}
	defer h.close()
	id := q.Get("id")
	if do == "one" && id == "" {
		cs.fail(w, r, c, http.StatusBadRequest, "The link names no dead letter.")
		return
	}
	dl, n, err := cs.deadLetterOf(ctx, h, name, id)
	if err != nil {
		cs.storeFailed(w, r, c, "dead letters", err)
		return
	}
	if do == "one" && dl == nil {
		cs.fail(w, r, c, http.StatusNotFound, "Message "+id+" is not among "+name+"'s dead letters (redriven since?): nothing to do, look again.")
		return
	}
	data := map[string]any{"Queue": name, "Do": do, "N": n, "CSRF": cs.csrf("queue\x00" + name)}
	if dl != nil {
		data["One"] = deadRow{ID: dl.Message.ID, Reason: dl.Reason, At: stamp(dl.At), Receives: dl.Message.ReceiveCount, Size: len(dl.Message.Body)}
	}
	cs.render(w, c, http.StatusOK, "queueconfirm", "Redrive "+name, data)
}

func (cs *console) redrive(w http.ResponseWriter, r *http.Request, c *call) {
	ctx := r.Context()
	name, do := r.PostFormValue("queue"), r.PostFormValue("do")
	if !cs.csrfOK(r, "queue\x00"+name) {
		c.outcome = "csrf-refused"
		cs.fail(w, r, c, http.StatusForbidden, "The form's CSRF token is missing or wrong: reload the queues page and try again.")
		return
	}
	if do != "one" && do != "all" {
		cs.fail(w, r, c, http.StatusBadRequest, "Unknown action.")
		return
	}
	c.outcome = "console-redrive"
	h, err := cs.queues(ctx)
	if err != nil {
		cs.fail(w, r, c, http.StatusNotFound, "This store's database holds no queues.")
		return
	}
	defer h.close()
	if do == "one" {
		// The dead letter the confirmation named, or nothing.
		id := r.PostFormValue("id")
		moved, err := h.redriveMessage(context.WithoutCancel(ctx), name, id)
		switch {
		case errors.Is(err, sqlqueue.ErrBadID):
			cs.fail(w, r, c, http.StatusBadRequest, "The form names no message id.")
			return
		case err != nil:
			cs.storeFailed(w, r, c, "redrive", err)
			return
		case !moved:
			c.outcome = "console-refused"
			cs.fail(w, r, c, http.StatusConflict, "Message "+id+" is no longer one of "+name+"'s dead letters (redriven since?): nothing done, look again.")
			return
		}
		cs.redriven(w, r, c, name, 1)
		return
	}
	// A redrive runs to its end even if the browser leaves.
	n, err := h.redrive(context.WithoutCancel(ctx), name, 0)
	if err != nil {
		// What was moved stays moved (redrive works in transactions of up
		// to 1,000 messages).
		cs.storeFailed(w, r, c, fmt.Sprintf("redrive, after %d dead letter(s) were moved", n), err)
		return
	}
	cs.redriven(w, r, c, name, n)
}

// redriven logs a redrive of n dead letters of queue and sends the browser
// back to the queues page, which says so.
func (cs *console) redriven(w http.ResponseWriter, r *http.Request, c *call, queue string, n int) {
	c.extra = append(c.extra, slog.String("queue", queue), slog.Int("redriven", n))
	cs.log.LogAttrs(r.Context(), slog.LevelInfo, "idem console: redrive", slog.String("queue", queue), slog.Int("redriven", n))
	c.status = http.StatusSeeOther
	http.Redirect(w, r, "/console/queues?"+url.Values{"redriven": {strconv.Itoa(n)}, "queue": {queue}}.Encode(), c.status)
}
