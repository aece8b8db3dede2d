package sqlqueue_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/queue"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgCheckHeld fails t if a message of a FIFO group in schema breaks the
// held invariant (see heldViolations).
func pgCheckHeld(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	rows, err := pool.Query(context.Background(), heldViolations(pgx.Identifier{schema, "idem_queue_messages"}.Sanitize()))
	if err != nil {
		t.Fatal(err)
	}
	bad, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) > 0 {
		t.Fatalf("messages %v break the held invariant", bad)
	}
}

// TestPostgresHeadWalk: see headWalk.
func TestPostgresHeadWalk(t *testing.T) {
	pool := pgPool(t)
	schema := pgSchema(t, pool)
	q := pgQueue(t, openPostgres(t, pool, schema), "fifo")
	headWalk(t, q, func(t *testing.T) {
		t.Helper()
		pgCheckHeld(t, pool, schema)
	})
}

// TestPostgresHeldConcurrent: publishes into a few groups from many
// goroutines (some in transactions left open a while), with receivers
// acking as they go. Every message comes out exactly once, a group never
// has two messages in flight, and at the end no message is held with no
// lower id in its group (held forever).
func TestPostgresHeldConcurrent(t *testing.T) {
	pool := pgPool(t)
	schema := pgSchema(t, pool)
	q := pgQueue(t, openPostgres(t, pool, schema), "fifo")
	const (
		publishers = 8
		each       = 60
		groups     = 3
		total      = publishers * each
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var (
		mu       sync.Mutex
		inFlight = map[string]string{} // group → body in flight
		got      = map[string]int{}
		failed   error
	)
	fail := func(err error) {
		mu.Lock()
		if failed == nil {
			failed = err
		}
		mu.Unlock()
		cancel()
	}
	var pubs, recvs sync.WaitGroup
	for p := range publishers {
		pubs.Go(func() {
			for i := range each {
				m := queue.Outgoing{Body: fmt.Appendf(nil, "p%d-%d", p, i), GroupID: fmt.Sprint("g", (p+i)%groups)}
				if i%3 == 0 {
					tx, err := pool.Begin(ctx)
					if err != nil {
						fail(err)
						return
					}
					if _, err := q.PublishTx(ctx, tx, m); err != nil {
						tx.Rollback(ctx)
						fail(err)
						return
					}
					time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
					if err := tx.Commit(ctx); err != nil {
						fail(err)
						return
					}
					continue
				}
				if _, err := q.Publish(ctx, m); err != nil {
					fail(err)
					return
				}
			}
		})
	}
	done := make(chan struct{})
	for range 4 {
		recvs.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				rctx, rcancel := context.WithTimeout(ctx, 200*time.Millisecond)
				ds, err := q.Receive(rctx, 5)
				rcancel()
				if err != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
					fail(err)
					return
				}
				if ctx.Err() != nil {
					return
				}
				for _, d := range ds {
					m := d.Message()
					mu.Lock()
					if other, ok := inFlight[m.GroupID]; ok {
						mu.Unlock()
						fail(fmt.Errorf("group %s: %s received while %s is in flight", m.GroupID, m.Body, other))
						return
					}
					inFlight[m.GroupID] = string(m.Body)
					got[string(m.Body)]++
					mu.Unlock()
				}
				if len(ds) > 0 {
					time.Sleep(time.Duration(rand.IntN(2)) * time.Millisecond)
				}
				for _, d := range ds {
					mu.Lock()
					delete(inFlight, d.Message().GroupID)
					mu.Unlock()
					if err := d.Ack(ctx); err != nil {
						fail(err)
						return
					}
				}
			}
		})
	}
	pubs.Wait()
	for {
		mu.Lock()
		n, err := len(got), failed
		mu.Unlock()
		if n == total || err != nil || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(done)
	recvs.Wait()
	if failed != nil {
		t.Fatal(failed)
	}
	if len(got) != total {
		t.Fatalf("received %d distinct messages of %d", len(got), total)
	}
	for b, n := range got {
		if n != 1 {
			t.Fatalf("%s received %d times", b, n)
		}
	}
	pgCheckHeld(t, pool, schema)
}

// TestPostgresHeldPublishTxRacingAck: a PublishTx into a group whose head
// is acked while the transaction is open. Under READ COMMITTED the new
// message is the head once both have committed; under REPEATABLE READ,
// whose snapshot still shows the acked head, the commit fails with a
// serialization error rather than leaving the message held for ever.
func TestPostgresHeldPublishTxRacingAck(t *testing.T) {
	pool := pgPool(t)
	schema := pgSchema(t, pool)
	q := pgQueue(t, openPostgres(t, pool, schema), "fifo")
	ctx := context.Background()
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead} {
		t.Run(string(iso), func(t *testing.T) {
			g := string(iso)
			publish(t, q, queue.Outgoing{Body: []byte("head"), GroupID: g})
			ds := receive(t, q, 10)
			if got := fmt.Sprint(bodies(ds)); got != "[head]" {
				t.Fatalf("receive = %s", got)
			}
			tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil { // take the snapshot
				t.Fatal(err)
			}
			if _, err := q.PublishTx(ctx, tx, queue.Outgoing{Body: []byte("next"), GroupID: g}); err != nil {
				t.Fatal(err)
			}
			if err := ds[0].Ack(ctx); err != nil { // does not wait for tx
				t.Fatal(err)
			}
			err = tx.Commit(ctx)
			if iso == pgx.RepeatableRead {
				var pe *pgconn.PgError
				if !errors.As(err, &pe) || pe.Code != "40001" {
					t.Fatalf("commit under %s = %v, want a serialization failure (40001)", iso, err)
				}
				receiveNone(t, q)
				pgCheckHeld(t, pool, schema)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			pgCheckHeld(t, pool, schema)
			ds = receive(t, q, 10)
			if got := fmt.Sprint(bodies(ds)); got != "[next]" {
				t.Fatalf("after the ack and the commit = %s, want next", got)
			}
			if err := ds[0].Ack(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPostgresHeldDeleteNeedsReadCommitted: a delete of a grouped message
// under REPEATABLE READ, whose snapshot could miss a message published
// behind it, fails instead of leaving that message held.
func TestPostgresHeldDeleteNeedsReadCommitted(t *testing.T) {
	pool := pgPool(t)
	schema := pgSchema(t, pool)
	q := pgQueue(t, openPostgres(t, pool, schema), "fifo")
	ctx := context.Background()
	publish(t, q, queue.Outgoing{Body: []byte("a1"), GroupID: "a"})
	publish(t, q, queue.Outgoing{Body: []byte("n1")})
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	table := pgx.Identifier{schema, "idem_queue_messages"}.Sanitize()
	if _, err := tx.Exec(ctx, `DELETE FROM `+table+` WHERE group_id IS NULL`); err != nil {
		t.Fatalf("delete of an ungrouped message under REPEATABLE READ: %v", err)
	}
	_, err = tx.Exec(ctx, `DELETE FROM `+table+` WHERE group_id = 'a'`)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "55000" {
		t.Fatalf("delete of a grouped message under REPEATABLE READ = %v, want object_not_in_prerequisite_state (55000)", err)
	}
}

// TestPostgresHeldInterleavings pins the advisory lock of the triggers
// with both interleavings of a head's delete and a publish behind it,
// each paused after its trigger has looked: the other waits for its
// commit and then sees its row, so the new message is not held for ever.
func TestPostgresHeldInterleavings(t *testing.T) {
	pool := pgPool(t)
	schema := pgSchema(t, pool)
	q := pgQueue(t, openPostgres(t, pool, schema), "fifo")
	table := pgx.Identifier{schema, "idem_queue_messages"}.Sanitize()
	ctx := context.Background()
	// waits runs f in a goroutine and checks that it is still waiting
	// after a while; the returned func waits for its end.
	waits := func(t *testing.T, what string, f func() error) func() {
		t.Helper()
		errc := make(chan error, 1)
		go func() { errc <- f() }()
		select {
		case err := <-errc:
			t.Fatalf("%s did not wait for the other transaction: %v", what, err)
		case <-time.After(200 * time.Millisecond):
		}
		return func() {
			t.Helper()
			if err := <-errc; err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
	}
	check := func(t *testing.T, g string) {
		t.Helper()
		pgCheckHeld(t, pool, schema)
		ds := receive(t, q, 10)
		if got := fmt.Sprint(bodies(ds)); got != "[next]" {
			t.Fatalf("group %s: receive = %s, want next", g, got)
		}
		if err := ds[0].Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	head := func(t *testing.T, g string) queue.Delivery {
		t.Helper()
		publish(t, q, queue.Outgoing{Body: []byte("head"), GroupID: g})
		ds := receive(t, q, 10)
		if len(ds) != 1 {
			t.Fatalf("receive = %s", bodies(ds))
		}
		return ds[0]
	}

	t.Run("delete_then_publish", func(t *testing.T) {
		head(t, "a")
		del, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer del.Rollback(ctx)
		// The ack's delete, its trigger run, not committed yet.
		if _, err := del.Exec(ctx, `DELETE FROM `+table+` WHERE group_id = 'a'`); err != nil {
			t.Fatal(err)
		}
		pub, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Rollback(ctx)
		if _, err := q.PublishTx(ctx, pub, queue.Outgoing{Body: []byte("next"), GroupID: "a"}); err != nil {
			t.Fatal(err)
		}
		wait := waits(t, "the publish's commit", func() error { return pub.Commit(ctx) })
		if err := del.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		wait()
		check(t, "a")
	})

	t.Run("publish_then_delete", func(t *testing.T) {
		d := head(t, "b")
		pub, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Rollback(ctx)
		if _, err := q.PublishTx(ctx, pub, queue.Outgoing{Body: []byte("next"), GroupID: "b"}); err != nil {
			t.Fatal(err)
		}
		// The publish's trigger run (it holds next behind head), not
		// committed yet.
		if _, err := pub.Exec(ctx, `SET CONSTRAINTS ALL IMMEDIATE`); err != nil {
			t.Fatal(err)
		}
		wait := waits(t, "the head's ack", func() error { return d.Ack(ctx) })
		if err := pub.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		wait()
		check(t, "b")
	})
}

// TestPostgresHeldCrossingBatches: batches publishing into the same groups
// in opposite orders, at once. Each takes the groups' locks in the same
// order before its commit, so none deadlocks (without that PostgreSQL
// aborted one with 40P01 in every run), and the held invariant holds
// after.
func TestPostgresHeldCrossingBatches(t *testing.T) {
	pool := pgPool(t)
	schema := pgSchema(t, pool)
	q := pgQueue(t, openPostgres(t, pool, schema), "fifo")
	ctx := context.Background()
	groups := []string{"g0", "g1", "g2", "g3", "g4", "g5"}
	const rounds = 40
	var wg sync.WaitGroup
	errs := make(chan error, 4*rounds)
	for w := range 4 {
		wg.Go(func() {
			for r := range rounds {
				order := slices.Clone(groups)
				if w%2 == 1 {
					slices.Reverse(order)
				}
				var batch []queue.Outgoing
				for _, g := range order {
					batch = append(batch, queue.Outgoing{Body: fmt.Appendf(nil, "%d-%d-%s", w, r, g), GroupID: g})
				}
				if _, err := q.PublishBatch(ctx, batch); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "40P01" {
			t.Fatalf("crossing batches deadlocked: %v", err)
		}
		t.Fatalf("PublishBatch: %v", err)
	}
	pgCheckHeld(t, pool, schema)
}
