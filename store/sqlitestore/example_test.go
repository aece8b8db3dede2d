package sqlitestore_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store/sqlitestore"
)

// A Ledger on a database file: the second Do of the key replays the first
// one's result instead of running fn again.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	store, err := sqlitestore.Open(ctx, filepath.Join(dir, "idem.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	ledger := idem.New(store, idem.WithLogger(slog.New(slog.DiscardHandler))) // no log lines in the example

	sent := 0
	for range 2 { // a redelivery
		res, err := ledger.Do(ctx, idem.Key("receipt", 8891, 7), func(ctx context.Context) ([]byte, error) {
			sent++ // send the receipt
			return []byte("msg-id-42"), nil
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s replayed=%v\n", res.Value, res.Replayed)
	}
	fmt.Println("sent", sent)
	// Output:
	// msg-id-42 replayed=false
	// msg-id-42 replayed=true
	// sent 1
}

// DoTx: the program's own write and the key's completion commit together,
// in the store's file, so the credit happens exactly once.
func ExampleStore_InTx() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	store, err := sqlitestore.Open(ctx, filepath.Join(dir, "idem.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	db := store.DB() // the program's own tables live in the same file
	if _, err := db.ExecContext(ctx, `CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)`); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO accounts VALUES (7, 0)`); err != nil {
		log.Fatal(err)
	}

	ledger := idem.New(store, idem.WithLogger(slog.New(slog.DiscardHandler))) // no log lines in the example
	// The same event, delivered twice.
	for range 2 {
		_, err := idem.DoTx(ctx, ledger, idem.Key("credit", "evt_1"), func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
			// Keep fn short and use only tx: it runs on the store's writer.
			_, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + 100 WHERE id = ?`, 7)
			return nil, err
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	var balance int
	if err := db.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = 7`).Scan(&balance); err != nil {
		log.Fatal(err)
	}
	fmt.Println("balance", balance)
	// Output: balance 100
}
