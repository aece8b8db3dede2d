// Package readme holds the README's Go snippets as code the compiler checks:
// each function below contains one snippet verbatim, between a "README
// snippet" line and an "end" line, with the declarations the README leaves
// to the reader around it. TestSnippets fails when a snippet in README.md is
// not in this file as written, so a README change must come here too, and
// an API change that breaks a snippet breaks this package's build.
package readme

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/effect"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/sqlitestore"
	"github.com/idemkit/idem/webhook"
)

// What the snippets take as given.
type Job struct{ OrderID, UserID string }

var user, password string

func receiptFor(Job) effect.Email { return effect.Email{} }

func consumer(ctx context.Context) error {
	// README snippet
	store, err := sqlitestore.Open(ctx, "idem.db") // the ledger, durable
	queues, err := sqlqueue.NewSQLite(ctx, store.DB(), sqlqueue.WithGroupCommit(store))
	receipts, err := queues.Queue("receipts", sqlqueue.WithVisibility(3*time.Minute))

	// The key names the outcome ("order N's receipt to user U"), never the
	// broker's message id: a producer's retry has a new id.
	key := func(j Job) (idem.OperationKey, error) {
		if j.OrderID == "" {
			return idem.OperationKey{}, errors.New("no order_id") // dead-lettered at once
		}
		return idem.Key("receipt", j.OrderID, j.UserID), nil
	}
	mailer := effect.NewSMTP("smtp.example.com:587", effect.WithPlainAuth(user, password))
	send := func(ctx context.Context, k idem.OperationKey, j Job) ([]byte, error) {
		// ctx is cancelled if the lease is lost. The error says whether the
		// email can have gone out (docs/effects.md): a refused connection
		// is idem.NotDone, so the key is released for a retry.
		id, err := mailer.Send(ctx, k.String(), receiptFor(j))
		return []byte(id), err
	}
	// AtMostOnce: a handler that fails after its send ("throw after the send")
	// leaves the key stuck for `idem ls --stuck` and `idem resolve`, never a
	// second email. (Under the default AtLeastOnce the retry sends again, unless
	// an idem.WithReconcile hook finds the first send: see examples/receipts.)
	ledger := idem.New(store, idem.WithPolicy(idem.AtMostOnce))
	// Each body is decoded once (a body that is not JSON is dead-lettered at
	// once); the key and the handler share the Job.
	c, err := queue.NewTypedConsumer(receipts, ledger, queue.JSON[Job], key, send,
		queue.WithHandlerTimeout(30*time.Second)) // refuses a visibility shorter than this
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	err = c.Run(ctx)
	// end
	return err
}

func do(ctx context.Context, l *idem.Ledger, job Job, msg queue.Message, send func(context.Context, Job) ([]byte, error)) (idem.Result, error) {
	// README snippet
	res, err := l.Do(ctx, idem.Key("receipt", job.OrderID, job.UserID),
		func(ctx context.Context) ([]byte, error) { return send(ctx, job) },
		idem.Fingerprint(msg.Body))
	// err: nil (res.Replayed when skipped as done), idem.ErrInProgress (retry later),
	// idem.ErrMismatch, idem.ErrIndeterminate, a StoreError, or fn's own error.
	// end
	return res, err
}

func webhooks(ctx context.Context, store *sqlitestore.Store, queues *sqlqueue.SQLite, mux *http.ServeMux, handle queue.Handler) error {
	// README snippet
	scheme, err := webhook.NewStripe(os.Getenv("STRIPE_WEBHOOK_SECRET")) // or NewStandard, GitHub, Shopify, Slack, HMAC...
	events, err := queues.Queue("stripe-events")                         // sqlqueue, in the ledger's SQLite file
	ledger := idem.New(store)
	rcv, err := webhook.NewReceiver("stripe", scheme, ledger, webhook.PublishTx[*sql.Tx](events))
	mux.Handle("POST /hooks/stripe", rcv)

	// The consumer: handle runs once per event, keyed event:stripe:<evt_...>.
	worker, err := queue.NewConsumer(events, ledger, webhook.EventKey, handle)
	go worker.Run(ctx)
	// end
	return err
}

func httpAPI(store *sqlitestore.Store, mux *http.ServeMux, tenantOf httpidem.ScopeFunc, charges http.Handler) {
	// README snippet
	m := httpidem.New(idem.New(store), httpidem.WithScope(tenantOf), httpidem.WithRequired(true))
	mux.Handle("POST /charges", m.Handler(charges))
	// end
}

func outboxSnippet(ctx context.Context, db *sql.DB, id string, total int, body []byte, broker queue.Publisher) error {
	// README snippet
	queues, err := sqlqueue.NewSQLite(ctx, db) // your database (or sqlqueue.NewPostgres)
	ob, err := queues.Queue("outbox", sqlqueue.WithVisibility(time.Minute))

	tx, err := db.BeginTx(ctx, nil)
	_, err = tx.ExecContext(ctx, `INSERT INTO orders(id, total) VALUES (?, ?)`, id, total)
	_, err = outbox.PublishTx(ctx, ob, tx, idem.Key("order-placed", id), queue.Outgoing{Body: body})
	err = tx.Commit() // the order and its message, or neither

	relay, err := outbox.NewRelay(ob, broker) // any queue.Publisher: SQS, JetStream, RabbitMQ, sqlqueue
	go relay.Run(ctx)                         // or relay.Drain(ctx) from a cron job
	// end
	return err
}

var _ = []any{consumer, do, webhooks, httpAPI, outboxSnippet}

// snippets returns the Go code blocks of md, each without its fences.
func snippets(md string) []string {
	var out []string
	for _, m := range regexp.MustCompile("(?ms)^```go\n(.*?)^```").FindAllStringSubmatch(md, -1) {
		out = append(out, m[1])
	}
	return out
}

// compiled returns the snippets in this file, each the lines between a
// "// README snippet" line and a "// end" line, one indentation less.
func compiled(src string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`(?ms)^\t// README snippet\n(.*?)^\t// end\n`).FindAllStringSubmatch(src, -1) {
		lines := strings.SplitAfter(m[1], "\n")
		for i, l := range lines {
			lines[i] = strings.TrimPrefix(l, "\t")
		}
		out = append(out, strings.Join(lines, ""))
	}
	return out
}

// TestSnippets: every Go snippet of README.md is, verbatim, one of the
// snippets this file compiles, and each of those is in the README.
func TestSnippets(t *testing.T) {
	md, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, here := snippets(string(md)), compiled(string(src))
	if len(readme) == 0 || len(here) == 0 {
		t.Fatalf("found %d snippets in README.md and %d here", len(readme), len(here))
	}
	for i, s := range readme {
		found := false
		for _, h := range here {
			found = found || h == s
		}
		if !found {
			t.Errorf("README.md's Go snippet %d is not compiled here as written (copy it into a function of readme_test.go between \"// README snippet\" and \"// end\"):\n%s", i+1, s)
		}
	}
	for i, h := range here {
		found := false
		for _, s := range readme {
			found = found || h == s
		}
		if !found {
			t.Errorf("snippet %d of readme_test.go is no longer in README.md (remove it, or put it back there):\n%s", i+1, h)
		}
	}
}
