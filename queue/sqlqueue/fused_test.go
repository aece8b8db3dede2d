package sqlqueue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/queuetest"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/pgstore"
	"github.com/jackc/pgx/v5/pgxpool"
)

// fusedPG is a queue handle made WithLedger on a pgstore table of its own.
type fusedPG struct {
	st *pgstore.Store
	p  *sqlqueue.Postgres
}

func openFusedPG(t testing.TB, pool *pgxpool.Pool, schema, table string, opts ...sqlqueue.Option) fusedPG {
	t.Helper()
	st, err := pgstore.New(context.Background(), pool, pgstore.WithSchema(schema), pgstore.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	p := openPostgres(t, pool, schema, append(opts, sqlqueue.WithLedger(st))...)
	return fusedPG{st, p}
}

// TestConformancePostgresFused runs the adapter suite on PostgreSQL with
// the ledger's store given to the handle (WithLedger): the consumer checks
// take the fused path, claiming in the receive's transaction and acking in
// the completion's.
func TestConformancePostgresFused(t *testing.T) {
	t.Parallel()
	pool := pgPool(t)
	schema := pgSchema(t, pool)
	openFusedPG(t, pool, schema, "ledger_0") // the schema and tables, before the tests make theirs in parallel
	var (
		n   atomic.Int64
		mu  sync.Mutex
		env = map[testing.TB]fusedPG{} // New's handle, for Store of the same test
	)
	queuetest.Run(t, queuetest.Harness{
		New: func(t *testing.T, vis time.Duration) (queue.Source, queue.Publisher) {
			mu.Lock()
			e, ok := env[t]
			mu.Unlock()
			if !ok {
				e = openFusedPG(t, pool, schema, fmt.Sprint("ledger_", n.Add(1)), sqlqueue.WithPollInterval(100*time.Millisecond))
				mu.Lock()
				env[t] = e
				mu.Unlock()
			}
			q := pgQueue(t, e.p, fmt.Sprint("fused-", n.Add(1)), sqlqueue.WithVisibility(vis))
			return q, q
		},
		DeadLetters: deadLetters,
		Store: func(t *testing.T) store.Store {
			mu.Lock()
			e, ok := env[t]
			mu.Unlock()
			if !ok {
				t.Fatal("Store before New: the fused harness pairs them by test")
			}
			return e.st
		},
		Features: features,
	})
}

// TestPostgresFusedPath checks that a consumer on the handle's ledger
// store takes the fused path: each message is claimed by the receive
// (no claim of its own), completed and acked in one commit, and that a
// ledger on another store does not.
func TestPostgresFusedPath(t *testing.T) {
	t.Parallel()
	pool := pgPool(t)
	schema := pgSchema(t, pool)
	e := openFusedPG(t, pool, schema, "ledger")
	q := pgQueue(t, e.p, "orders")
	if !q.ClaimsFor(e.st) {
		t.Fatal("ClaimsFor(the handle's ledger store) = false")
	}
	other, err := pgstore.New(context.Background(), pool, pgstore.WithSchema(schema), pgstore.WithTable("other"))
	if err != nil {
		t.Fatal(err)
	}
	if q.ClaimsFor(other) {
		t.Fatal("ClaimsFor(another store) = true")
	}
	const n = 200
	for i := range n {
		publish(t, q, queue.Outgoing{Body: fmt.Appendf(nil, "order-%d", i)})
	}
	publish(t, q, queue.Outgoing{Body: []byte("order-7")}) // a duplicate: replayed and acked
	src := &claimCounter{PostgresQueue: q}
	var ran atomic.Int64
	c, err := queue.NewConsumer(src, idem.New(e.st), func(m queue.Message) (idem.OperationKey, error) { return idem.Key(string(m.Body)), nil },
		func(context.Context, queue.Message) ([]byte, error) {
			ran.Add(1)
			return []byte("done"), nil
		}, queue.WithConcurrency(32), queue.WithBatchSize(16))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := q.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.Ready+st.InFlight+st.Delayed == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("messages left: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
	if got := ran.Load(); got != n {
		t.Fatalf("the handler ran %d times for %d keys", got, n)
	}
	for i := range n {
		rec, err := e.st.Get(context.Background(), fmt.Sprint("order-", i))
		if err != nil {
			t.Fatal(err)
		}
		if rec.Status != store.StatusCompleted || string(rec.Result) != "done" {
			t.Fatalf("order-%d: %s %q, want completed \"done\"", i, rec.Status, rec.Result)
		}
	}
	if st, _ := q.Stats(context.Background()); st.DeadLettered != 0 {
		t.Fatalf("dead letters: %d", st.DeadLettered)
	}
	if plain, claimed := src.plain.Load(), src.claimed.Load(); plain != 0 || claimed != n+1 {
		t.Fatalf("received %d messages without a claim and %d with one; want 0 and %d", plain, claimed, n+1)
	}
}

// claimCounter counts what a consumer received through each path.
type claimCounter struct {
	*sqlqueue.PostgresQueue
	plain, claimed atomic.Int64
}

func (c *claimCounter) Receive(ctx context.Context, max int) ([]queue.Delivery, error) {
	ds, err := c.PostgresQueue.Receive(ctx, max)
	c.plain.Add(int64(len(ds)))
	return ds, err
}

func (c *claimCounter) ReceiveClaimed(ctx context.Context, max int, claim func(queue.Message) (store.ClaimRequest, bool)) ([]queue.Delivery, []*idem.Claimed, error) {
	ds, claims, err := c.PostgresQueue.ReceiveClaimed(ctx, max, claim)
	for _, cl := range claims {
		if cl != nil {
			c.claimed.Add(1)
		}
	}
	return ds, claims, err
}

// notAStore is a store.Store that is no pgstore.Store.
type notAStore struct{ store.Store }

// TestPostgresWithLedgerRefusesAnotherStore: a store that cannot join the
// queue's transactions is refused.
func TestPostgresWithLedgerRefusesAnotherStore(t *testing.T) {
	t.Parallel()
	pool := pgPool(t)
	_, err := sqlqueue.NewPostgres(context.Background(), pool, sqlqueue.WithSchema(pgSchema(t, pool)), sqlqueue.WithLedger(notAStore{}))
	if !errors.Is(err, sqlqueue.ErrLedger) {
		t.Fatalf("NewPostgres(WithLedger(not a pgstore)) = %v, want ErrLedger", err)
	}
}
