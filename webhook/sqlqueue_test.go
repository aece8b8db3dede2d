package webhook

import (
	"context"
	"database/sql"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
)

// openSQLQueue opens queue/sqlqueue in the env's SQLite file, sharing the
// store's write turn.
func openSQLQueue(t *testing.T, e *env) (*sqlqueue.SQLite, *sqlqueue.SQLiteQueue) {
	t.Helper()
	qs, err := sqlqueue.NewSQLite(context.Background(), e.store.DB(), sqlqueue.WithGroupCommit(e.store), sqlqueue.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qs.Close() })
	q, err := qs.Queue("webhook-test")
	if err != nil {
		t.Fatal(err)
	}
	return qs, q
}

// drain receives every message ready in q (and acks it).
func drain(t *testing.T, q *sqlqueue.SQLiteQueue) []queue.Message {
	t.Helper()
	var out []queue.Message
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		ds, err := q.Receive(ctx, 100)
		cancel()
		if err != nil || len(ds) == 0 {
			return out
		}
		for _, d := range ds {
			out = append(out, d.Message())
			if err := d.Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// With the embedded queue, in both capture modes: retries and concurrent
// duplicates of an event make one message, which a consumer receives with
// the raw body, the verified attributes and the operation key as DedupID.
func TestReceiverSQLQueue(t *testing.T) {
	for _, mode := range []string{"plain", "tx"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			_, q := openSQLQueue(t, e)
			c := Publish(q)
			if mode == "tx" {
				c = PublishTx[*sql.Tx](q)
			}
			rc, s := newReceiver(t, e, c)
			body := `{"type": "invoice.paid",   "n": 1}`
			now := time.Now()
			first := serve(rc, swRequest(t, s, "msg_q1", body, now))
			if first.status != http.StatusOK {
				t.Fatalf("first: %d %s", first.status, first.body)
			}
			var wg sync.WaitGroup
			answers := make([]answer, 8)
			for i := range answers {
				wg.Go(func() {
					answers[i] = serve(rc, swRequest(t, s, "msg_q1", body, now.Add(time.Duration(i)*time.Second)))
				})
			}
			wg.Wait()
			for _, a := range answers {
				if a.status != 200 || a.header.Get(ReplayedHeader) != "true" || string(a.body) != string(first.body) {
					t.Fatalf("duplicate: %d %q %s, want the first answer replayed", a.status, a.header.Get(ReplayedHeader), a.body)
				}
			}
			if a := serve(rc, swRequest(t, s, "msg_q2", `{}`, now)); a.status != 200 {
				t.Fatalf("second event: %d %s", a.status, a.body)
			}
			msgs := drain(t, q)
			if len(msgs) != 2 {
				t.Fatalf("%d messages in sqlqueue, want 2", len(msgs))
			}
			m := msgs[0]
			if m.Attributes[AttrEventID] == "msg_q2" {
				m = msgs[1]
			}
			if m.Attributes[AttrEventID] != "msg_q1" || string(m.Body) != body || m.Attributes[AttrVerified] != "true" ||
				m.Attributes[AttrSource] != "acme" || m.Attributes[AttrContentType] != "application/json" {
				t.Fatalf("message %+v", m)
			}
			if m.DedupID != "accept:acme:msg_q1" {
				t.Fatalf("DedupID %q", m.DedupID)
			}
		})
	}
}

// A queue that fails for real (its handle closed) gets 500 and nothing is
// recorded as done: once the queue is back, the sender's retry captures
// the event.
func TestReceiverSQLQueueClosed(t *testing.T) {
	for _, mode := range []string{"plain", "tx"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			qs, q := openSQLQueue(t, e)
			if err := qs.Close(); err != nil {
				t.Fatal(err)
			}
			c := Publish(q)
			if mode == "tx" {
				c = PublishTx[*sql.Tx](q)
			}
			rc, s := newReceiver(t, e, c)
			if a := serve(rc, swRequest(t, s, "msg_c", `{}`, time.Now())); a.status != http.StatusInternalServerError {
				t.Fatalf("closed queue: %d %s, want 500", a.status, a.body)
			}
			_, q2 := openSQLQueue(t, e)
			c2 := Publish(q2)
			if mode == "tx" {
				c2 = PublishTx[*sql.Tx](q2)
			}
			rc2, _ := newReceiver(t, e, c2)
			a := serve(rc2, swRequest(t, s, "msg_c", `{}`, time.Now()))
			if a.status != 200 || a.header.Get(ReplayedHeader) != "" {
				t.Fatalf("retry with the queue back: %d replayed=%q %s", a.status, a.header.Get(ReplayedHeader), a.body)
			}
			if n := len(drain(t, q2)); n != 1 {
				t.Fatalf("%d messages, want 1", n)
			}
		})
	}
}
