package pgstore

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
	"github.com/jackc/pgx/v5"
)

// txFlavor runs idem.DoTx with one of the two transaction types the store
// offers, incrementing the counter row of table in fn.
type txFlavor struct {
	name string
	// store wraps s as the ledger's store.
	store func(t *testing.T, s *Store) store.Store
	// do runs DoTx on key; fn's body increments the counter, then calls
	// after (if set) and returns its error.
	do func(ctx context.Context, l *idem.Ledger, key idem.OperationKey, table string, after func() error) (idem.Result, error)
}

var txFlavors = []txFlavor{
	{
		name:  "pgx",
		store: func(_ *testing.T, s *Store) store.Store { return s },
		do: func(ctx context.Context, l *idem.Ledger, key idem.OperationKey, table string, after func() error) (idem.Result, error) {
			return idem.DoTx(ctx, l, key, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				if _, err := tx.Exec(ctx, "UPDATE "+table+" SET n = n + 1 WHERE id = 1"); err != nil {
					return nil, err
				}
				if after != nil {
					if err := after(); err != nil {
						return nil, err
					}
				}
				return []byte("done"), nil
			})
		},
	},
	{
		name: "database/sql",
		store: func(t *testing.T, s *Store) store.Store {
			q := SQL(s)
			t.Cleanup(func() { q.Close() })
			return q
		},
		do: func(ctx context.Context, l *idem.Ledger, key idem.OperationKey, table string, after func() error) (idem.Result, error) {
			return idem.DoTx(ctx, l, key, func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
				if _, err := tx.ExecContext(ctx, "UPDATE "+table+" SET n = n + 1 WHERE id = 1"); err != nil {
					return nil, err
				}
				if after != nil {
					if err := after(); err != nil {
						return nil, err
					}
				}
				return []byte("done"), nil
			})
		},
	},
}

// counterTable makes a user table beside the store's, with one counter
// row at 0, and returns its name and a function reading the counter.
func counterTable(t *testing.T, s *Store) (string, func() int) {
	t.Helper()
	table := pgx.Identifier{s.names.schema, "counter"}.Sanitize()
	ctx := context.Background()
	if _, err := s.Pool().Exec(ctx, "CREATE TABLE "+table+" (id int PRIMARY KEY, n int NOT NULL); INSERT INTO "+table+" VALUES (1, 0)"); err != nil {
		t.Fatal(err)
	}
	return table, func() int {
		t.Helper()
		var n int
		if err := s.Pool().QueryRow(ctx, "SELECT n FROM "+table+" WHERE id = 1").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
}

func txLedger(s store.Store) *idem.Ledger {
	return idem.New(s, idem.WithLogger(slog.New(slog.DiscardHandler)), idem.WithOwner("tx"))
}

// TestDoTxExactlyOnce: 8 concurrent DoTx calls on one key increment the
// user's counter exactly once; the others replay the result.
func TestDoTxExactlyOnce(t *testing.T) {
	for _, fl := range txFlavors {
		t.Run(fl.name, func(t *testing.T) {
			t.Parallel()
			s := newTestStore(t, new(testClocks))
			table, counter := counterTable(t, s)
			l := txLedger(fl.store(t, s))
			key := idem.Key("credit", 42)
			const calls = 8
			var (
				wg              sync.WaitGroup
				mu              sync.Mutex
				fresh, replayed int
				start           = make(chan struct{})
			)
			for range calls {
				wg.Go(func() {
					<-start
					res, err := fl.do(context.Background(), l, key, table, nil)
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						t.Errorf("DoTx: %v", err)
						return
					}
					if string(res.Value) != "done" {
						t.Errorf("DoTx returned %q", res.Value)
					}
					if res.Replayed {
						replayed++
					} else {
						fresh++
					}
				})
			}
			close(start)
			wg.Wait()
			if fresh != 1 || replayed != calls-1 {
				t.Fatalf("%d executed, %d replayed; want 1 and %d", fresh, replayed, calls-1)
			}
			if n := counter(); n != 1 {
				t.Fatalf("counter = %d after %d concurrent DoTx calls, want 1", n, calls)
			}
			rec, err := s.Get(context.Background(), key.String())
			// One claim committed: the record's first, whose fence is its
			// creation time's.
			if err != nil || rec.Status != store.StatusCompleted || rec.Attempt != 1 || rec.Fence != store.FirstFence(rec.CreatedAt, 0) || string(rec.Result) != "done" {
				t.Fatalf("record %+v, %v; want completed by its first attempt with the result", rec, err)
			}
			if j := rec.Journal; len(j) != 1 || j[0].Outcome != store.OutcomeCompleted || j[0].Ended.IsZero() {
				t.Fatalf("journal %+v, want one completed entry", j)
			}
		})
	}
}

// TestDoTxRollback: an error from fn rolls back fn's writes and the claim
// together; a DoTx waiting for the key then runs it.
func TestDoTxRollback(t *testing.T) {
	boom := errors.New("boom")
	for _, fl := range txFlavors {
		t.Run(fl.name, func(t *testing.T) {
			t.Parallel()
			s := newTestStore(t, new(testClocks))
			table, counter := counterTable(t, s)
			l := txLedger(fl.store(t, s))
			ctx := context.Background()
			key := idem.Key("credit", 7)

			_, err := fl.do(ctx, l, key, table, func() error { return boom })
			if !errors.Is(err, boom) {
				t.Fatalf("DoTx whose fn fails: %v, want fn's error", err)
			}
			if n := counter(); n != 0 {
				t.Fatalf("counter = %d after a rolled back DoTx, want 0", n)
			}
			if _, err := s.Get(ctx, key.String()); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("Get after a rolled back DoTx: %v, want ErrNotFound (the claim rolled back too)", err)
			}

			// The first call holds the key in its transaction and fails;
			// the second waits for it, then runs.
			inside := make(chan struct{})
			fail := make(chan struct{})
			firstDone := make(chan error, 1)
			go func() {
				_, err := fl.do(ctx, l, key, table, func() error {
					close(inside)
					<-fail
					return boom
				})
				firstDone <- err
			}()
			<-inside
			secondDone := make(chan idem.Result, 1)
			go func() {
				res, err := fl.do(ctx, l, key, table, nil)
				if err != nil {
					t.Errorf("second DoTx: %v", err)
				}
				secondDone <- res
			}()
			time.Sleep(100 * time.Millisecond) // let the second wait for the row
			close(fail)
			if err := <-firstDone; !errors.Is(err, boom) {
				t.Fatalf("first DoTx: %v, want boom", err)
			}
			res := <-secondDone
			rec, err := s.Get(ctx, key.String())
			if err != nil {
				t.Fatal(err)
			}
			// The first claim rolled back: the second made the record.
			if res.Replayed || res.Fence != rec.Fence || rec.Attempt != 1 || rec.Fence != store.FirstFence(rec.CreatedAt, 0) || string(res.Value) != "done" {
				t.Fatalf("second DoTx: %+v, record %+v; want it executed as the record's first attempt", res, rec)
			}
			if n := counter(); n != 1 {
				t.Fatalf("counter = %d, want 1", n)
			}
		})
	}
}

// TestInTxNotAcquired: InTx on a key another attempt holds does not call
// fn and reports the holder.
func TestInTxNotAcquired(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, new(testClocks))
	ctx := context.Background()
	r := store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "holder", Policy: store.AtLeastOnce, Lease: time.Minute, Retention: time.Hour}
	if cr, err := s.Claim(ctx, r); err != nil || !cr.Acquired {
		t.Fatal(cr, err)
	}
	sq := SQL(s)
	t.Cleanup(func() { sq.Close() })
	for _, ts := range []func() (store.ClaimResult, []byte, error){
		func() (store.ClaimResult, []byte, error) {
			return s.InTx(ctx, r, time.Hour, func(context.Context, pgx.Tx) ([]byte, error) {
				t.Error("fn called on a held key")
				return nil, nil
			})
		},
		func() (store.ClaimResult, []byte, error) {
			return sq.InTx(ctx, r, time.Hour, func(context.Context, *sql.Tx) ([]byte, error) {
				t.Error("fn called on a held key")
				return nil, nil
			})
		},
	} {
		cr, val, err := ts()
		if err != nil || cr.Acquired || cr.Record.Owner != "holder" || val != nil {
			t.Fatalf("InTx on a held key: %+v, %q, %v; want not acquired, the holder's record", cr, val, err)
		}
	}
}
