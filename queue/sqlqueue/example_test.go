package sqlqueue_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/sqlitestore"
)

// A queue in the ledger's SQLite file: a publish with a dedup id, a
// duplicate publish, a receive and an ack.
func ExampleNewSQLite() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "sqlqueue-example")
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
	orders, _ := queues.Queue("orders")

	first, _ := orders.Publish(ctx, queue.Outgoing{Body: []byte("order 42"), DedupID: "order-42"})
	again, _ := orders.Publish(ctx, queue.Outgoing{Body: []byte("order 42"), DedupID: "order-42"})
	fmt.Println("duplicate:", again.Duplicate, again.ID == first.ID)

	ds, _ := orders.Receive(ctx, 10)
	m := ds[0].Message()
	fmt.Printf("received %q, receive count %d\n", m.Body, m.ReceiveCount)
	if err := ds[0].Ack(ctx); err != nil {
		panic(err)
	}
	st, _ := orders.Stats(ctx)
	fmt.Println("left:", st.Ready+st.InFlight+st.Delayed)
	// Output:
	// duplicate: true true
	// received "order 42", receive count 1
	// left: 0
}

// A message published in the transaction of idem.DoTx is queued if and
// only if the key's completion commits.
func ExampleSQLiteQueue_PublishTx() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "sqlqueue-example")
	defer os.RemoveAll(dir)
	store, _ := sqlitestore.Open(ctx, filepath.Join(dir, "idem.db"))
	defer store.Close()
	queues, _ := sqlqueue.NewSQLite(ctx, store.DB(), sqlqueue.WithGroupCommit(store))
	defer queues.Close()
	emails, _ := queues.Queue("emails")
	l := idem.New(store, idem.WithLogger(discard))

	for range 2 { // a redelivery runs the same key again
		_, err := idem.DoTx(ctx, l, idem.Key("signup", "u1"), func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
			// ... the signup's own writes through tx ...
			_, err := emails.PublishTx(ctx, tx, queue.Outgoing{Body: []byte("welcome u1")})
			return nil, err
		})
		if err != nil {
			panic(err)
		}
	}
	st, _ := emails.Stats(ctx)
	fmt.Println("queued:", st.Ready)
	// Output:
	// queued: 1
}
