// Command webhooks is a payment-notification receiver ("Idempotency: the
// property everyone claims") built on idem: it verifies
// each delivery's signature (Standard Webhooks), captures the event into the
// embedded queue in the same SQLite transaction as the ledger's claim, and
// answers 200 only after that commit. A queue.Consumer then marks the order
// paid, in the same database and again in one transaction with the ledger,
// so a notification delivered twice marks it once, and a failure is
// retried, never swallowed: "claim-then-fail" cannot drop the work.
//
//	go run ./examples/webhooks -addr 127.0.0.1:8080
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/sqlitestore"
	"github.com/idemkit/idem/webhook"
)

// Payment is the body of a "payment.succeeded" notification.
type Payment struct {
	Type    string `json:"type"`
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
}

// App is the receiver and the worker on one SQLite file.
type App struct {
	Store    *sqlitestore.Store
	Queues   *sqlqueue.SQLite
	Events   *sqlqueue.SQLiteQueue
	Receiver *webhook.Receiver
	Worker   *queue.Consumer
	ledger   *idem.Ledger
}

// Open opens the app on the SQLite file path, verifying deliveries with the
// Standard Webhooks secret.
func Open(ctx context.Context, path, secret string, log *slog.Logger) (*App, error) {
	store, err := sqlitestore.Open(ctx, path)
	if err != nil {
		return nil, err
	}
	a := &App{Store: store}
	if err := a.open(ctx, secret, log); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

func (a *App) open(ctx context.Context, secret string, log *slog.Logger) error {
	var err error
	if _, err = a.Store.DB().ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (
		id TEXT PRIMARY KEY, paid_cents INTEGER NOT NULL DEFAULT 0, payments INTEGER NOT NULL DEFAULT 0)`); err != nil {
		return err
	}
	if a.Queues, err = sqlqueue.NewSQLite(ctx, a.Store.DB(), sqlqueue.WithGroupCommit(a.Store)); err != nil {
		return err
	}
	// The visibility is 6× the worker's handler timeout (the default 30 s),
	// as the Consumer asks.
	if a.Events, err = a.Queues.Queue("payment-events", sqlqueue.WithVisibility(3*time.Minute)); err != nil {
		return err
	}
	scheme, err := webhook.NewStandard(secret)
	if err != nil {
		return err
	}
	l := idem.New(a.Store, idem.WithLogger(log), idem.WithRetention(7*24*time.Hour)) // senders retry for days
	a.ledger = l
	if a.Receiver, err = webhook.NewReceiver("payments", scheme, l, webhook.PublishTx[*sql.Tx](a.Events), webhook.WithLogger(log)); err != nil {
		return err
	}
	// The worker's key is the event the receiver captured (its source and
	// the event id the sender signed), event:payments:<event id>.
	a.Worker, err = queue.NewConsumer(a.Events, l, webhook.EventKey, a.fulfil, queue.WithLogger(log))
	return err
}

// fulfil marks the order paid, exactly once per event: the UPDATE and the
// ledger's record of the event commit in one transaction (idem.DoTx).
func (a *App) fulfil(ctx context.Context, m queue.Message) ([]byte, error) {
	var p Payment
	if err := json.Unmarshal(m.Body, &p); err != nil || p.OrderID == "" {
		return nil, queue.Undecodable(fmt.Errorf("payment %q: %v", m.Body, err))
	}
	if p.Type != "payment.succeeded" {
		return []byte("ignored"), nil
	}
	// The order's row and this key's record commit together: a redelivery
	// after a crash between this commit and the consumer's own record
	// replays instead of paying twice.
	res, err := idem.DoTx(ctx, a.ledger, idem.Key("order-paid", m.Attributes[webhook.AttrEventID]), func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		_, err := tx.ExecContext(ctx, `INSERT INTO orders (id, paid_cents, payments) VALUES (?, ?, 1)
			ON CONFLICT (id) DO UPDATE SET paid_cents = paid_cents + excluded.paid_cents, payments = payments + 1`, p.OrderID, p.Amount)
		return []byte("paid " + p.OrderID), err
	})
	return res.Value, err
}

// Paid returns the amount paid on an order and how many payments made it.
func (a *App) Paid(ctx context.Context, order string) (cents, payments int64, err error) {
	err = a.Store.DB().QueryRowContext(ctx, `SELECT paid_cents, payments FROM orders WHERE id = ?`, order).Scan(&cents, &payments)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, 0, nil
	}
	return cents, payments, err
}

// Close closes the queue and the store.
func (a *App) Close() {
	if a.Queues != nil {
		a.Queues.Close()
	}
	a.Store.Close()
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	db := flag.String("db", filepath.Join(os.TempDir(), "webhooks-example.db"), "the SQLite file")
	flag.Parse()
	secret := os.Getenv("WEBHOOK_SECRET")
	if secret == "" {
		secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" // the Standard Webhooks example secret
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	a, err := Open(ctx, *db, secret, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "webhooks:", err)
		os.Exit(1)
	}
	defer a.Close()
	go func() { _ = a.Worker.Run(ctx) }()
	mux := http.NewServeMux()
	mux.Handle("POST /hooks/payments", a.Receiver)
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second}
	go func() { <-ctx.Done(); _ = srv.Shutdown(context.Background()) }()
	log.Info("listening", "addr", *addr, "db", *db)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "webhooks:", err)
		os.Exit(1)
	}
}
