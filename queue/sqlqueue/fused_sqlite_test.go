package sqlqueue_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testproc"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/queuetest"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/sqlitestore"
)

// openFusedSQLite opens a store at path (a new file when "") and the
// queues of its file with WithLedger(store), which implies
// WithGroupCommit(store).
func openFusedSQLite(t testing.TB, path string, opts ...sqlqueue.Option) *sqliteEnv {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "idem.db")
	}
	st, err := sqlitestore.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := sqlqueue.NewSQLite(context.Background(), st.DB(), append([]sqlqueue.Option{sqlqueue.WithLedger(st)}, opts...)...)
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		qs.Close()
		st.Close()
	})
	return &sqliteEnv{path: path, store: st, qs: qs}
}

// TestConformanceSQLiteFused runs the adapter suite on SQLite with the
// ledger's store given to the handle (WithLedger): the consumer checks
// take the fused path.
func TestConformanceSQLiteFused(t *testing.T) {
	t.Parallel()
	var (
		mu  sync.Mutex
		env = map[testing.TB]*sqliteEnv{} // New's handle, for Store of the same test
	)
	queuetest.Run(t, queuetest.Harness{
		New: func(t *testing.T, vis time.Duration) (queue.Source, queue.Publisher) {
			mu.Lock()
			e, ok := env[t]
			mu.Unlock()
			if !ok {
				e = openFusedSQLite(t, "", sqlqueue.WithPollInterval(100*time.Millisecond))
				mu.Lock()
				env[t] = e
				mu.Unlock()
			}
			q, err := e.qs.Queue(fmt.Sprintf("fused-%p", t), sqlqueue.WithVisibility(vis))
			if err != nil {
				t.Fatal(err)
			}
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
			return e.store
		},
		Features: features,
	})
}

// sqliteClaimCounter counts what a consumer received through each path.
type sqliteClaimCounter struct {
	*sqlqueue.SQLiteQueue
	plain, claimed atomic.Int64
}

func (c *sqliteClaimCounter) Receive(ctx context.Context, max int) ([]queue.Delivery, error) {
	ds, err := c.SQLiteQueue.Receive(ctx, max)
	c.plain.Add(int64(len(ds)))
	return ds, err
}

func (c *sqliteClaimCounter) ReceiveClaimed(ctx context.Context, max int, claim func(queue.Message) (store.ClaimRequest, bool)) ([]queue.Delivery, []*idem.Claimed, error) {
	ds, claims, err := c.SQLiteQueue.ReceiveClaimed(ctx, max, claim)
	for _, cl := range claims {
		if cl != nil {
			c.claimed.Add(1)
		}
	}
	return ds, claims, err
}

// TestSQLiteFusedPath: a consumer on the handle's ledger store claims
// every message in its receive and completes it with its ack, FIFO groups
// included; a store that is not the handle's committer is refused.
func TestSQLiteFusedPath(t *testing.T) {
	t.Parallel()
	e := openFusedSQLite(t, "")
	q := e.queue(t, "orders")
	if !q.ClaimsFor(e.store) {
		t.Fatal("ClaimsFor(the handle's ledger store) = false")
	}
	const n = 200
	for i := range n {
		publish(t, q, queue.Outgoing{Body: fmt.Appendf(nil, "order-%d", i), GroupID: []string{"", "a", "b"}[i%3]})
	}
	publish(t, q, queue.Outgoing{Body: []byte("order-7")}) // a duplicate: replayed and acked
	src := &sqliteClaimCounter{SQLiteQueue: q}
	var ran atomic.Int64
	c, err := queue.NewConsumer(src, idem.New(e.store), func(m queue.Message) (idem.OperationKey, error) { return idem.Key(string(m.Body)), nil },
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
		rec, err := e.store.Get(context.Background(), fmt.Sprint("order-", i))
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
	if plain, claimed := src.plain.Load(), src.claimed.Load(); plain != 0 || claimed < n+1 {
		t.Fatalf("received %d messages without a claim and %d with one; want 0 and at least %d", plain, claimed, n+1)
	}

	other, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "other.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := sqlqueue.NewSQLite(context.Background(), e.store.DB(), sqlqueue.WithGroupCommit(e.store), sqlqueue.WithLedger(other)); err == nil {
		t.Fatal("NewSQLite(WithGroupCommit(a store), WithLedger(another)) succeeded")
	}
	if _, err := sqlqueue.NewSQLite(context.Background(), e.store.DB(), sqlqueue.WithLedger(notAStore{})); err == nil {
		t.Fatal("NewSQLite(WithLedger(not a sqlitestore)) succeeded")
	}
}

// The environment of TestSQLiteFusedKilledMidHandler's child.
const envFusedDB = "SQLQUEUE_TEST_FUSED_DB"

// TestSQLiteFusedKilledMidHandler is TestConsumerKilledMidHandler on the
// fused path: the claim was made by the receive, the consumer killed after
// its effect; a restarted fused worker does what the policy says, never a
// second effect under AtMostOnce.
func TestSQLiteFusedKilledMidHandler(t *testing.T) {
	if os.Getenv(envFusedDB) != "" {
		fusedSQLiteCrashChild(t)
		return
	}
	for _, tc := range fusedCrashCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			path, effects := filepath.Join(dir, "idem.db"), filepath.Join(dir, "effects")
			e := openFusedSQLite(t, path)
			q := e.queue(t, "receipts", sqlqueue.WithVisibility(crashVisibility))
			publish(t, q, queue.Outgoing{Body: []byte("order-42")})

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			seen := testproc.KillAtLine(ctx, t, "TestSQLiteFusedKilledMidHandler",
				[]string{envFusedDB + "=" + path, envCrashEffects + "=" + effects, envCrashPolicy + "=" + tc.policy.String()}, "EFFECT DONE")
			if n := countEffects(t, effects); n != 1 {
				t.Fatalf("after the child: %d effects, want 1; child said:\n%s", n, strings.Join(seen, "\n"))
			}

			src := &sqliteClaimCounter{SQLiteQueue: q}
			checkFusedRestart(ctx, t, tc, e.store, src, q.Stats, &src.claimed, effects)
		})
	}
}

func fusedSQLiteCrashChild(t *testing.T) {
	e := openFusedSQLite(t, os.Getenv(envFusedDB))
	q := e.queue(t, "receipts", sqlqueue.WithVisibility(crashVisibility))
	policy := idem.AtLeastOnce
	if os.Getenv(envCrashPolicy) == idem.AtMostOnce.String() {
		policy = idem.AtMostOnce
	}
	l := idem.New(e.store, idem.WithPolicy(policy), idem.WithLease(crashLease), idem.WithOwner("doomed"), idem.WithLogger(discard))
	c, err := queue.NewConsumer(q, l, queue.MessageIDKey("receipts"), effectHandler(os.Getenv(envCrashEffects), func() {
		fmt.Println("EFFECT DONE")
		select {} // killed here, between the effect and its record
	}), queue.WithHandlerTimeout(crashVisibility), queue.WithLogger(discard))
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Run(context.Background())
}
