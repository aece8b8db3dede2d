package pgstore_test

import (
	"context"
	"database/sql"
	"log"
	"os"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store/pgstore"
	"github.com/jackc/pgx/v5"
)

// The examples need a database and are compiled, not run.

func Example() {
	ctx := context.Background()
	s, err := pgstore.Open(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	l := idem.New(s, idem.WithLease(30*time.Second), idem.WithRetention(7*24*time.Hour))
	res, err := l.Do(ctx, idem.Key("receipt", 8891, 7), func(ctx context.Context) ([]byte, error) {
		return []byte("msg-id-42"), nil // send the receipt
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("receipt %s (replayed: %v)", res.Value, res.Replayed)
}

// DoTx with pgx: the credit and the record of it commit together.
func ExampleStore_InTx() {
	ctx := context.Background()
	s, err := pgstore.Open(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	l := idem.New(s)

	_, err = idem.DoTx(ctx, l, idem.Key("credit", "evt_1"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + 100 WHERE id = $1", 7)
		return nil, err
	})
	if err != nil {
		log.Fatal(err)
	}
}

// DoTx with database/sql, through the SQLStore adapter.
func ExampleSQL() {
	ctx := context.Background()
	s, err := pgstore.Open(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	store := pgstore.SQL(s)
	defer store.Close()
	l := idem.New(store)

	_, err = idem.DoTx(ctx, l, idem.Key("credit", "evt_1"), func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		_, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance + 100 WHERE id = $1", 7)
		return nil, err
	})
	if err != nil {
		log.Fatal(err)
	}
}

// A sweeper: run it from one or more processes; they share the work.
func ExampleStore_Sweep() {
	ctx := context.Background()
	s, err := pgstore.Open(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	for range time.Tick(time.Minute) {
		for {
			n, err := s.Sweep(ctx, 5000)
			if err != nil {
				log.Print(err)
				break
			}
			if n == 0 {
				break
			}
		}
	}
}
