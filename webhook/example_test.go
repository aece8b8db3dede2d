package webhook_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/memqueue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/memstore"
	"github.com/idemkit/idem/store/sqlitestore"
	"github.com/idemkit/idem/webhook"
)

// memQueue is an in-memory queue.Publisher for the example.
type memQueue struct {
	mu   sync.Mutex
	msgs []queue.Outgoing
}

func (q *memQueue) Publish(_ context.Context, m queue.Outgoing) (queue.Published, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.msgs = append(q.msgs, m)
	return queue.Published{ID: fmt.Sprint(len(q.msgs))}, nil
}

func ExampleReceiver() {
	scheme, err := webhook.NewStandard("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		panic(err)
	}
	q := new(memQueue)
	l := idem.New(memstore.New())
	rcv, err := webhook.NewReceiver("billing", scheme, l, webhook.Publish(q))
	if err != nil {
		panic(err)
	}

	body := `{"type":"invoice.paid","invoice":"in_1"}`
	deliver := func(at time.Time) {
		r := httptest.NewRequest(http.MethodPost, "/hooks/billing", strings.NewReader(body))
		r.Header.Set("Webhook-Id", "msg_1")
		r.Header.Set("Webhook-Timestamp", fmt.Sprint(at.Unix()))
		r.Header.Set("Webhook-Signature", scheme.Sign("msg_1", at, []byte(body)))
		w := httptest.NewRecorder()
		rcv.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), w.Body.String())
	}
	now := time.Now()
	deliver(now)                  // the first delivery is captured
	deliver(now.Add(time.Minute)) // the sender's retry gets the same answer
	fmt.Println("queued:", len(q.msgs), q.msgs[0].Attributes[webhook.AttrEventID], q.msgs[0].DedupID)
	// Output:
	// 200  {"status":"accepted","source":"billing","event_id":"msg_1","message_id":"1"}
	// 200 true {"status":"accepted","source":"billing","event_id":"msg_1","message_id":"1"}
	// queued: 1 msg_1 accept:billing:msg_1
}

// The embedded default: the ledger and the queue in one SQLite file, the
// event captured in the claim's own transaction (exactly once), and a
// consumer receiving it.
func ExamplePublishTx() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "webhook-example")
	defer os.RemoveAll(dir)
	store, err := sqlitestore.Open(ctx, filepath.Join(dir, "idem.db"))
	if err != nil {
		panic(err)
	}
	defer store.Close()
	queues, err := sqlqueue.NewSQLite(ctx, store.DB(), sqlqueue.WithGroupCommit(store))
	if err != nil {
		panic(err)
	}
	defer queues.Close()
	events, _ := queues.Queue("stripe-events")

	scheme, _ := webhook.NewStripe("whsec_test_secret")
	rcv, err := webhook.NewReceiver("stripe", scheme, idem.New(store), webhook.PublishTx[*sql.Tx](events))
	if err != nil {
		panic(err)
	}
	body := []byte(`{"id":"evt_1","type":"charge.succeeded"}`)
	for range 2 { // Stripe retries: the same event, signed again
		r := httptest.NewRequest(http.MethodPost, "/hooks/stripe", bytes.NewReader(body))
		r.Header.Set("Stripe-Signature", scheme.Sign(time.Now(), body))
		w := httptest.NewRecorder()
		rcv.ServeHTTP(w, r)
		fmt.Printf("%d replayed=%q\n", w.Code, w.Header().Get("Idempotent-Replayed"))
	}
	ds, _ := events.Receive(ctx, 10)
	fmt.Println("queued:", len(ds), ds[0].Message().Attributes[webhook.AttrEventID], ds[0].Message().DedupID)
	_ = ds[0].Ack(ctx)
	// Output:
	// 200 replayed=""
	// 200 replayed="true"
	// queued: 1 evt_1 accept:stripe:evt_1
}

// A consumer of captured events keys each message with EventKey: the event
// the Receiver captured, under a step of its own, so that the handler runs
// once per event even when the queue holds the event twice (here, a copy
// published again as after a crash between the publish and the capture's
// completion) and even on the Receiver's own ledger. A message no Receiver
// captured is dead-lettered without running the handler.
func ExampleEventKey() {
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	q := memqueue.New()
	l := idem.New(memstore.New(), idem.WithLogger(quiet))
	scheme, _ := webhook.NewStandard("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	rcv, err := webhook.NewReceiver("billing", scheme, l, webhook.Publish(q), webhook.WithLogger(quiet))
	if err != nil {
		panic(err)
	}
	body := `{"type":"invoice.paid","invoice":"in_1"}`
	for range 2 { // the sender retries: captured once
		now := time.Now()
		r := httptest.NewRequest(http.MethodPost, "/hooks/billing", strings.NewReader(body))
		r.Header.Set("Webhook-Id", "msg_1")
		r.Header.Set("Webhook-Timestamp", fmt.Sprint(now.Unix()))
		r.Header.Set("Webhook-Signature", scheme.Sign("msg_1", now, []byte(body)))
		rcv.ServeHTTP(httptest.NewRecorder(), r)
	}
	ds, _ := q.Receive(ctx, 1)
	captured := ds[0].Message()
	q.Publish(ctx, queue.Outgoing{Body: captured.Body, Attributes: captured.Attributes}) // the same event again
	q.Publish(ctx, queue.Outgoing{Body: []byte(body)})                                   // not captured by a Receiver

	key, _ := webhook.EventKey(captured)
	fmt.Println("consumer key:", key)
	handle := func(ctx context.Context, m queue.Message) ([]byte, error) {
		fmt.Println("handled", m.Attributes[webhook.AttrEventID], string(m.Body))
		return nil, nil
	}
	c, err := queue.NewConsumer(q, l, webhook.EventKey, handle, queue.WithLogger(quiet))
	if err != nil {
		panic(err)
	}
	c.HandleBatch(ctx, ds)
	ds, _ = q.Receive(ctx, 10)
	c.HandleBatch(ctx, ds)
	ready, held := q.Len()
	fmt.Println("left:", ready+held, "dead-lettered:", len(q.DeadLetters()))
	// Output:
	// consumer key: event:billing:msg_1
	// handled msg_1 {"type":"invoice.paid","invoice":"in_1"}
	// left: 0 dead-lettered: 1
}
