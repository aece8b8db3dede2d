package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkit/idem/store"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store/memstore"
)

// A queue consumer sends one receipt per order, however often the message is
// delivered.
func ExampleLedger_Do() {
	ctx := context.Background()
	l := idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler)))

	sends := 0
	deliver := func(orderID, userID int) {
		res, err := l.Do(ctx, idem.Key("receipt", orderID, userID), func(ctx context.Context) ([]byte, error) {
			sends++ // send the email here; return the provider's message id
			return []byte("ses-msg-1"), nil
		})
		if err != nil {
			fmt.Println("nack:", err)
			return
		}
		fmt.Printf("ack: %s replayed=%v\n", res.Value, res.Replayed)
	}
	deliver(8891, 7)
	deliver(8891, 7) // redelivery
	fmt.Println("emails sent:", sends)
	// Output:
	// ack: ses-msg-1 replayed=false
	// ack: ses-msg-1 replayed=true
	// emails sent: 1
}

// Under AtMostOnce, a failure after the effect is not retried: the key is
// indeterminate until someone decides. NotDone says the effect did not happen.
func ExampleWithPolicy() {
	ctx := context.Background()
	l := idem.New(memstore.New(), idem.WithPolicy(idem.AtMostOnce), idem.WithLogger(slog.New(slog.DiscardHandler)))
	key := idem.Key("password-reset", "tok_42")

	_, err := l.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
		// the email went out, then recording something else failed
		return nil, errors.New("crm update failed")
	})
	fmt.Println("first:", err)
	_, err = l.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
		panic("never runs: the first attempt may have sent the email")
	})
	fmt.Println("second is indeterminate:", errors.Is(err, idem.ErrIndeterminate))

	other := idem.Key("password-reset", "tok_43")
	_, err = l.Do(ctx, other, func(ctx context.Context) ([]byte, error) {
		return nil, idem.NotDone(errors.New("smtp: connection refused"))
	})
	fmt.Println("refused:", err)
	res, _ := l.Do(ctx, other, func(ctx context.Context) ([]byte, error) { return []byte("sent"), nil })
	fmt.Println("retried:", string(res.Value), "attempt", res.Attempt)
	// Output:
	// first: crm update failed
	// second is indeterminate: true
	// refused: smtp: connection refused
	// retried: sent attempt 2
}

// A permanent failure is remembered and returned to every duplicate.
func ExamplePermanent() {
	ctx := context.Background()
	l := idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler)))
	key := idem.Key("charge", "order-9")
	for range 2 {
		_, err := l.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
			return nil, idem.Permanent(errors.New("card declined"))
		})
		var failed *idem.FailedError
		if errors.As(err, &failed) {
			fmt.Println("stored failure:", failed.Reason)
		} else {
			fmt.Println("first failure:", err)
		}
	}
	// Output:
	// first failure: card declined
	// stored failure: card declined
}

// Typed results are stored as JSON.
func ExampleRun() {
	type receipt struct {
		MessageID string    `json:"message_id"`
		SentAt    time.Time `json:"sent_at"`
	}
	ctx := context.Background()
	l := idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler)))
	send := func(ctx context.Context) (receipt, error) {
		return receipt{MessageID: "m-1", SentAt: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}, nil
	}
	r1, _, _ := idem.Run(ctx, l, idem.Key("receipt", 1, 2), send)
	r2, res, _ := idem.Run(ctx, l, idem.Key("receipt", 1, 2), send)
	fmt.Println(r1.MessageID, r2.MessageID, r2.SentAt.Equal(r1.SentAt), res.Replayed)
	// Output: m-1 m-1 true true
}

// A Reconcile hook asks the provider whether a crashed attempt's effect
// happened before running it again.
func ExampleWithReconcile() {
	ctx := context.Background()
	st := memstore.New()
	l := idem.New(st, idem.WithLease(time.Millisecond), idem.WithLogger(slog.New(slog.DiscardHandler)))
	key := idem.Key("receipt", 8891, 7)

	// A worker claimed the key, sent the email and died before recording it.
	_, _ = st.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: key.String(), Owner: "worker-1", Lease: time.Millisecond, Retention: time.Hour})
	time.Sleep(5 * time.Millisecond) // its lease lapses

	res, err := l.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
		panic("not reached: the provider already has the email")
	}, idem.WithReconcile(func(ctx context.Context, lapsed idem.Lapsed) ([]byte, bool, error) {
		// e.g. search the provider by the deterministic Message-ID <key@example.com>
		return []byte("found-msg-id"), true, nil
	}))
	fmt.Println(string(res.Value), res.Takeover, res.Reconciled, err)
	// Output: found-msg-id true true <nil>
}

// fn reads its attempt from its context: the fence makes a downstream
// idempotency key that a stale attempt cannot reuse, and an Observer
// counts what the Ledger did.
func ExampleAttemptFromContext() {
	ctx := context.Background()
	outcomes := map[string]int{}
	count := idem.ObserverFunc(func(ctx context.Context, e idem.Event) context.Context {
		if e.Kind == idem.OpEnd {
			outcomes[e.Outcome]++ // a metrics counter, in a real observer
		}
		return ctx
	})
	l := idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler)), idem.WithObserver(count))
	charge := func(ctx context.Context) ([]byte, error) {
		a, _ := idem.AttemptFromContext(ctx)
		providerKey := fmt.Sprintf("%s:%d", a.Key, a.Fence) // the provider's Idempotency-Key
		fmt.Printf("attempt %d charges under %s:<fence> (fence set: %v)\n", a.Number, a.Key, a.Fence > 0)
		return []byte(providerKey), nil
	}
	for range 2 {
		if _, err := l.Do(ctx, idem.Key("charge", "order-42"), charge); err != nil {
			fmt.Println(err)
		}
	}
	fmt.Println("executed:", outcomes["executed"], "replayed:", outcomes["replayed"])
	// Output:
	// attempt 1 charges under charge:order-42:<fence> (fence set: true)
	// executed: 1 replayed: 1
}
