package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/sqlitestore"
)

// An order and its "order placed" message are written in one
// transaction of the application's SQLite database; a rolled-back order
// leaves no message. The relay moves the committed message to the broker
// (here another sqlqueue queue, in a file of its own), with the operation
// key as its dedup id; publishing it again, as a relay that died before
// its ack would, is reported as a duplicate.
func ExampleRelay() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)

	// The application's database, with the outbox in it.
	db, err := sqlitestore.Open(ctx, filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	_, _ = db.DB().ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER)`)
	queues, _ := sqlqueue.NewSQLite(ctx, db.DB(), sqlqueue.WithGroupCommit(db))
	defer queues.Close()
	ob, _ := queues.Queue("outbox")

	// The broker.
	broker, _ := sqlitestore.Open(ctx, filepath.Join(dir, "broker.db"))
	defer broker.Close()
	bq, _ := sqlqueue.NewSQLite(ctx, broker.DB(), sqlqueue.WithGroupCommit(broker))
	defer bq.Close()
	orders, _ := bq.Queue("orders")

	placeOrder := func(id string, commit bool) {
		tx, _ := db.DB().BeginTx(ctx, nil)
		defer tx.Rollback()
		_, _ = tx.ExecContext(ctx, `INSERT INTO orders(id, total) VALUES (?, ?)`, id, 100)
		if _, err := outbox.PublishTx(ctx, ob, tx, idem.Key("order-placed", id),
			queue.Outgoing{Body: []byte("order " + id + " placed")}); err != nil {
			panic(err)
		}
		if commit {
			_ = tx.Commit()
		}
	}
	placeOrder("8891", true)
	placeOrder("8892", false) // rolled back: neither the order nor its message

	relay, err := outbox.NewRelay(ob, orders, outbox.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		panic(err)
	}
	n, _ := relay.Drain(ctx)
	fmt.Println("relayed:", n)

	ds, _ := orders.Receive(ctx, 10)
	m := ds[0].Message()
	key, _ := outbox.MessageKey(m)
	fmt.Printf("at the broker: %q, dedup id %s, key %s\n", m.Body, m.DedupID, key)
	again, _ := orders.Publish(ctx, queue.Outgoing{Body: m.Body, DedupID: m.DedupID})
	fmt.Println("published again is a duplicate:", again.Duplicate)
	// Output:
	// relayed: 1
	// at the broker: "order 8891 placed", dedup id order-placed:8891, key order-placed:8891
	// published again is a duplicate: true
}
