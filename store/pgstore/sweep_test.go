package pgstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/store"
	"github.com/jackc/pgx/v5/pgxpool"
)

// fill inserts n rows of prefix directly, with status and an expiry
// relative to the server's clock.
func fill(t testing.TB, s *Store, prefix string, n int, status store.Status, expiresIn, leaseIn time.Duration) {
	t.Helper()
	_, err := s.Pool().Exec(context.Background(), `INSERT INTO `+s.Table()+` (`+strings.Join(recordColumns, ", ")+`)
		SELECT $1 || i, $2, 'at_least_once', 1, 1, 'filler', '', 'r', '',
			now() + $4::bigint * interval '1 microsecond', now() + $3::bigint * interval '1 microsecond', now(), now(), '[]', '', ''
		FROM generate_series(1, $5::int) i`, prefix, string(status), micros(expiresIn), micros(leaseIn), n)
	if err != nil {
		t.Fatalf("filling %d rows: %v", n, err)
	}
}

func count(t testing.TB, s *Store, where string) int {
	t.Helper()
	var n int
	if err := s.Pool().QueryRow(context.Background(), "SELECT count(*) FROM "+s.Table()+" WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSweepBatches: Sweep deletes expired records (whatever their status)
// in batches of at most limit, oldest first, and nothing else.
func TestSweepBatches(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, new(testClocks))
	ctx := context.Background()
	const expired = 5000
	fill(t, s, "old-completed-", expired-200, store.StatusCompleted, -time.Hour, -time.Hour)
	fill(t, s, "old-in-progress-", 200, store.StatusInProgress, -time.Minute, -time.Hour)
	fill(t, s, "live-completed-", 300, store.StatusCompleted, time.Hour, 0)
	fill(t, s, "lapsed-not-expired-", 50, store.StatusInProgress, time.Hour, -time.Minute)
	total, calls := 0, 0
	for {
		n, err := s.Sweep(ctx, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if n > 1000 {
			t.Fatalf("Sweep(1000) deleted %d", n)
		}
		if n == 0 {
			break
		}
		total += n
		calls++
		if calls > 10 {
			t.Fatalf("Sweep keeps deleting: %d calls, %d rows", calls, total)
		}
	}
	if total != expired || calls != 5 {
		t.Fatalf("Sweep deleted %d rows in %d calls, want %d in 5", total, calls, expired)
	}
	if n := count(t, s, "true"); n != 350 {
		t.Fatalf("%d rows left, want the 350 live ones", n)
	}
	if n, err := s.Sweep(ctx, 0); n != 0 || err != nil {
		t.Fatalf("Sweep(0) = %d, %v", n, err)
	}
}

// TestSweepSkipsLocked: rows another transaction holds (a claim in
// progress, another sweeper) are skipped, not waited for.
func TestSweepSkipsLocked(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, new(testClocks))
	ctx := context.Background()
	fill(t, s, "old-", 10, store.StatusCompleted, -time.Hour, -time.Hour)
	tx, err := testPool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+s.Table()+" WHERE key IN ('old-1', 'old-2', 'old-3') FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := s.Sweep(sctx, 100)
	if err != nil || n != 7 {
		t.Fatalf("Sweep with 3 rows locked elsewhere = %d, %v; want 7 at once", n, err)
	}
	tx.Rollback(ctx)
	if n, err := s.Sweep(ctx, 100); err != nil || n != 3 {
		t.Fatalf("Sweep after the lock was released = %d, %v; want 3", n, err)
	}
}

// TestSweepConcurrent: sweepers running at once share the work: every
// expired row is deleted exactly once, and none waits for another.
func TestSweepConcurrent(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, new(testClocks))
	ctx := context.Background()
	const rows = 20000
	fill(t, s, "old-", rows, store.StatusCompleted, -time.Hour, -time.Hour)
	fill(t, s, "live-", 100, store.StatusCompleted, time.Hour, 0)
	var (
		total atomic.Int64
		wg    sync.WaitGroup
	)
	for range 4 {
		wg.Go(func() {
			for {
				n, err := s.Sweep(ctx, 500)
				if err != nil {
					t.Error(err)
					return
				}
				if n == 0 {
					return
				}
				total.Add(int64(n))
			}
		})
	}
	wg.Wait()
	if total.Load() != rows {
		t.Fatalf("4 sweepers deleted %d rows, want %d", total.Load(), rows)
	}
	if n := count(t, s, "true"); n != 100 {
		t.Fatalf("%d rows left, want 100", n)
	}
}

// TestSweepKeepsUp: records claimed and completed while sweepers run,
// with a retention that passes during the test, are all swept at the end;
// claims never fail on rows being swept.
func TestSweepKeepsUp(t *testing.T) {
	t.Parallel()
	clocks := new(testClocks)
	s := newTestStore(t, clocks)
	ctx := context.Background()
	stop := make(chan struct{})
	var (
		swept atomic.Int64
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, err := s.Sweep(ctx, 100)
			if err != nil {
				t.Error(err)
				return
			}
			swept.Add(int64(n))
		}
	})
	const keys = 1000
	for i := range keys {
		k := fmt.Sprintf("k-%d", i)
		// A minute, which the test's clock passes every 100 keys: a second
		// could pass between a claim and its completion on a loaded server.
		cr, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: k, Policy: store.AtLeastOnce, Lease: time.Minute, Retention: time.Minute})
		if err != nil || !cr.Acquired {
			t.Fatalf("Claim(%q): %+v, %v", k, cr, err)
		}
		if err := s.Finish(ctx, store.FinishRequest{Key: k, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: nil, Retention: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if i%100 == 99 {
			clocks.advance(t, 2*time.Minute) // the records so far expire
		}
	}
	close(stop)
	wg.Wait()
	for {
		n, err := s.Sweep(ctx, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		swept.Add(int64(n))
	}
	if swept.Load() != keys {
		t.Fatalf("swept %d records, want %d", swept.Load(), keys)
	}
}

// explain returns the plan of the prepared statement sql run with args
// (SQL literals).
func explain(t *testing.T, s *Store, sql, params, args string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := s.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "PREPARE idem_explain("+params+") AS "+sql); err != nil {
		t.Fatalf("PREPARE: %v\n%s", err, sql)
	}
	defer conn.Exec(ctx, "DEALLOCATE idem_explain")
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) // EXPLAIN ANALYZE of a DELETE deletes
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) EXECUTE idem_explain("+args+")")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for rows.Next() {
		var line string
		rows.Scan(&line)
		b.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestPlans checks on a large table that Sweep and List(Stuck) read only
// the rows they return: Sweep an index range of expires_at (and the rows
// by ctid), List(Stuck) the partial index of in_progress rows.
func TestPlans(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, new(testClocks))
	fill(t, s, "done-", 50000, store.StatusCompleted, time.Hour, 0)
	fill(t, s, "old-", 2000, store.StatusCompleted, -time.Hour, -time.Hour)
	fill(t, s, "stuck-", 20, store.StatusInProgress, time.Hour, -time.Minute)
	fill(t, s, "running-", 20, store.StatusInProgress, time.Hour, time.Minute)
	if _, err := s.Pool().Exec(context.Background(), "ANALYZE "+s.Table()); err != nil {
		t.Fatal(err)
	}

	plan := explain(t, s, s.q.sweep, "int", "500")
	t.Logf("Sweep(500):\n%s", plan)
	for _, want := range []string{"Index Scan using " + s.names.table + "_expires_at_idx", "Index Cond: (expires_at <=", "Tid Scan", "LockRows"} {
		if !strings.Contains(plan, want) {
			t.Errorf("the Sweep plan does not contain %q", want)
		}
	}
	if strings.Contains(plan, "Seq Scan on "+s.names.table) {
		t.Error("the Sweep plan scans the table")
	}

	plan = explain(t, s, s.q.listStuck, "text, int", "'', 100")
	t.Logf("List(Stuck):\n%s", plan)
	if !strings.Contains(plan, s.names.table+"_in_progress_idx") || strings.Contains(plan, "Seq Scan on "+s.names.table) {
		t.Errorf("List(Stuck) does not read the partial index of in_progress rows")
	}
	if !strings.Contains(plan, "rows=20 ") {
		t.Errorf("List(Stuck) does not return the 20 stuck rows")
	}

	plan = explain(t, s, s.q.get, "text", "'done-77'")
	if !strings.Contains(plan, "_pkey") || strings.Contains(plan, "expires_at_idx") {
		t.Errorf("Get does not read the primary key alone:\n%s", plan)
	}

	// With stale statistics (a burst of new rows since ANALYZE) the hot
	// statements still look keys up by primary key alone.
	fill(t, s, "burst-", 30000, store.StatusInProgress, time.Hour, time.Minute)
	for name, sql := range map[string]string{"complete": s.q.complete, "fail": s.q.fail, "release": s.q.release, "abandon": s.q.abandon} {
		types, args := "text, bigint, text, text", "'burst-5', 1, '', 'why'"
		if name == "complete" {
			types, args = "text, bigint, text, bytea, bigint", "'burst-5', 1, '', 'r', 1000000"
		} else if name == "fail" {
			types, args = "text, bigint, text, text, bigint", "'burst-5', 1, '', 'why', 1000000"
		}
		plan = explain(t, s, sql, types, args)
		if strings.Contains(plan, "expires_at_idx") || strings.Contains(plan, "Seq Scan on "+s.names.table) || strings.Contains(plan, "Bitmap") {
			t.Errorf("Finish (%s) does not look the key up by key alone:\n%s", name, plan)
		}
	}
	plan = explain(t, s, s.q.extend, "text, bigint, text, bigint", "'burst-5', 1, '', 1000000")
	if strings.Contains(plan, "expires_at_idx") || strings.Contains(plan, "Seq Scan on "+s.names.table) || strings.Contains(plan, "Bitmap") {
		t.Errorf("Extend does not look the key up by key alone:\n%s", plan)
	}
	for _, keys := range []string{"'burst-1','burst-2','new-1'", "'new-2','new-3','new-4'"} {
		plan = explain(t, s, s.q.claimBatch, "text[], text[], text[], text[], bigint[], bigint[], text[], boolean[], text[]",
			"ARRAY["+keys+"], ARRAY['o','o','o'], ARRAY['c','c','c'], ARRAY['at_least_once','at_least_once','at_least_once'], "+
				"ARRAY[1000000,1000000,1000000]::bigint[], ARRAY[1000000,1000000,1000000]::bigint[], ARRAY['','',''], ARRAY[false,false,false], ARRAY['i1','i2','i3']")
		if strings.Contains(plan, "expires_at_idx") || strings.Contains(plan, "Seq Scan on "+s.names.table) {
			t.Errorf("ClaimBatch does not look the keys up by key alone:\n%s", plan)
		}
	}
	plan = explain(t, s, s.q.claim, "text, text, text, text, bigint, bigint, text, boolean, text",
		"'burst-7', 'o', 'c', 'at_least_once', 1000000, 1000000, '', false, 'i'")
	if strings.Contains(plan, "expires_at_idx") || strings.Contains(plan, "Seq Scan on "+s.names.table) {
		t.Errorf("Claim does not look the key up by key alone:\n%s", plan)
	}
	plan = explain(t, s, s.q.completeBatch, "text[], bigint[], text[], bytea[], bigint[]",
		"ARRAY['burst-1','burst-2'], ARRAY[1,1]::bigint[], ARRAY['',''], ARRAY['r','r']::bytea[], ARRAY[1000000,1000000]::bigint[]")
	if strings.Contains(plan, "expires_at_idx") || strings.Contains(plan, "Seq Scan on "+s.names.table) {
		t.Errorf("FinishBatch does not look the keys up by key alone:\n%s", plan)
	}
}

// TestWarmPlans: a young table's statements are planned for each
// execution; once the table is large, the store uses cached statements.
func TestWarmPlans(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, new(testClocks))
	ctx := context.Background()
	claimNew(t, s, "k")
	if s.warm.Load() {
		t.Fatal("a new table is warm")
	}
	fill(t, s, "bulk-", 10000, store.StatusCompleted, time.Hour, 0)
	deadline := time.Now().Add(10 * time.Second)
	for !s.warm.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the store did not switch to cached plans on a large table")
		}
		if _, err := s.Get(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if cr := claimNew(t, s, "k2"); !cr.Acquired {
		t.Fatal("claim with cached plans: not acquired")
	}
}

// TestWarmPagesPlans: once the table has warmPages pages, the plans that
// connections would cache for the hot statements (generic plans, forced
// here) look keys up by key, on a table never analyzed and on one
// analyzed while it was empty (statistics a young table has).
func TestWarmPagesPlans(t *testing.T) {
	t.Parallel()
	for _, analyzed := range []bool{false, true} {
		t.Run(fmt.Sprintf("analyzed=%v", analyzed), func(t *testing.T) {
			ctx := context.Background()
			cfg, err := pgxpool.ParseConfig(withParams(t, testURL(t), "plan_cache_mode", "force_generic_plan"))
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 2
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			s, err := New(ctx, pool, WithSchema(newSchema(t)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			if analyzed {
				if _, err := pool.Exec(ctx, "ANALYZE "+s.Table()); err != nil {
					t.Fatal(err)
				}
			}
			for i := 0; ; i++ {
				var pages int
				if err := pool.QueryRow(ctx, "SELECT pg_relation_size(to_regclass($1)) / current_setting('block_size')::int", s.names.qtable).Scan(&pages); err != nil {
					t.Fatal(err)
				}
				if pages >= warmPages {
					break
				}
				fill(t, s, fmt.Sprintf("young-%d-", i), 50, store.StatusInProgress, time.Hour, time.Minute)
			}
			for name, x := range map[string]struct{ sql, types, args string }{
				"claim": {s.q.claim, "text, text, text, text, bigint, bigint, text, boolean, text",
					"'young-0-7', 'o', 'c', 'at_least_once', 1000000, 1000000, '', false, 'i'"},
				"claim batch": {s.q.claimBatch, "text[], text[], text[], text[], bigint[], bigint[], text[], boolean[], text[]",
					"ARRAY['young-0-1','new-1'], ARRAY['o','o'], ARRAY['c','c'], ARRAY['at_least_once','at_least_once'], " +
						"ARRAY[1000000,1000000]::bigint[], ARRAY[1000000,1000000]::bigint[], ARRAY['',''], ARRAY[false,false], ARRAY['i1','i2']"},
				"complete": {s.q.complete, "text, bigint, text, bytea, bigint", "'young-0-5', 1, '', 'r', 1000000"},
				"complete batch": {s.q.completeBatch, "text[], bigint[], text[], bytea[], bigint[]",
					"ARRAY['young-0-2','young-0-3'], ARRAY[1,1]::bigint[], ARRAY['',''], ARRAY['r','r']::bytea[], ARRAY[1000000,1000000]::bigint[]"},
				"get": {s.q.get, "text", "'young-0-9'"},
			} {
				plan := explain(t, s, x.sql, x.types, x.args)
				if strings.Contains(plan, "Seq Scan on "+s.names.table) || !strings.Contains(plan, "Index Cond: (key = ") {
					t.Errorf("%s's generic plan at %d pages does not look the key up by key:\n%s", name, warmPages, plan)
				}
			}
		})
	}
}
