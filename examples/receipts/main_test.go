package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/sqlitestore"
)

// setup opens a ledger and a receipts queue in one SQLite file of t's own.
func setup(t *testing.T) (*sqlitestore.Store, *sqlqueue.SQLiteQueue) {
	t.Helper()
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	queues, err := sqlqueue.NewSQLite(ctx, st.DB(), sqlqueue.WithGroupCommit(st))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { queues.Close() })
	q, err := queues.Queue("receipts", sqlqueue.WithVisibility(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	return st, q
}

func publishJob(t *testing.T, q *sqlqueue.SQLiteQueue, order int) {
	t.Helper()
	body, _ := json.Marshal(Job{OrderID: order, UserID: 7, To: "user7@example.com"})
	p, err := q.Publish(context.Background(), queue.Outgoing{Body: body})
	if err != nil {
		t.Fatal(err)
	}
	if p.Duplicate {
		// Every copy must reach the handler: the ledger, not the queue, is
		// what these tests check.
		t.Fatalf("the queue dropped a copy of order %d's job on publish", order)
	}
}

// drain runs the workers until the queue is empty.
func drain(t *testing.T, q *sqlqueue.SQLiteQueue, workers ...*queue.Consumer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, c := range workers {
		wg.Go(func() { _ = c.Run(ctx) })
	}
	defer func() { cancel(); wg.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := q.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.Ready+st.InFlight+st.Delayed == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue not drained: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func worker(t *testing.T, st store.Store, q queue.Source, mail Mailer, ledgerOpts ...idem.Option) *queue.Consumer {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	l := idem.New(st, append([]idem.Option{idem.WithLogger(quiet)}, ledgerOpts...)...)
	c, err := Worker(q, l, mail, queue.WithLogger(quiet), queue.WithBackoff(10*time.Millisecond, 50*time.Millisecond), queue.WithBusyDelay(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Verify it: call your handler twice with the same payload. One
// email should arrive.
func TestSamePayloadTwiceOneEmail(t *testing.T) {
	st, q := setup(t)
	publishJob(t, q, 42)
	publishJob(t, q, 42)
	mail := NewOutbox()
	var lg lines
	c, err := Worker(q, idem.New(st, idem.WithLogger(slog.New(slog.DiscardHandler))), mail, queue.WithLogger(slog.New(&lg)), queue.WithBusyDelay(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	drain(t, q, c)
	if sent := mail.Sent(); len(sent) != 1 || sent[0].Key != "receipt:42:7" {
		t.Fatalf("sent %+v, want one email for receipt:42:7", sent)
	}
	// Both copies reached the consumer: one sent, the other skipped as
	// done (after meeting the first while it ran, if the two overlapped).
	if n, d := lg.count("queue message executed"), lg.count("queue message replayed"); n != 1 || d != 1 {
		t.Fatalf("%d executed, %d replayed; want 1 and 1; log: %v", n, d, lg.all())
	}
}

// Verify it: throw after the send on purpose. The message redelivers and no
// second email goes out, under either policy: the provider is asked first.
func TestThrowAfterSendNoSecondEmail(t *testing.T) {
	for _, p := range []idem.Policy{idem.AtLeastOnce, idem.AtMostOnce} {
		t.Run(p.String(), func(t *testing.T) {
			st, q := setup(t)
			publishJob(t, q, 42)
			mail := NewOutbox()
			mail.FailAfterSend = 1
			drain(t, q, worker(t, st, q, mail, idem.WithPolicy(p), idem.WithLease(200*time.Millisecond)))
			if sent := mail.Sent(); len(sent) != 1 {
				t.Fatalf("sent %d emails, want 1: the redelivery must find the first send", len(sent))
			}
			rec, err := st.Get(context.Background(), "receipt:42:7")
			if err != nil || rec.Status != idem.StatusCompleted || string(rec.Result) != "msg-0001" {
				t.Fatalf("record %+v, %v; want completed with the first send's id", rec.Status, err)
			}
			if last := rec.Journal[len(rec.Journal)-1]; last.Outcome != store.OutcomeResolvedDone {
				t.Fatalf("the journal's last entry is %q, want %q (reconciled, not sent again)", last.Outcome, store.OutcomeResolvedDone)
			}
		})
	}
}

// Verify it: run two consumers against the same message at once. Exactly
// one should win.
func TestTwoConsumersOneEmail(t *testing.T) {
	st, q := setup(t)
	for range 4 {
		publishJob(t, q, 42) // four copies, two consumers taking them at once
	}
	mail := NewOutbox()
	drain(t, q, worker(t, st, q, mail, idem.WithOwner("a")), worker(t, st, q, mail, idem.WithOwner("b")))
	if sent := mail.Sent(); len(sent) != 1 {
		t.Fatalf("sent %d emails, want 1", len(sent))
	}
}

// A job that is not JSON is dead-lettered at once, not retried.
func TestUndecodableJobDeadLettered(t *testing.T) {
	st, q := setup(t)
	if _, err := q.Publish(context.Background(), queue.Outgoing{Body: []byte("{not json")}); err != nil {
		t.Fatal(err)
	}
	mail := NewOutbox()
	drain(t, q, worker(t, st, q, mail))
	stats, err := q.Stats(context.Background())
	if err != nil || stats.DeadLettered != 1 || len(mail.Sent()) != 0 {
		t.Fatalf("stats %+v (%v), sent %d; want one dead letter and no email", stats, err, len(mail.Sent()))
	}
}

func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out, filepath.Join(t.TempDir(), "idem.db"), 6); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "6 orders, 6 emails sent") {
		t.Fatalf("output:\n%s", out.String())
	}
}

// lines is a slog.Handler that keeps each record's message.
type lines struct {
	mu  sync.Mutex
	msg []string
}

func (l *lines) Enabled(context.Context, slog.Level) bool { return true }
func (l *lines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msg = append(l.msg, r.Message)
	return nil
}
func (l *lines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *lines) WithGroup(string) slog.Handler      { return l }
func (l *lines) count(msg string) int {
	n := 0
	for _, m := range l.all() {
		if m == msg {
			n++
		}
	}
	return n
}
func (l *lines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.msg...)
}

// A worker stopped by SIGTERM (its context cancelled) stops cleanly: run
// returns nil, says it stopped, and what it had not sent stays queued.
func TestStoppedCleanly(t *testing.T) {
	db := filepath.Join(t.TempDir(), "idem.db")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, &out, db, 5000); err != nil {
		t.Fatalf("run stopped by its context: %v, want nil (exit 0)", err)
	}
	if !strings.Contains(out.String(), "stopped") {
		t.Fatalf("output %q does not say the worker stopped", out.String())
	}
}
