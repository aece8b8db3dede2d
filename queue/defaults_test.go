package queue_test

import (
	"bytes"
	"context"
	"database/sql"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/effect"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/memqueue"
	"github.com/idemkit/idem/queue/queuetest"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/memstore"
	"github.com/idemkit/idem/store/sqlitestore"
	"github.com/idemkit/idem/webhook"
)

// embedded opens the embedded default, as the README's snippets do: a
// sqlitestore ledger in a new file and sqlqueue in the same file through
// its group commit; both are closed when t ends.
func embedded(t *testing.T, opts ...sqlitestore.Option) (*sqlitestore.Store, *sqlqueue.SQLite) {
	t.Helper()
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "idem.db"), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	queues, err := sqlqueue.NewSQLite(ctx, store.DB(), sqlqueue.WithGroupCommit(store))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { queues.Close() })
	return store, queues
}

// visibilityOf wraps a source with another visibility (0: unbounded, as
// amqpqueue and lambdasqs report).
type visibilityOf struct {
	queue.Source
	v time.Duration
}

func (s visibilityOf) Visibility() time.Duration { return s.v }

// Without WithHandlerTimeout, the handler timeout is a sixth of the
// source's visibility, within 1 s (or the visibility) and 30 s, and only a
// visibility under 6 s warns.
func TestDefaultHandlerTimeoutFollowsTheVisibility(t *testing.T) {
	for _, tc := range []struct {
		visibility, want time.Duration
		warns            bool
	}{
		{0, 30 * time.Second, false},
		{30 * time.Second, 5 * time.Second, false},
		{time.Minute, 10 * time.Second, false},
		{3 * time.Minute, 30 * time.Second, false},
		{time.Hour, 30 * time.Second, false},
		{6 * time.Second, time.Second, false},
		{3 * time.Second, time.Second, true},
		{500 * time.Millisecond, 500 * time.Millisecond, true},
	} {
		if got := queue.DefaultHandlerTimeoutFor(tc.visibility); got != tc.want {
			t.Errorf("visibility %v: default handler timeout %v, want %v", tc.visibility, got, tc.want)
		}
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
		src := visibilityOf{memqueue.New(), tc.visibility}
		if _, err := queue.NewConsumer(src, idem.New(memstore.New()), queue.MessageIDKey("m"), noop, queue.WithLogger(log)); err != nil {
			t.Errorf("visibility %v, default handler timeout: %v", tc.visibility, err)
		}
		if warned := strings.Contains(buf.String(), "six times"); warned != tc.warns {
			t.Errorf("visibility %v: warned %v, want %v; log: %s", tc.visibility, warned, tc.warns, buf.String())
		}
	}
}

// The derived timeout is the one the handler runs under: with memqueue's
// default visibility (30 s), a handler's context ends about 5 s on.
func TestDefaultHandlerTimeoutIsTheHandlersDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q := memqueue.New()
	if _, err := q.Publish(ctx, queue.Outgoing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	left := make(chan time.Duration, 1)
	c, err := queue.NewConsumer(q, idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler))), queue.MessageIDKey("m"),
		func(ctx context.Context, _ queue.Message) ([]byte, error) {
			dl, ok := ctx.Deadline()
			if !ok {
				left <- -1
			} else {
				left <- time.Until(dl)
			}
			return nil, nil
		}, queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	go c.Run(ctx)
	select {
	case d := <-left:
		if d < 4*time.Second || d > 5*time.Second {
			t.Fatalf("the handler's context ends in %v, want about 5 s (a sixth of memqueue's 30 s visibility)", d)
		}
	case <-ctx.Done():
		t.Fatal("the handler never ran")
	}
}

// runBriefly runs c on an empty queue for a moment and stops it, so that
// what a consumer logs when it starts is checked too.
func runBriefly(t *testing.T, c *queue.Consumer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := c.Run(ctx); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// The README's webhook snippet, with the worker its text names ("A
// queue.Consumer then does the work") left at its defaults: the queue's
// default visibility (30 s) and the consumer's default handler timeout
// agree, and nothing warns.
func TestREADMEWebhookSnippetDoesNotWarn(t *testing.T) {
	queuetest.NoWarnings(t, "README webhook snippet", func() {
		store, queues := embedded(t)
		// From here on, the README's lines.
		scheme, err := webhook.NewStripe("whsec_test")
		if err != nil {
			t.Fatal(err)
		}
		events, err := queues.Queue("stripe-events")
		if err != nil {
			t.Fatal(err)
		}
		rcv, err := webhook.NewReceiver("stripe", scheme, idem.New(store), webhook.PublishTx[*sql.Tx](events))
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.Handle("POST /hooks/stripe", rcv)
		// The worker.
		c, err := queue.NewConsumer(events, idem.New(store), queue.MessageIDKey("stripe"), noop)
		if err != nil {
			t.Fatal(err)
		}
		runBriefly(t, c)
	})
}

// The README's consumer snippet: a 3-minute visibility and a 30 s handler
// timeout, six times apart, do not warn.
func TestREADMEConsumerSnippetDoesNotWarn(t *testing.T) {
	queuetest.NoWarnings(t, "README consumer snippet", func() {
		store, queues := embedded(t)
		receipts, err := queues.Queue("receipts", sqlqueue.WithVisibility(3*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		type Job struct{ OrderID, UserID string }
		key := func(j Job) (idem.OperationKey, error) { return idem.Key("receipt", j.OrderID, j.UserID), nil }
		mailer := effect.NewSMTP("smtp.example.com:587", effect.WithPlainAuth("user", "password"))
		send := func(ctx context.Context, k idem.OperationKey, j Job) ([]byte, error) {
			id, err := mailer.Send(ctx, k.String(), effect.Email{From: "a@example.com", To: []string{"b@example.com"}, Subject: "receipt", Text: "paid"})
			return []byte(id), err
		}
		ledger := idem.New(store, idem.WithPolicy(idem.AtMostOnce))
		c, err := queue.NewTypedConsumer(receipts, ledger, queue.JSON[Job], key, send,
			queue.WithHandlerTimeout(30*time.Second)) // refuses a visibility shorter than this
		if err != nil {
			t.Fatal(err)
		}
		runBriefly(t, c)
	})
}

// Package sqlqueue's snippet: a one-minute visibility and the consumer's
// defaults (a 10 s handler timeout) do not warn.
func TestSQLQueueDocSnippetDoesNotWarn(t *testing.T) {
	queuetest.NoWarnings(t, "sqlqueue package snippet", func() {
		store, queues := embedded(t)
		orders, err := queues.Queue("orders", sqlqueue.WithVisibility(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		c, err := queue.NewConsumer(orders, idem.New(store), queue.MessageIDKey("orders"), noop)
		if err != nil {
			t.Fatal(err)
		}
		runBriefly(t, c)
	})
}

// memqueue and sqlqueue on SQLite, at their defaults (PostgreSQL, SQS,
// JetStream, RabbitMQ and Lambda: in their packages' tests).
func TestDefaultsAgreeMemqueueAndSQLite(t *testing.T) {
	queuetest.DefaultsAgree(t, memqueue.New())
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	queues, err := sqlqueue.NewSQLite(ctx, store.DB())
	if err != nil {
		t.Fatal(err)
	}
	defer queues.Close()
	q, err := queues.Queue("orders")
	if err != nil {
		t.Fatal(err)
	}
	queuetest.DefaultsAgree(t, q)
}
