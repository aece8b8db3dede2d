package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/webhook"
)

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

func open(t *testing.T) *App {
	t.Helper()
	a, err := Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"), secret, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

// deliver sends a signed notification as the payment provider would.
func deliver(t *testing.T, url, id, body string) (int, string, http.Header) {
	t.Helper()
	scheme, _ := webhook.NewStandard(secret)
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Webhook-Id", id)
	now := time.Now()
	req.Header.Set("Webhook-Timestamp", fmt.Sprint(now.Unix()))
	req.Header.Set("Webhook-Signature", scheme.Sign(id, now, []byte(body)))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b), res.Header
}

// runWorker runs the consumer until the queue is empty.
func runWorker(t *testing.T, a *App) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = a.Worker.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := a.Events.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.Ready+st.InFlight+st.Delayed == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("events not processed: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// "What happens if this arrives twice?" The order is paid once, and the
// second delivery gets the first answer.
func TestArrivesTwicePaidOnce(t *testing.T) {
	a := open(t)
	srv := httptest.NewServer(a.Receiver)
	defer srv.Close()
	body := `{"type":"payment.succeeded","order_id":"o-1","amount":4200}`
	code1, body1, h1 := deliver(t, srv.URL, "evt_1", body)
	code2, body2, h2 := deliver(t, srv.URL, "evt_1", body) // the sender retried
	if code1 != 200 || code2 != 200 || body1 != body2 || h1.Get("Idempotent-Replayed") != "" || h2.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("deliveries: %d %q / %d %q (replayed %q); want the same 200 twice, the second replayed", code1, body1, code2, body2, h2.Get("Idempotent-Replayed"))
	}
	runWorker(t, a)
	if cents, n, err := a.Paid(context.Background(), "o-1"); err != nil || cents != 4200 || n != 1 {
		t.Fatalf("order o-1: %d cents in %d payments (%v), want 4200 in 1", cents, n, err)
	}
}

// "What do we return when we fail?" Not a success: a bad signature is 401
// and nothing is captured; a queue that is down is 500, so the sender
// retries later instead of believing the event was taken.
func TestFailuresAreNotSuccess(t *testing.T) {
	a := open(t)
	srv := httptest.NewServer(a.Receiver)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"type":"payment.succeeded","order_id":"o-2","amount":1}`))
	req.Header.Set("Webhook-Id", "evt_forged")
	req.Header.Set("Webhook-Timestamp", fmt.Sprint(time.Now().Unix()))
	req.Header.Set("Webhook-Signature", "v1,Zm9yZ2Vk")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("forged signature: %d, want 401", res.StatusCode)
	}
	if st, _ := a.Events.Stats(context.Background()); st.Ready != 0 {
		t.Fatalf("a forged delivery was captured: %+v", st)
	}
	a.Queues.Close() // the queue goes away
	if code, body, _ := deliver(t, srv.URL, "evt_2", `{"type":"payment.succeeded","order_id":"o-2","amount":1}`); code != http.StatusInternalServerError {
		t.Fatalf("delivery while the queue is down: %d %s, want 500", code, body)
	}
}

// Claim-then-fail must not drop work: a fulfilment that fails is retried
// until it succeeds, and the order is still paid once.
func TestFulfilmentFailureIsRetried(t *testing.T) {
	a := open(t)
	srv := httptest.NewServer(a.Receiver)
	defer srv.Close()
	if code, _, _ := deliver(t, srv.URL, "evt_3", `{"type":"payment.succeeded","order_id":"o-3","amount":700}`); code != 200 {
		t.Fatalf("delivery: %d", code)
	}
	var failures atomic.Int32
	real := a.fulfil
	flaky := func(ctx context.Context, m queue.Message) ([]byte, error) {
		if failures.Add(1) <= 2 {
			return nil, fmt.Errorf("database is locked (simulated)")
		}
		return real(ctx, m)
	}
	c, err := queue.NewConsumer(a.Events, a.ledger, webhook.EventKey, flaky,
		queue.WithBackoff(10*time.Millisecond, 20*time.Millisecond), queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	a.Worker = c
	runWorker(t, a)
	if cents, n, err := a.Paid(context.Background(), "o-3"); err != nil || cents != 700 || n != 1 {
		t.Fatalf("order o-3 after two failures: %d cents in %d payments (%v), want 700 in 1", cents, n, err)
	}
}

// The app's own settings raise no warning: the queue's visibility is at
// least 6× the worker's handler timeout, as the Consumer asks.
func TestOpensWithoutWarnings(t *testing.T) {
	var warned []string
	log := slog.New(recordHandler{min: slog.LevelWarn, got: &warned})
	a, err := Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"), secret, log)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if len(warned) > 0 {
		t.Fatalf("opening the app logged warnings: %q", warned)
	}
}

// recordHandler keeps the messages of records at min or above.
type recordHandler struct {
	min slog.Level
	got *[]string
}

func (h recordHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.min }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	*h.got = append(*h.got, r.Message)
	return nil
}
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordHandler) WithGroup(string) slog.Handler      { return h }
