package webhook

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

func newReceiver(t testing.TB, e *env, c Capture, opts ...Option) (*Receiver, *Standard) {
	t.Helper()
	s := mustStandard(t.(*testing.T), testSecret)
	r, err := NewReceiver("acme", s, e.l, c, append([]Option{WithLogger(quiet)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return r, s
}

// A sender's retry of a captured event (new timestamp, new signature, same
// id) gets the first answer again, marked replayed, and the queue holds one
// message: the raw body, byte for byte, with the verified attributes.
func TestReceiverCapturesOnce(t *testing.T) {
	for _, mode := range []string{"plain", "tx"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			rc, s := newReceiver(t, e, captures(e)[mode])
			// Odd spacing and key order: a re-serialized body would not verify.
			body := `{ "type":"invoice.paid",  "b":2, "a":1 }`
			now := time.Now()
			first := serve(rc, swRequest(t, s, "msg_1", body, now))
			if first.status != http.StatusOK {
				t.Fatalf("first delivery: %d %s", first.status, first.body)
			}
			if first.header.Get(ReplayedHeader) != "" {
				t.Fatalf("first delivery marked replayed")
			}
			var ab acceptedBody
			if err := json.Unmarshal(first.body, &ab); err != nil || ab.EventID != "msg_1" || ab.Source != "acme" || ab.MessageID == "" {
				t.Fatalf("answer %s (%v)", first.body, err)
			}
			for i := 1; i <= 3; i++ {
				again := serve(rc, swRequest(t, s, "msg_1", body, now.Add(time.Duration(i)*time.Minute)))
				if again.status != first.status || !bytes.Equal(again.body, first.body) {
					t.Fatalf("retry %d: %d %s, want the first answer %d %s", i, again.status, again.body, first.status, first.body)
				}
				if again.header.Get(ReplayedHeader) != "true" {
					t.Fatalf("retry %d: %s = %q, want true", i, ReplayedHeader, again.header.Get(ReplayedHeader))
				}
			}
			msgs := e.pub.messages(t)
			if len(msgs) != 1 {
				t.Fatalf("%d messages queued, want 1", len(msgs))
			}
			m := msgs[0]
			if string(m.Body) != body {
				t.Fatalf("queued body %q, want the raw %q", m.Body, body)
			}
			want := map[string]string{AttrSource: "acme", AttrEventID: "msg_1", AttrVerified: "true",
				AttrContentType: "application/json", AttrTimestamp: formatUnix(now)}
			for k, v := range want {
				if m.Attrs[k] != v {
					t.Errorf("attribute %s = %q, want %q", k, m.Attrs[k], v)
				}
			}
			if m.DedupID != "accept:acme:msg_1" {
				t.Errorf("DedupID %q, want the operation key accept:acme:msg_1", m.DedupID)
			}
			// A different event is a new operation.
			if a := serve(rc, swRequest(t, s, "msg_2", body, now)); a.status != 200 || a.header.Get(ReplayedHeader) != "" {
				t.Fatalf("second event: %d %v", a.status, a.header)
			}
			if n := len(e.pub.messages(t)); n != 2 {
				t.Fatalf("%d messages after a second event, want 2", n)
			}
		})
	}
}

// Many deliveries of one event at once: exactly one message. In the
// transactional mode SQLite serializes them and all get 200 (one fresh, the
// rest replayed); in the plain mode the others may get 409 + Retry-After
// while the first is being captured. Nobody gets 5xx.
func TestReceiverConcurrentDuplicates(t *testing.T) {
	for _, mode := range []string{"plain", "tx"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			rc, s := newReceiver(t, e, captures(e)[mode])
			const n = 16
			var wg sync.WaitGroup
			answers := make([]answer, n)
			for i := range n {
				wg.Go(func() {
					answers[i] = serve(rc, swRequest(t, s, "msg_dup", `{"n":1}`, time.Now()))
				})
			}
			wg.Wait()
			fresh := 0
			for _, a := range answers {
				switch {
				case a.status == 200 && a.header.Get(ReplayedHeader) == "":
					fresh++
				case a.status == 200:
				case a.status == 409 && mode == "plain":
					if a.header.Get("Retry-After") == "" {
						t.Errorf("409 without Retry-After")
					}
				default:
					t.Errorf("answer %d %s", a.status, a.body)
				}
			}
			if fresh != 1 {
				t.Errorf("%d fresh 200s, want 1", fresh)
			}
			if msgs := e.pub.messages(t); len(msgs) != 1 {
				t.Fatalf("%d messages, want 1", len(msgs))
			}
		})
	}
}

// While the first delivery is still being captured, a duplicate gets 409
// with Retry-After (the seconds left on the first one's lease) and a
// problem body; it does not wait and does not publish.
func TestReceiverInProgressConflict(t *testing.T) {
	e := newEnv(t, idem.WithLease(20*time.Second))
	rc, s := newReceiver(t, e, Publish(e.pub))
	entered, release := make(chan struct{}), make(chan struct{})
	e.pub.setHook(func(ctx context.Context) error {
		close(entered)
		<-release
		return nil
	})
	done := make(chan answer)
	go func() { done <- serve(rc, swRequest(t, s, "msg_slow", `{}`, time.Now())) }()
	<-entered
	e.pub.setHook(nil)
	dup := serve(rc, swRequest(t, s, "msg_slow", `{}`, time.Now()))
	close(release)
	first := <-done
	if dup.status != http.StatusConflict {
		t.Fatalf("duplicate during capture: %d %s, want 409", dup.status, dup.body)
	}
	ra, err := strconv.Atoi(dup.header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 20 {
		t.Fatalf("Retry-After %q, want 1..20 seconds", dup.header.Get("Retry-After"))
	}
	if p := problemOf(t, dup); p.Type != ProblemTypePrefix+"in-progress" {
		t.Fatalf("problem %+v", p)
	}
	if first.status != 200 {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	if n := len(e.pub.messages(t)); n != 1 {
		t.Fatalf("%d messages, want 1", n)
	}
}

// A publish that fails answers 500 with Retry-After, never 200; the key is
// released, so the sender's retry captures the event (once).
func TestReceiverPublishFails(t *testing.T) {
	for _, mode := range []string{"plain", "tx"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			rc, s := newReceiver(t, e, captures(e)[mode])
			e.pub.setHook(func(context.Context) error { return errInjected })
			a := serve(rc, swRequest(t, s, "msg_f", `{"x":1}`, time.Now()))
			if a.status != http.StatusInternalServerError || a.header.Get("Retry-After") == "" {
				t.Fatalf("publish failed: %d (Retry-After %q) %s, want 500 with Retry-After", a.status, a.header.Get("Retry-After"), a.body)
			}
			if p := problemOf(t, a); p.Type != ProblemTypePrefix+"capture-failed" || strings.Contains(string(a.body), "broker unreachable") {
				t.Fatalf("problem %s (must not leak internals)", a.body)
			}
			if n := len(e.pub.messages(t)); n != 0 {
				t.Fatalf("%d messages after a failed publish", n)
			}
			e.pub.setHook(nil)
			retry := serve(rc, swRequest(t, s, "msg_f", `{"x":1}`, time.Now()))
			if retry.status != 200 || retry.header.Get(ReplayedHeader) != "" {
				t.Fatalf("retry after the failure: %d %s replayed=%q, want a fresh 200", retry.status, retry.body, retry.header.Get(ReplayedHeader))
			}
			if n := len(e.pub.messages(t)); n != 1 {
				t.Fatalf("%d messages, want 1", n)
			}
		})
	}
}

// In the transactional mode a publish that wrote its row and then failed
// leaves no row: the row, the claim and the completion are one transaction.
func TestReceiverTxRollsBackPartialPublish(t *testing.T) {
	e := newEnv(t)
	fail := &failAfterWrite{sqlitePub: e.pub}
	rc, s := newReceiver(t, e, PublishTx[*sql.Tx](fail))
	a := serve(rc, swRequest(t, s, "msg_tx", `{}`, time.Now()))
	if a.status != 500 {
		t.Fatalf("%d %s, want 500", a.status, a.body)
	}
	if n := len(e.pub.messages(t)); n != 0 {
		t.Fatalf("%d rows survived the rolled-back transaction", n)
	}
	if _, err := e.store.Get(context.Background(), "accept:acme:msg_tx"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("key after rollback: %v, want absent", err)
	}
}

type failAfterWrite struct{ *sqlitePub }

func (f *failAfterWrite) PublishTx(ctx context.Context, tx *sql.Tx, m queueOutgoing) (queuePublished, error) {
	if _, err := f.sqlitePub.PublishTx(ctx, tx, m); err != nil {
		return queuePublished{}, err
	}
	return queuePublished{}, errInjected
}

// A store that fails mid-request never yields 200: a failed claim answers
// 500 and publishes nothing; a completion that fails after the publish
// answers 500 too (the sender retries). The retry waits for the lease (409),
// then takes the key over and publishes again under the same DedupID, which
// a broker with dedup drops; that is the window Publish documents and
// PublishTx closes.
func TestReceiverStoreFailsMidRequest(t *testing.T) {
	e := newEnv(t, idem.WithLease(10*time.Second))
	fs := idemtest.NewFaultStore(e.store)
	l := idem.New(fs, idem.WithLogger(quiet), idem.WithLease(10*time.Second))
	s := mustStandard(t, testSecret)
	rc, err := NewReceiver("acme", s, l, Publish(e.pub), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	fs.Inject(idemtest.OpClaim, idemtest.Fault{Err: errInjected})
	if a := serve(rc, swRequest(t, s, "msg_s", `{}`, time.Now())); a.status != 500 {
		t.Fatalf("claim failed: %d %s, want 500", a.status, a.body)
	}
	if n := len(e.pub.messages(t)); n != 0 {
		t.Fatalf("%d messages after a failed claim", n)
	}
	fs.Heal(idemtest.OpClaim)

	fs.Inject(idemtest.OpComplete, idemtest.Fault{Err: errInjected})
	if a := serve(rc, swRequest(t, s, "msg_s", `{}`, time.Now())); a.status != 500 {
		t.Fatalf("complete failed: %d %s, want 500", a.status, a.body)
	}
	fs.Heal(idemtest.OpComplete)
	if a := serve(rc, swRequest(t, s, "msg_s", `{}`, time.Now())); a.status != 409 {
		t.Fatalf("retry inside the lease: %d %s, want 409", a.status, a.body)
	}
	e.clock.Add(11 * time.Second)
	a := serve(rc, swRequest(t, s, "msg_s", `{}`, time.Now()))
	if a.status != 200 {
		t.Fatalf("retry after the lease: %d %s, want 200", a.status, a.body)
	}
	msgs := e.pub.messages(t)
	if len(msgs) != 2 || msgs[0].DedupID != msgs[1].DedupID {
		t.Fatalf("messages %+v, want 2 copies under one DedupID", msgs)
	}
	if a := serve(rc, swRequest(t, s, "msg_s", `{}`, time.Now())); a.status != 200 || a.header.Get(ReplayedHeader) != "true" {
		t.Fatalf("after capture: %d replayed=%q", a.status, a.header.Get(ReplayedHeader))
	}
}

// Requests refused before the ledger never touch the store or the queue.
func TestReceiverRefusals(t *testing.T) {
	e := newEnv(t)
	fs := idemtest.NewFaultStore(e.store)
	l := idem.New(fs, idem.WithLogger(quiet))
	s := mustStandard(t, testSecret)
	rc, err := NewReceiver("acme", s, l, Publish(e.pub), WithLogger(quiet), WithMaxBody(64))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	big := strings.Repeat("x", 65)
	chunked := swRequest(t, s, "msg_big", big, now)
	chunked.ContentLength = -1 // no length announced: the limit cuts the read
	wrongSecret, _ := NewStandard("whsec_" + "c2VjcmV0LXNlY3JldC1zZWNyZXQ=")
	stripeBody := swRequest(t, s, "msg_x", `{}`, now)
	stripeBody.Header.Set("Webhook-Signature", "v2,abcd")
	dupHeader := swRequest(t, s, "msg_x", `{}`, now)
	dupHeader.Header.Add("Webhook-Id", "msg_y")
	for _, c := range []struct {
		name   string
		r      *http.Request
		status int
		slug   string
	}{
		{"GET", httptest.NewRequest(http.MethodGet, "/hooks", nil), 405, "method-not-allowed"},
		{"oversized, announced", swRequest(t, s, "msg_big", big, now), 413, "body-too-large"},
		{"oversized, chunked", chunked, 413, "body-too-large"},
		{"unsigned", httptest.NewRequest(http.MethodPost, "/hooks", strings.NewReader("{}")), 401, "signature-invalid"},
		{"wrong secret", swRequest(t, wrongSecret, "msg_x", `{}`, now), 401, "signature-invalid"},
		{"unknown version", stripeBody, 401, "signature-invalid"},
		{"duplicated id header", dupHeader, 401, "signature-invalid"},
		{"stale", swRequest(t, s, "msg_x", `{}`, now.Add(-time.Hour)), 401, "signature-invalid"},
		{"future", swRequest(t, s, "msg_x", `{}`, now.Add(time.Hour)), 401, "signature-invalid"},
		{"non-UTF-8 id", swRequest(t, s, "msg_\xff", `{}`, now), 400, "event-id-invalid"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := serve(rc, c.r)
			if a.status != c.status {
				t.Fatalf("%d %s, want %d", a.status, a.body, c.status)
			}
			p := problemOf(t, a)
			if p.Type != ProblemTypePrefix+c.slug {
				t.Fatalf("problem type %s, want %s", p.Type, c.slug)
			}
			for _, secret := range []string{testSecret, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "c2VjcmV0"} {
				if strings.Contains(string(a.body), secret) {
					t.Fatalf("answer echoes a secret: %s", a.body)
				}
			}
			if c.status == 405 && a.header.Get("Allow") != "POST" {
				t.Fatalf("405 without Allow: POST")
			}
		})
	}
	if n := fs.TotalCalls(); n != 0 {
		t.Fatalf("%d store calls for refused requests, want 0", n)
	}
	if n := len(e.pub.messages(t)); n != 0 {
		t.Fatalf("%d messages for refused requests", n)
	}
}

// Ids are parts of the key, escaped: an id holding ':' cannot forge another
// source's key, and an id too long for a key is captured under its hash,
// once.
func TestReceiverKeys(t *testing.T) {
	if a, b := Key("acme", "x:y").String(), Key("acme:x", "y").String(); a == b {
		t.Fatalf("separator in an id collides: %s", a)
	}
	long := strings.Repeat("i", 2*idem.MaxKeyLen)
	k := Key("acme", long)
	if k.Err() != nil || !strings.HasPrefix(k.String(), "accept:acme:sha256:") {
		t.Fatalf("long id key %q (%v)", k.String(), k.Err())
	}
	if Key("acme", long+"j").String() == k.String() {
		t.Fatal("two long ids share a key")
	}
	if Key("acme", "sha256:"+k.String()[len("accept:acme:sha256:"):]).String() == k.String() {
		t.Fatal("an id spelled like a hashed key collides with it")
	}

	e := newEnv(t)
	rc, s := newReceiver(t, e, PublishTx[*sql.Tx](e.pub))
	for _, id := range []string{long, "evt:with:colons", `back\slash`, "ünï©ødé"} {
		for i := range 2 {
			a := serve(rc, swRequest(t, s, id, `{}`, time.Now()))
			if a.status != 200 || (i == 1) != (a.header.Get(ReplayedHeader) == "true") {
				t.Fatalf("id %.20q delivery %d: %d %s replayed=%q", id, i, a.status, a.body, a.header.Get(ReplayedHeader))
			}
		}
	}
	msgs := e.pub.messages(t)
	if len(msgs) != 4 {
		t.Fatalf("%d messages, want 4", len(msgs))
	}
	if msgs[0].Attrs[AttrEventID] != long {
		t.Fatalf("the long id is not passed on whole")
	}
}

// GitHub's delivery id is not signed: a replay of a signed body under a new
// delivery id is the same operation (keyed on the body's hash).
func TestReceiverGitHubReplayUnderNewDeliveryID(t *testing.T) {
	e := newEnv(t)
	gh, _ := NewGitHub(gh1Secret)
	rc, err := NewReceiver("github", gh, e.l, Publish(e.pub), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	req := func(delivery string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/gh", strings.NewReader(gh1Body))
		r.Header.Set("X-Hub-Signature-256", gh1Sig)
		r.Header.Set("X-GitHub-Delivery", delivery)
		return r
	}
	first := serve(rc, req("72d3162e-cc78-11e3-81ab-4c9367dc0958"))
	replay := serve(rc, req("ffffffff-cc78-11e3-81ab-4c9367dc0958"))
	if first.status != 200 || replay.status != 200 || replay.header.Get(ReplayedHeader) != "true" {
		t.Fatalf("first %d, replay %d replayed=%q", first.status, replay.status, replay.header.Get(ReplayedHeader))
	}
	if n := len(e.pub.messages(t)); n != 1 {
		t.Fatalf("%d messages, want 1", n)
	}
}

func TestNewReceiverChecks(t *testing.T) {
	s := mustStandard(t, testSecret)
	l := idem.New(memstore.New(), idem.WithLogger(quiet))
	if _, err := NewReceiver("acme", s, l, PublishTx[*sql.Tx](&sqlitePub{})); !errors.Is(err, idem.ErrNotTransactional) {
		t.Fatalf("PublishTx on memstore: %v, want ErrNotTransactional", err)
	}
	for _, c := range []struct {
		src string
		sch Scheme
		l   *idem.Ledger
		c   Capture
	}{{"", s, l, Publish(&sqlitePub{})}, {"a", nil, l, Publish(&sqlitePub{})}, {"a", s, nil, Publish(&sqlitePub{})}, {"a", s, l, nil}, {"a", s, l, Publish(nil)}} {
		if _, err := NewReceiver(c.src, c.sch, c.l, c.c); err == nil {
			t.Errorf("NewReceiver(%q, ...) accepted a missing argument", c.src)
		}
	}
}

// A source NewReceiver accepts must leave room for the longest key it
// builds (accept:<source>:sha256:<hex>, for a long id): otherwise every
// event with a long id would be answered 500 forever.
func TestNewReceiverSourceLength(t *testing.T) {
	s := mustStandard(t, testSecret)
	l := idem.New(memstore.New(), idem.WithLogger(quiet))
	long := strings.Repeat("i", 2*idem.MaxKeyLen)
	for n := idem.MaxKeyLen - 120; n <= idem.MaxKeyLen; n++ {
		src := strings.Repeat("s", n)
		_, err := NewReceiver(src, s, l, Publish(&sqlitePub{}))
		if kerr := Key(src, long).Err(); err == nil && kerr != nil {
			t.Fatalf("NewReceiver accepted a %d-byte source whose long-id keys are invalid: %v", n, kerr)
		}
	}
}

// Under AtMostOnce a failed publish leaves the key indeterminate: the retry
// is refused with 500 (never 200, never a second publish) until an operator
// resolves it.
func TestReceiverAtMostOncePublishFails(t *testing.T) {
	e := newEnv(t, idem.WithPolicy(idem.AtMostOnce), idem.WithLease(time.Second))
	rc, s := newReceiver(t, e, Publish(e.pub))
	e.pub.setHook(func(context.Context) error { return errInjected })
	if a := serve(rc, swRequest(t, s, "msg_amo", `{}`, time.Now())); a.status != 500 {
		t.Fatalf("%d %s, want 500", a.status, a.body)
	}
	e.pub.setHook(nil)
	e.clock.Add(2 * time.Second)
	if a := serve(rc, swRequest(t, s, "msg_amo", `{}`, time.Now())); a.status != 500 {
		t.Fatalf("retry of an indeterminate key: %d %s, want 500", a.status, a.body)
	}
	if n := len(e.pub.messages(t)); n != 0 {
		t.Fatalf("%d messages", n)
	}
	if _, err := e.store.Resolve(context.Background(), store.ResolveRequest{Key: "accept:acme:msg_amo", Done: false, Reason: "operator: not published"}); err != nil {
		t.Fatal(err)
	}
	if a := serve(rc, swRequest(t, s, "msg_amo", `{}`, time.Now())); a.status != 200 {
		t.Fatalf("after resolve: %d %s, want 200", a.status, a.body)
	}
}
