package sqlqueue_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/internal/testproc"
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
	runUntilSettled(t, c, q.Stats, 30*time.Second, func() string { return "" })
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

// The environment of TestPostgresFusedKilledMidHandler's child.
const (
	envFusedSchema = "SQLQUEUE_TEST_FUSED_SCHEMA" // the schema of the queue and the ledger table "ledger"
)

// TestPostgresFusedKilledMidHandler is TestConsumerKilledMidHandler on
// the fused path: a consumer whose claim was made by its receive is
// killed (SIGKILL) after its handler's effect and before anything was
// recorded; a restarted worker, fused too, meets the lapsed attempt in its
// own receive's claim and does what the policy says: a takeover (or a
// reconciled record) under AtLeastOnce, an indeterminate key and a dead
// letter under AtMostOnce, never a second effect.
func TestPostgresFusedKilledMidHandler(t *testing.T) {
	if os.Getenv(envFusedSchema) != "" {
		fusedCrashChild(t)
		return
	}
	pool := pgPool(t)
	for _, tc := range fusedCrashCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			schema := pgSchema(t, pool)
			e := openFusedPG(t, pool, schema, "ledger")
			q := pgQueue(t, e.p, "receipts", sqlqueue.WithVisibility(crashVisibility))
			publish(t, q, queue.Outgoing{Body: []byte("order-42")})
			effects := filepath.Join(t.TempDir(), "effects")

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			seen := testproc.KillAtLine(ctx, t, "TestPostgresFusedKilledMidHandler",
				[]string{envFusedSchema + "=" + schema, envCrashEffects + "=" + effects, envCrashPolicy + "=" + tc.policy.String()}, "EFFECT DONE")
			if n := countEffects(t, effects); n != 1 {
				t.Fatalf("after the child: %d effects, want 1; child said:\n%s", n, strings.Join(seen, "\n"))
			}

			src := &claimCounter{PostgresQueue: q}
			checkFusedRestart(ctx, t, tc, e.st, src, q.Stats, &src.claimed, effects)
		})
	}
}

// fusedCrashCase is one policy of a fused crash test and the effects it
// allows in all: the child's, and the restarted worker's if any.
type fusedCrashCase struct {
	name      string
	policy    idem.Policy
	reconcile bool
	effects   int
}

var fusedCrashCases = []fusedCrashCase{
	{"at_least_once", idem.AtLeastOnce, false, 2},
	{"at_least_once_reconciled", idem.AtLeastOnce, true, 1},
	{"at_most_once", idem.AtMostOnce, false, 1},
}

// checkFusedRestart runs a restarted fused worker on src (claimed counts
// its fused receives) until the crashed child's message is settled, and
// checks what tc's policy promises: a takeover (or a reconciled record)
// under AtLeastOnce, an indeterminate key and a dead letter under
// AtMostOnce, and tc.effects effects in all.
func checkFusedRestart(ctx context.Context, t *testing.T, tc fusedCrashCase, st store.Store, src queue.Source,
	stats func(context.Context) (sqlqueue.Stats, error), claimed *atomic.Int64, effects string) {
	t.Helper()
	var lg testlog.Buffer
	log := slog.New(slog.NewTextHandler(&lg, nil))
	var opts []idem.CallOption
	if tc.reconcile {
		opts = append(opts, idem.WithReconcile(func(context.Context, idem.Lapsed) ([]byte, bool, error) {
			return []byte("found"), countEffects(t, effects) > 0, nil
		}))
	}
	l := idem.New(st, idem.WithPolicy(tc.policy), idem.WithLease(crashLease), idem.WithOwner("restarted"), idem.WithLogger(log))
	c, err := queue.NewConsumer(src, l, queue.MessageIDKey("receipts"), effectHandler(effects, nil),
		queue.WithHandlerTimeout(crashVisibility), queue.WithMaxReceives(3), queue.WithLogger(log),
		queue.WithBackoff(100*time.Millisecond, 200*time.Millisecond),
		queue.WithCallOptions(func(queue.Message) []idem.CallOption { return opts }))
	if err != nil {
		t.Fatal(err)
	}
	deadline, _ := ctx.Deadline()
	runUntilSettled(t, c, stats, time.Until(deadline), func() string { return "the message was never settled after the crash; log:\n" + lg.String() })
	if claimed.Load() == 0 {
		t.Fatal("the restarted worker did not take the fused path")
	}
	if n := countEffects(t, effects); n != tc.effects {
		t.Fatalf("%s: %d effects after the restart, want %d; log:\n%s", tc.name, n, tc.effects, lg.String())
	}
	s, _ := stats(context.Background())
	stuck, err := st.List(context.Background(), store.ListQuery{Stuck: true})
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case tc.policy == idem.AtMostOnce:
		if len(stuck) != 1 || s.DeadLettered != 1 {
			t.Fatalf("at_most_once: %d stuck keys and %d dead letters, want 1 and 1; log:\n%s", len(stuck), s.DeadLettered, lg.String())
		}
	case tc.reconcile:
		if !strings.Contains(lg.String(), "outcome=reconciled") || len(stuck) != 0 {
			t.Fatalf("reconciled: the log does not say so (or %d keys stuck):\n%s", len(stuck), lg.String())
		}
	default:
		if !strings.Contains(lg.String(), "outcome=takeover") || len(stuck) != 0 {
			t.Fatalf("at_least_once: no takeover logged (or %d keys stuck):\n%s", len(stuck), lg.String())
		}
	}
}

// runUntilSettled runs c until stats shows no message ready, in flight or
// delayed, then stops it; it fails the test if that takes longer than
// timeout (why adds to the failure: the consumer's log, say).
func runUntilSettled(t *testing.T, c *queue.Consumer, stats func(context.Context) (sqlqueue.Stats, error), timeout time.Duration, why func() string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(timeout)
	for {
		st, err := stats(context.Background())
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		if st.Ready+st.InFlight+st.Delayed == 0 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("messages left: %+v\n%s", st, why())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// fusedCrashChild consumes the queue on the fused path with a handler
// that does the effect, says so on stdout, and waits to be killed.
func fusedCrashChild(t *testing.T) {
	pool := pgPool(t)
	e := openFusedPG(t, pool, os.Getenv(envFusedSchema), "ledger")
	q := pgQueue(t, e.p, "receipts", sqlqueue.WithVisibility(crashVisibility))
	policy := idem.AtLeastOnce
	if os.Getenv(envCrashPolicy) == idem.AtMostOnce.String() {
		policy = idem.AtMostOnce
	}
	l := idem.New(e.st, idem.WithPolicy(policy), idem.WithLease(crashLease), idem.WithOwner("doomed"), idem.WithLogger(discard))
	c, err := queue.NewConsumer(q, l, queue.MessageIDKey("receipts"), effectHandler(os.Getenv(envCrashEffects), func() {
		fmt.Println("EFFECT DONE")
		select {} // killed here, between the effect and its record
	}), queue.WithHandlerTimeout(crashVisibility), queue.WithLogger(discard))
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Run(context.Background())
}
