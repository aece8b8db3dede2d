// Command receipts is a receipts worker ("Preventing duplicate sends")
// built on idem: a queue of "send order N's receipt to user U" jobs in the
// embedded SQLite queue, consumed by a queue.Consumer whose operation key
// names the outcome (order and user), never the broker's message id.
// Duplicates (a producer's retry, a redelivery) are acked without a second
// email; a handler that fails after the send is not repeated, because the
// mail provider is asked first (a Reconcile hook looking the send up by its
// idempotency key). The program's provider is in memory (Outbox);
// SMTPMailer is the same Mailer over real SMTP (effect.SMTP), finding sends
// by Message-ID in Mailpit, and the three checks (a duplicate job, a throw
// after the send, two consumers at once) run with it too when
// IDEM_TEST_SMTP and IDEM_TEST_MAILPIT_API are set.
//
//	go run ./examples/receipts             # a temporary database
//	go run ./examples/receipts -db idem.db # then: go run ./cmd/idem --store sqlite:idem.db ls
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/sqlitestore"
)

// Job is a queue message's body.
type Job struct {
	OrderID int    `json:"orderId"`
	UserID  int    `json:"userId"`
	To      string `json:"to"`
}

// Key is the job's operation key: the receipt of one order to one user.
func Key(m queue.Message) (idem.OperationKey, error) {
	var j Job
	if err := json.Unmarshal(m.Body, &j); err != nil {
		return idem.OperationKey{}, queue.Undecodable(err)
	}
	if j.OrderID == 0 || j.UserID == 0 {
		return idem.OperationKey{}, queue.Undecodable(fmt.Errorf("job %s has no order or user id", m.Body))
	}
	return idem.Key("receipt", j.OrderID, j.UserID), nil
}

// Mailer is the email provider. Send takes an idempotency key the provider
// keeps with the message, and Find looks a send up by it: the provider's
// log is the only place that knows whether a send whose answer was lost
// went out.
type Mailer interface {
	Send(ctx context.Context, to, subject, idempotencyKey string) (messageID string, err error)
	Find(ctx context.Context, idempotencyKey string) (messageID string, found bool, err error)
}

// Worker returns the consumer of the receipts queue: it sends each job's
// receipt once per key.
func Worker(src queue.Source, l *idem.Ledger, mail Mailer, opts ...queue.Option) (*queue.Consumer, error) {
	send := func(ctx context.Context, m queue.Message) ([]byte, error) {
		var j Job
		if err := json.Unmarshal(m.Body, &j); err != nil {
			return nil, queue.Undecodable(err)
		}
		key, _ := Key(m)
		id, err := mail.Send(ctx, j.To, fmt.Sprintf("Your receipt for order %d", j.OrderID), key.String())
		return []byte(id), err
	}
	// Before a key runs again after an attempt that may have sent (a crash,
	// an error after the send), ask the provider.
	reconcile := idem.WithReconcile(func(ctx context.Context, lp idem.Lapsed) ([]byte, bool, error) {
		id, found, err := mail.Find(ctx, lp.Key)
		return []byte(id), found, err
	})
	opts = append([]queue.Option{queue.WithCallOptions(func(m queue.Message) []idem.CallOption {
		return []idem.CallOption{idem.Fingerprint(m.Body), reconcile}
	})}, opts...)
	return queue.NewConsumer(src, l, Key, send, opts...)
}

func main() {
	db := flag.String("db", "", "the SQLite file for the ledger and the queue (default: a temporary one)")
	orders := flag.Int("orders", 20, "how many orders")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, *db, *orders); err != nil {
		fmt.Fprintln(os.Stderr, "receipts:", err)
		os.Exit(1)
	}
}

// run publishes the orders' jobs, each once or more (a producer that
// retries), runs two consumers until the queue is empty, and prints what
// the provider sent.
func run(ctx context.Context, w io.Writer, db string, orders int) (err error) {
	defer func() {
		if err != nil && ctx.Err() != nil {
			// SIGTERM or Ctrl-C while opening or publishing: a clean stop.
			fmt.Fprintf(w, "stopped: %v\n", err)
			err = nil
		}
	}()
	temp := db == ""
	if temp {
		dir, err := os.MkdirTemp("", "receipts")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		db = filepath.Join(dir, "idem.db")
	}
	where := db
	if temp {
		where = "the temporary database (removed: run with -db to keep it)"
	}
	store, err := sqlitestore.Open(ctx, db)
	if err != nil {
		return err
	}
	defer store.Close()
	queues, err := sqlqueue.NewSQLite(ctx, store.DB(), sqlqueue.WithGroupCommit(store))
	if err != nil {
		return err
	}
	defer queues.Close()
	receipts, err := queues.Queue("receipts", sqlqueue.WithVisibility(3*time.Minute))
	if err != nil {
		return err
	}
	for i := range orders {
		body, _ := json.Marshal(Job{OrderID: 1000 + i, UserID: 7, To: "user7@example.com"})
		for range 1 + i%3 { // the producer retried some jobs
			if _, err := receipts.Publish(ctx, queue.Outgoing{Body: body}); err != nil {
				if ctx.Err() != nil {
					fmt.Fprintf(w, "stopped while publishing; what was published stays queued in %s\n", where)
					return nil
				}
				return err
			}
		}
	}
	mail := NewOutbox()
	quiet := slog.New(slog.DiscardHandler)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 2 {
		l := idem.New(store, idem.WithOwner(fmt.Sprintf("worker-%d", i+1)), idem.WithLogger(quiet))
		c, err := Worker(receipts, l, mail, queue.WithLogger(quiet))
		if err != nil {
			return err
		}
		wg.Go(func() { _ = c.Run(runCtx) })
	}
	stopped := false // by SIGTERM or Ctrl-C: the workers hand back what they hold
wait:
	for {
		st, err := receipts.Stats(ctx)
		if err != nil && ctx.Err() == nil {
			return err
		}
		if err == nil && st.Ready+st.InFlight+st.Delayed == 0 {
			break
		}
		select {
		case <-ctx.Done():
			stopped = true
			break wait
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	wg.Wait()
	sent := mail.Sent()
	if stopped {
		fmt.Fprintf(w, "stopped before the queue was empty; the rest stays queued in %s\n", where)
	}
	fmt.Fprintf(w, "%d orders, %d emails sent (one per order):\n", orders, len(sent))
	for _, m := range sent {
		fmt.Fprintf(w, "  %s  %s\n", m.Key, m.ID)
	}
	fmt.Fprintf(w, "ledger and queue in %s\n", db)
	return nil
}

// Outbox is an in-memory mail provider: it keeps every send with its
// idempotency key, like a provider's message log.
type Outbox struct {
	mu   sync.Mutex
	sent []Sent
	// FailAfterSend makes the next n sends fail after the email went out
	// (the connection dropped before the answer).
	FailAfterSend int
}

// Sent is one email the provider accepted.
type Sent struct{ Key, ID, To string }

// NewOutbox returns an empty provider.
func NewOutbox() *Outbox { return &Outbox{} }

// ErrAnswerLost is what Send returns when FailAfterSend drops its answer.
var ErrAnswerLost = errors.New("mail provider: connection reset after the message was accepted")

func (o *Outbox) Send(ctx context.Context, to, subject, key string) (string, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	id := fmt.Sprintf("msg-%04d", len(o.sent)+1)
	o.sent = append(o.sent, Sent{Key: key, ID: id, To: to})
	if o.FailAfterSend > 0 {
		o.FailAfterSend--
		return "", ErrAnswerLost
	}
	return id, nil
}

func (o *Outbox) Find(ctx context.Context, key string) (string, bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range o.sent {
		if s.Key == key {
			return s.ID, true, nil
		}
	}
	return "", false, nil
}

// Sent returns every email sent, ordered by key.
func (o *Outbox) Sent() []Sent {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := append([]Sent(nil), o.sent...)
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}
