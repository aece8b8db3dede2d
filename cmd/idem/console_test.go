package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/dynamostore"
	"github.com/idemkit/idem/store/memstore"
	"github.com/idemkit/idem/store/pgstore"
	"github.com/idemkit/idem/store/sqlitestore"
)

// consoleKeys are the keys seedConsole writes, by the state they end in.
var consoleKeys = map[string]string{
	"mail:stuck":   "indeterminate",
	"mail:lapsed":  "lapsed",
	"mail:failed":  "failed",
	"mail:done":    "completed",
	"mail:running": "in_progress",
	"pay:1":        "completed",
}

// seedConsole writes a ledger with stuck, failed and completed keys:
// an at_most_once key whose attempt lapsed (indeterminate), an
// at_least_once one (lapsed), a failed key, two completed keys (one after a
// takeover) and a key whose lease is live. advance lets the short leases
// lapse on the store's clock.
func seedConsole(t testing.TB, s store.Store, advance func(time.Duration)) {
	t.Helper()
	ctx := context.Background()
	claim := func(key string, p idem.Policy, lease time.Duration) store.ClaimResult {
		t.Helper()
		res, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: key, Owner: "worker-1", Correlation: "msg-" + key,
			Policy: p, Lease: lease, Retention: 24 * time.Hour})
		if err != nil || !res.Acquired {
			t.Fatalf("claim %s: %v %+v", key, err, res)
		}
		return res
	}
	finish := func(res store.ClaimResult, o store.Outcome, result, reason string) {
		t.Helper()
		err := s.Finish(ctx, store.FinishRequest{Key: res.Record.Key, Fence: res.Record.Fence, AttemptID: res.Record.AttemptID,
			Outcome: o, Result: []byte(result), Reason: reason, Retention: 24 * time.Hour})
		if err != nil {
			t.Fatalf("finish %s: %v", res.Record.Key, err)
		}
	}
	claim("mail:stuck", idem.AtMostOnce, time.Second)
	claim("mail:lapsed", idem.AtLeastOnce, time.Second)
	finish(claim("mail:failed", idem.AtLeastOnce, time.Minute), store.OutcomeFailed, "", "mailbox does not exist")
	first := claim("pay:1", idem.AtLeastOnce, time.Second)
	advance(1500 * time.Millisecond)
	second := claim("pay:1", idem.AtLeastOnce, time.Minute) // a takeover
	finish(second, store.OutcomeCompleted, "ch_42", "")
	// The first attempt comes back late: a lease loss.
	if err := s.Finish(ctx, store.FinishRequest{Key: "pay:1", Fence: first.Record.Fence, AttemptID: first.Record.AttemptID,
		Outcome: store.OutcomeCompleted, Retention: time.Hour}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("late finish: %v", err)
	}
	finish(claim("mail:done", idem.AtLeastOnce, time.Minute), store.OutcomeCompleted, "ses-1", "")
	claim("mail:running", idem.AtLeastOnce, time.Hour)
}

// consoleClient is a browser's requests to a test server's console: it
// follows no redirect and sends a POST from the console's own origin.
type consoleClient struct {
	t     testing.TB
	base  string
	token string
	c     *http.Client
}

type page struct {
	status   int
	location string
	body     string
}

func (p page) has(t testing.TB, want ...string) page {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(p.body, w) {
			t.Fatalf("the page (%d) lacks %q:\n%s", p.status, w, p.body)
		}
	}
	return p
}

func (p page) lacks(t testing.TB, not ...string) page {
	t.Helper()
	for _, w := range not {
		if strings.Contains(p.body, w) {
			t.Fatalf("the page (%d) has %q:\n%s", p.status, w, p.body)
		}
	}
	return p
}

func (p page) is(t testing.TB, status int) page {
	t.Helper()
	if p.status != status {
		t.Fatalf("status %d, want %d:\n%s", p.status, status, p.body)
	}
	return p
}

// field returns the value of the form field name on the page.
func (p page) field(t testing.TB, name string) string {
	t.Helper()
	m := regexp.MustCompile(`name="` + name + `" value="([^"]*)"`).FindStringSubmatch(p.body)
	if m == nil {
		t.Fatalf("no field %s on the page:\n%s", name, p.body)
	}
	return html.UnescapeString(m[1])
}

// link returns the href of the element with id on the page.
func (p page) link(t testing.TB, id string) string {
	t.Helper()
	m := regexp.MustCompile(`id="` + id + `" href="([^"]*)"`).FindStringSubmatch(p.body)
	if m == nil {
		t.Fatalf("no link %s on the page:\n%s", id, p.body)
	}
	return html.UnescapeString(m[1])
}

func (c *consoleClient) do(method, path string, form url.Values, hdr ...string) page {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.base+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", c.base)
		req.Header.Set("Sec-Fetch-Site", "same-origin")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.c.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return page{status: resp.StatusCode, location: resp.Header.Get("Location"), body: string(b)}
}

func (c *consoleClient) get(path string, hdr ...string) page {
	return c.do(http.MethodGet, path, nil, hdr...)
}

// confirmAndPost opens the confirmation page at path and posts its form,
// with extra fields set.
func (c *consoleClient) confirmAndPost(path string, extra ...string) page {
	c.t.Helper()
	conf := c.get(path).is(c.t, http.StatusOK)
	form := url.Values{}
	for _, m := range regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`).FindAllStringSubmatch(conf.body, -1) {
		form.Set(m[1], html.UnescapeString(m[2]))
	}
	for i := 0; i+1 < len(extra); i += 2 {
		form.Set(extra[i], extra[i+1])
	}
	action := regexp.MustCompile(`<form method="post" action="([^"]+)"`).FindStringSubmatch(conf.body)
	if action == nil {
		c.t.Fatalf("no form on the confirmation:\n%s", conf.body)
	}
	return c.do(http.MethodPost, action[1], form)
}

// newConsoleTest serves s with the console for t.
func newConsoleTest(t testing.TB, s store.Store, storeURL, token string, hashKeys bool) (*consoleClient, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var tok []byte
	if token != "" {
		tok = []byte(token)
	}
	srv := newServer(s, log, tok, 4096, hashKeys)
	m, err := newServeMetrics()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.shutdown)
	srv.obs, srv.metrics, srv.counters = m.observer, m.handler, m.counters
	cs, err := newConsole(s, srv.ledger, hashKeys, storeURL, log)
	if err != nil {
		t.Fatal(err)
	}
	cs.counters = srv.counters
	srv.console = cs
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &consoleClient{t: t, base: hs.URL, token: token, c: &http.Client{
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}, logs
}

func keyPath(key string) string { return "/console/key?k=" + url.QueryEscape(key) }

func confirmPath(do, key string) string {
	return "/console/confirm?do=" + do + "&k=" + url.QueryEscape(key)
}

func mustGet(t testing.TB, s store.Store, key string) idem.Record {
	t.Helper()
	rec, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return rec
}

// checkConsoleBasics loads the overview, the list and a key's page of the
// seeded ledger, and resolves the indeterminate key as done through its
// confirmation: what every store must serve.
func checkConsoleBasics(t *testing.T, c *consoleClient, s store.Store) {
	c.get("/console/").is(t, http.StatusOK).
		has(t, `id="counts"`, "mail:stuck", "mail:lapsed", "mail:failed", "takeover", "lease lost", "pay:1").
		lacks(t, "ch_42", "ses-1") // results are not shown
	list := c.get("/console/records").is(t, http.StatusOK)
	for key, state := range consoleKeys {
		list.has(t, ">"+key+"<", "st-"+state)
	}
	c.get("/console/records?state=indeterminate").is(t, http.StatusOK).has(t, "mail:stuck").lacks(t, "mail:lapsed", "mail:done")
	c.get("/console/records?state=stuck").is(t, http.StatusOK).has(t, "mail:stuck", "mail:lapsed").lacks(t, "mail:done", "pay:1")
	c.get("/console/records?prefix=pay:").is(t, http.StatusOK).has(t, "pay:1").lacks(t, "mail:")
	c.get("/console/records?updated_after=2999-01-01T00:00").is(t, http.StatusOK).has(t, "No records match")
	c.get(keyPath("mail:stuck")).is(t, http.StatusOK).
		has(t, `id="state">indeterminate`, "lapsed without recording its outcome", `id="timeline"`, "claimed by worker-1", "msg-mail:stuck")
	c.get(keyPath("pay:1")).is(t, http.StatusOK).has(t, "took over", "late finish")
	c.get(confirmPath("done", "mail:stuck")).is(t, http.StatusOK).has(t, "does not run the operation").lacks(t, "Refused")
	got := c.confirmAndPost(confirmPath("done", "mail:stuck"), "reason", "the provider's log shows the mail sent")
	if got.status != http.StatusSeeOther || !strings.Contains(got.location, "msg=done") {
		t.Fatalf("resolve done: %d %s\n%s", got.status, got.location, got.body)
	}
	c.get(got.location).is(t, http.StatusOK).has(t, "Resolved as done", `id="state">completed`, "the provider&#39;s log shows the mail sent")
	if rec := mustGet(t, s, "mail:stuck"); rec.Status != idem.StatusCompleted || rec.Reason != "the provider's log shows the mail sent" {
		t.Fatalf("after resolve: %+v", rec)
	}
	c.get(keyPath("never:claimed")).is(t, http.StatusNotFound).has(t, "No record for this key")
}

// TestConsoleSQLite drives every page and every action on SQLite.
func TestConsoleSQLite(t *testing.T) {
	clk := newClock()
	s, _ := openSQLite(t, clk)
	t.Cleanup(func() { s.Close() })
	seedConsole(t, s, clk.Advance)
	c, logs := newConsoleTest(t, s, "", "", false)
	checkConsoleBasics(t, c, s)
	ctx := context.Background()

	// The CLI's checks: a completed key is not resolved, released or
	// deleted without force; a live lease is not decided without force.
	c.get(confirmPath("notdone", "mail:done")).is(t, http.StatusOK).has(t, "Refused without force", `name="force"`)
	c.confirmAndPost(confirmPath("notdone", "mail:done")).is(t, http.StatusConflict).has(t, "not in progress")
	c.confirmAndPost(confirmPath("release", "mail:done")).is(t, http.StatusConflict).has(t, "is completed")
	c.confirmAndPost(confirmPath("delete", "mail:done")).is(t, http.StatusConflict).has(t, "is completed")
	c.confirmAndPost(confirmPath("release", "mail:running")).is(t, http.StatusConflict).has(t, "live lease")
	if rec := mustGet(t, s, "mail:done"); rec.Status != idem.StatusCompleted || string(rec.Result) != "ses-1" {
		t.Fatalf("a refused action changed the key: %+v", rec)
	}
	// With force, as the CLI's --force.
	c.confirmAndPost(confirmPath("release", "mail:done"), "force", "yes").is(t, http.StatusSeeOther)
	if rec := mustGet(t, s, "mail:done"); rec.Status != idem.StatusReleased {
		t.Fatalf("forced release: %+v", rec)
	}
	// Release of a failed key, resolve not done of a lapsed one, delete.
	c.get(confirmPath("release", "mail:failed")).has(t, "runs the operation again, as attempt 2")
	c.confirmAndPost(confirmPath("release", "mail:failed")).is(t, http.StatusSeeOther)
	if rec := mustGet(t, s, "mail:failed"); rec.Status != idem.StatusReleased {
		t.Fatalf("release: %+v", rec)
	}
	c.confirmAndPost(confirmPath("notdone", "mail:lapsed")).is(t, http.StatusSeeOther)
	if rec := mustGet(t, s, "mail:lapsed"); rec.Status != idem.StatusReleased || rec.Journal[len(rec.Journal)-1].ResolvedBy != consoleBy {
		t.Fatalf("resolve not done: %+v", rec)
	}
	c.get(confirmPath("release", "mail:lapsed")).has(t, "already released")
	c.get(confirmPath("delete", "pay:1")).has(t, "Refused without force")
	c.confirmAndPost(confirmPath("delete", "mail:failed")).is(t, http.StatusSeeOther)
	if _, err := s.Get(ctx, "mail:failed"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}

	// A confirmation read before the key moved on acts on nothing.
	conf := c.get(confirmPath("done", "mail:running")).is(t, http.StatusOK)
	form := url.Values{"csrf": {conf.field(t, "csrf")}, "k": {"mail:running"}, "do": {"done"}, "fence": {"1"}, "force": {"yes"}}
	c.do(http.MethodPost, "/console/act", form).is(t, http.StatusConflict).has(t, "changed since you inspected it")

	// CSRF: no token, a token for another key, a cross-site form.
	form.Set("fence", conf.field(t, "fence"))
	bad := url.Values{"k": {"mail:running"}, "do": {"done"}, "fence": form["fence"], "force": {"yes"}}
	c.do(http.MethodPost, "/console/act", bad).is(t, http.StatusForbidden).has(t, "CSRF")
	bad.Set("csrf", c.get(confirmPath("done", "pay:1")).field(t, "csrf"))
	c.do(http.MethodPost, "/console/act", bad).is(t, http.StatusForbidden).has(t, "CSRF")
	c.do(http.MethodPost, "/console/act", form, "Origin", "http://evil.example").is(t, http.StatusForbidden)
	c.do(http.MethodPost, "/console/act", form, "Sec-Fetch-Site", "cross-site").is(t, http.StatusForbidden)
	c.get("/console/", "Sec-Fetch-Site", "cross-site").is(t, http.StatusForbidden)
	c.get("/console/", "Host", "evil.example").is(t, http.StatusForbidden).has(t, "loopback")
	c.get("/console/act").is(t, http.StatusMethodNotAllowed)
	c.do(http.MethodPost, "/console/", url.Values{}).is(t, http.StatusMethodNotAllowed)
	if rec := mustGet(t, s, "mail:running"); rec.Status != idem.StatusInProgress {
		t.Fatalf("a refused form changed the key: %+v", rec)
	}
	// The API's own guards stay: a web page cannot claim.
	c.do(http.MethodPost, "/v1/claim", url.Values{"key": {"x"}}).is(t, http.StatusForbidden)

	// Pagination: 60 keys under bulk:, 50 a page.
	for i := range 60 {
		if _, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: fmt.Sprintf("bulk:%03d", i), Lease: time.Minute, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	p1 := c.get("/console/records?prefix=bulk:").is(t, http.StatusOK).has(t, "bulk:000", "bulk:049").lacks(t, "bulk:050", "mail:")
	c.get(p1.link(t, "next")).is(t, http.StatusOK).has(t, "bulk:050", "bulk:059").lacks(t, "bulk:049", `id="next"`)
	// A search by key opens its page.
	if p := c.get("/console/records?key=pay%3A1"); p.status != http.StatusSeeOther || p.location != keyPath("pay:1") {
		t.Fatalf("search: %d %s", p.status, p.location)
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Fatalf("errors logged:\n%s", logs)
	}
}

// TestConsoleHashKeys: under --hash-keys no page holds a raw key, and the
// pages and actions still work, naming keys by sealed references.
func TestConsoleHashKeys(t *testing.T) {
	clk := newClock()
	s, _ := openSQLite(t, clk)
	t.Cleanup(func() { s.Close() })
	seedConsole(t, s, clk.Advance)
	c, logs := newConsoleTest(t, s, "", "", true)
	raw := []string{"mail:stuck", "mail:lapsed", "mail:failed", "mail:done", "mail:running", "pay:1", "mail%3A", "pay%3A"}
	hash := srvHash(s, "mail:stuck")
	ov := c.get("/console/").is(t, http.StatusOK).lacks(t, raw...).has(t, hash)
	list := c.get("/console/records").is(t, http.StatusOK).lacks(t, raw...)
	ref := regexp.MustCompile(`href="(/console/key\?k=[^"]+)">key_hash ` + hash).FindStringSubmatch(list.body)
	if ref == nil {
		t.Fatalf("no link to %s in:\n%s", hash, list.body)
	}
	_ = ov
	kp := c.get(html.UnescapeString(ref[1])).is(t, http.StatusOK).lacks(t, raw...).has(t, "key_hash "+hash, "lapsed without recording")
	conf := c.get(kp.link(t, "do-done")).is(t, http.StatusOK).lacks(t, raw...)
	_ = conf
	c.confirmAndPost(kp.link(t, "do-done")).is(t, http.StatusSeeOther)
	if rec := mustGet(t, s, "mail:stuck"); rec.Status != idem.StatusCompleted {
		t.Fatalf("after resolve: %+v", rec)
	}
	// A search by the raw key goes to its page by reference.
	p := c.get("/console/records?key=pay%3A1").is(t, http.StatusSeeOther)
	c.get(p.location).is(t, http.StatusOK).lacks(t, raw...).has(t, "took over")
	// A reference this process did not seal is refused.
	c.get("/console/key?k=pay%3A1").is(t, http.StatusBadRequest)
	for _, k := range raw[:6] {
		if strings.Contains(logs.String(), k) {
			t.Fatalf("a raw key reached the log:\n%s", logs)
		}
	}
}

func srvHash(s store.Store, key string) string {
	return idem.New(s, idem.WithHashedKeysInLogs()).LogKey(key).Value.String()
}

// TestConsoleAuth: with a token the console needs it, like the API;
// --console=false serves no console.
func TestConsoleAuth(t *testing.T) {
	s := openServeSQLite(t)
	c, _ := newConsoleTest(t, s, "", "s3cret", false)
	c.get("/console/").is(t, http.StatusOK).lacks(t, "s3cret")
	c.token = ""
	c.get("/console/").is(t, http.StatusUnauthorized)
	c.get("/console/", "Authorization", "Bearer wrong").is(t, http.StatusUnauthorized)

	api, _ := newServeTest(t, s, "", false) // newServer alone: --console=false
	api.do(http.MethodGet, "/console/", "").expect(t, http.StatusNotFound, "not-found")
}

// TestConsoleQueuesSQLite: the queues page's stats and dead letters, and a
// redrive of one and of all, through their confirmations.
func TestConsoleQueuesSQLite(t *testing.T) {
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, t.TempDir()+"/idem.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c, _ := newConsoleTest(t, st, "", "", false)
	c.get("/console/queues").is(t, http.StatusOK).has(t, "no sqlqueue tables")
	qs, err := sqlqueue.NewSQLite(ctx, st.DB())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qs.Close() })
	orders, _ := qs.Queue("orders")
	mail, _ := qs.Queue("mail")
	fillQueues(t, orders, mail)
	checkConsoleQueues(t, c, orders)

	m, _ := newConsoleTest(t, memstore.New(), "", "", false)
	m.get("/console/queues").is(t, http.StatusOK).has(t, "keeps no queues")
}

func checkConsoleQueues(t *testing.T, c *consoleClient, orders interface {
	Stats(context.Context) (sqlqueue.Stats, error)
	DeadLetters(context.Context, int) ([]sqlqueue.DeadLetter, error)
}) {
	t.Helper()
	ctx := context.Background()
	c.get("/console/").is(t, http.StatusOK).has(t, `id="queues"`, "orders")
	c.get("/console/queues").is(t, http.StatusOK).
		has(t, `<td class="mono">orders</td>`, `orders</span> (2)`, "poison").lacks(t, ">o1<", ">o2<")
	dls, err := orders.DeadLetters(ctx, 10)
	if err != nil || len(dls) != 2 {
		t.Fatalf("dead letters: %d, %v", len(dls), err)
	}
	// Redrive the newer of the two, not the oldest: the one the operator chose.
	chosen, other := dls[1].Message.ID, dls[0].Message.ID
	confirm := "/console/queues/confirm?" + url.Values{"queue": {"orders"}, "do": {"one"}, "id": {chosen}}.Encode()
	conf := c.get(confirm).is(t, http.StatusOK).has(t, "Message "+chosen, "receive count reset to 0")
	if id := conf.field(t, "id"); id != chosen {
		t.Fatalf("the confirmation's form names message %s, want %s", id, chosen)
	}
	c.get("/console/queues/confirm?queue=orders&do=one").is(t, http.StatusBadRequest)
	c.get("/console/queues/confirm?queue=orders&do=one&id=999999").is(t, http.StatusNotFound)
	got := c.confirmAndPost(confirm)
	if got.status != http.StatusSeeOther {
		t.Fatalf("redrive one: %d\n%s", got.status, got.body)
	}
	c.get(got.location).is(t, http.StatusOK).has(t, "1 dead letter(s) of orders redriven")
	if dls, err := orders.DeadLetters(ctx, 10); err != nil || len(dls) != 1 || dls[0].Message.ID != other {
		t.Fatalf("after redriving %s, the dead letters are %+v (%v); want only %s", chosen, dls, err, other)
	}
	// A stale confirmation (its message went back already) moves nothing.
	form := url.Values{"csrf": {conf.field(t, "csrf")}, "queue": {"orders"}, "do": {"one"}, "id": {chosen}}
	c.do(http.MethodPost, "/console/queues/redrive", form).is(t, http.StatusConflict)
	form.Set("id", "not-an-id")
	c.do(http.MethodPost, "/console/queues/redrive", form).is(t, http.StatusBadRequest)
	form.Del("csrf")
	c.do(http.MethodPost, "/console/queues/redrive", form).is(t, http.StatusForbidden)
	c.confirmAndPost("/console/queues/confirm?queue=orders&do=all").is(t, http.StatusSeeOther)
	if st, err := orders.Stats(ctx); err != nil || st.DeadLettered != 0 {
		t.Fatalf("after redrive all: %+v %v", st, err)
	}
	c.get("/console/queues").is(t, http.StatusOK).lacks(t, "Dead letters of")
}

// TestConsolePostgres: the list, the key pages, an action and the queues
// on PostgreSQL.
func TestConsolePostgres(t *testing.T) {
	clk := newClock()
	s, u := openPostgres(t, clk)
	t.Cleanup(func() { s.Close() })
	seedConsole(t, s, clk.Advance)
	c, _ := newConsoleTest(t, s, u, "", false)
	checkConsoleBasics(t, c, s)
	// The queue tables in the store's schema (its search_path).
	qs, err := sqlqueue.NewPostgres(context.Background(), s.(*pgstore.Store).Pool())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qs.Close() })
	orders, _ := qs.Queue("orders")
	mail, _ := qs.Queue("mail")
	fillQueues(t, orders, mail)
	checkConsoleQueues(t, c, orders)
}

// TestConsoleRedis: the list, the key pages and an action on Redis (real
// time: the seeded leases lapse by waiting).
func TestConsoleRedis(t *testing.T) {
	testenv.Require(t, testenv.Redis, "the console's tests on Redis")
	s, advance := openServeRedis(t)
	seedConsole(t, s, advance)
	c, _ := newConsoleTest(t, s, "", "", false)
	checkConsoleBasics(t, c, s)
}

// TestConsoleDynamoDB: the list, the key pages and an action on DynamoDB
// (dynalite; real time).
func TestConsoleDynamoDB(t *testing.T) {
	ep := testenv.Require(t, testenv.DynamoDB, "the console's tests on DynamoDB")
	ctx := context.Background()
	client := dynamodb.New(dynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(ep),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "idemtest", SecretAccessKey: "idemtest"}, nil
		}),
	})
	var b [4]byte
	rand.Read(b[:])
	table := "idemconsole-" + hex.EncodeToString(b[:])
	if err := dynamostore.CreateTable(ctx, client, table); err != nil && !errors.Is(err, dynamostore.ErrTTLUnsupported) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	})
	s := dynamostore.New(client, table)
	seedConsole(t, s, time.Sleep)
	c, _ := newConsoleTest(t, s, "", "", false)
	checkConsoleBasics(t, c, s)
}

// TestConsoleCorrupt: a corrupt record is listed and counted, its page says
// so, and only a forced delete removes it.
func TestConsoleCorrupt(t *testing.T) {
	ctx := context.Background()
	u := corruptStore(t, []string{"a", "b", "c"}, "b")
	s, err := sqlitestore.Open(ctx, strings.TrimPrefix(u, "sqlite:"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c, _ := newConsoleTest(t, s, u, "", false)
	c.get("/console/").is(t, http.StatusOK).has(t, "st-corrupt", ">b<")
	c.get("/console/records").is(t, http.StatusOK).has(t, ">a<", ">b<", ">c<", "st-corrupt")
	c.get(keyPath("b")).is(t, http.StatusOK).has(t, `id="corrupt"`, `id="do-delete"`).lacks(t, `id="do-done"`)
	c.get(confirmPath("done", "b")).is(t, http.StatusConflict)
	c.get(confirmPath("delete", "b")).is(t, http.StatusOK).has(t, "Refused without force", `name="force"`)
	c.confirmAndPost(confirmPath("delete", "b")).is(t, http.StatusConflict)
	c.confirmAndPost(confirmPath("delete", "b"), "force", "yes").is(t, http.StatusSeeOther)
	if _, err := s.Get(ctx, "b"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after the forced delete: %v", err)
	}
}
