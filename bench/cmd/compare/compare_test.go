package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/store"

	"github.com/hibiken/asynq"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/store/redisstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
)

// The tests check that each pair of sides makes the same decision on the
// same key (so the comparison is of like with like), and that each
// comparison runs end to end on a tiny load. They are not run by the root
// module's CI (bench/ is a module of its own); run them with
//
//	cd bench && IDEM_TEST_POSTGRES=... IDEM_TEST_REDIS=... go test ./...

func testConfig(t *testing.T) *config {
	t.Helper()
	cfg, err := parseFlags([]string{"-rounds", "2", "-duration", "100ms", "-warmup", "20ms", "-callers", "2",
		"-n", "300", "-prefill", "600", "-river-sqlite-n", "50", "-pg-n", "100", "-consumers", "8"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.log = slog.New(slog.DiscardHandler)
	return cfg
}

func needPostgres(t *testing.T, cfg *config) {
	cfg.pgURL = testenv.Require(t, testenv.Postgres, "the Postgres comparison")
}

func needRedis(t *testing.T, cfg *config) {
	cfg.redisURL = testenv.Require(t, testenv.Redis, "the Redis comparison")
}

// A key seen before is refused by both sides: River skips the insert as a
// duplicate, pgstore does not acquire the claim; alone and in a batch.
func TestPostgresSidesRefuseTheSameDuplicate(t *testing.T) {
	cfg := testConfig(t)
	needPostgres(t, cfg)
	ctx := context.Background()
	if err := resetSchemas(ctx, cfg.pgURL, cfg.log); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dropSchemas(ctx, cfg.pgURL) })

	s, pool, err := idemStore(ctx, cfg, 2, "dup")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for i, want := range []bool{true, false} {
		r, err := s.Claim(ctx, claimRequest("k1"))
		if err != nil || r.Acquired != want {
			t.Fatalf("claim %d of k1: acquired %v, %v; want acquired %v", i+1, r.Acquired, err, want)
		}
	}
	res, err := s.ClaimBatch(ctx, []store.ClaimRequest{claimRequest("k1"), claimRequest("k2")})
	if err != nil || res[0].Acquired || !res[1].Acquired {
		t.Fatalf("ClaimBatch(k1, k2) = %+v, %v; want k1 refused, k2 acquired", res, err)
	}

	c, rpool, err := riverInserter(ctx, cfg, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	defer rpool.Close()
	for i, want := range []bool{false, true} {
		r, err := c.Insert(ctx, keyArgs{Key: "k1"}, uniqueByArgs)
		if err != nil || r.UniqueSkippedAsDuplicate != want {
			t.Fatalf("River insert %d of k1: skipped %v, %v; want skipped %v", i+1, r.UniqueSkippedAsDuplicate, err, want)
		}
	}
	many, err := c.InsertMany(ctx, []river.InsertManyParams{
		{Args: keyArgs{Key: "k1"}, InsertOpts: uniqueByArgs}, {Args: keyArgs{Key: "k2"}, InsertOpts: uniqueByArgs}})
	if err != nil || !many[0].UniqueSkippedAsDuplicate || many[1].UniqueSkippedAsDuplicate {
		t.Fatalf("River InsertMany(k1, k2): %v; want k1 skipped, k2 inserted", err)
	}
}

// asynq refuses a second enqueue of the same payload under Unique with
// ErrDuplicateTask; redisstore refuses a second claim of a completed key.
func TestRedisSidesRefuseTheSameDuplicate(t *testing.T) {
	cfg := testConfig(t)
	needRedis(t, cfg)
	ctx := context.Background()
	rc, err := redisClient(ctx, cfg, cfg.idemDB, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	s := redisstore.New(rc, redisstore.WithPrefix("bench:"))
	r, err := s.Claim(ctx, claimRequest("k1"))
	if err != nil || !r.Acquired {
		t.Fatalf("first claim: %+v, %v", r, err)
	}
	if err := s.Finish(ctx, store.FinishRequest{Key: "k1", Fence: r.Record.Fence, AttemptID: r.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: nil, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Claim(ctx, claimRequest("k1")); err != nil || r.Acquired || r.Record.Status != idem.StatusCompleted {
		t.Fatalf("second claim: acquired %v, status %v, %v; want refused, completed", r.Acquired, r.Record.Status, err)
	}

	ac, err := redisClient(ctx, cfg, cfg.asynqDB, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	client := asynq.NewClientFromRedisClient(ac)
	if _, err := client.EnqueueContext(ctx, asynq.NewTask("idem_bench_key", []byte("k1")), asynq.Unique(time.Hour)); err != nil {
		t.Fatal(err)
	}
	_, err = client.EnqueueContext(ctx, asynq.NewTask("idem_bench_key", []byte("k1")), asynq.Unique(time.Hour))
	if !errors.Is(err, asynq.ErrDuplicateTask) {
		t.Fatalf("second enqueue: %v; want asynq.ErrDuplicateTask", err)
	}
}

// Every comparison runs end to end and reports both sides for every round
// and concurrency, with a ratio in the summary.
func TestComparisonsRun(t *testing.T) {
	cfg := testConfig(t)
	var out bytes.Buffer
	cfg.out = &out
	cfg.only = map[string]bool{"e2e-sqlite": true}
	if cfg.pgURL != "" {
		cfg.only["pg"], cfg.only["e2e-pg"] = true, true
	}
	if cfg.redisURL != "" {
		cfg.only["redis"] = true
	}
	if err := run(context.Background(), cfg); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	text := out.String()
	for comp := range cfg.only {
		want := map[string][]string{
			"pg":         {"pg claim, 2 callers: median ratio", "pg claim-batch10, 2 callers: median ratio"},
			"redis":      {"redis claim+complete, 2 callers: median ratio", "redis claim, 2 callers: median ratio"},
			"e2e-sqlite": {"e2e sqlite, 8 callers: median ratio"},
			"e2e-pg": {"e2e pg, 8 callers: median ratio", "× idem÷river", "× idem÷dbos", "× river÷dbos",
				"e2e pg               round 1 callers 8   dbos"},
		}[comp]
		for _, w := range want {
			if !strings.Contains(text, w) {
				t.Errorf("the summary has no line %q:\n%s", w, text)
			}
		}
	}
	if t.Failed() || testing.Verbose() {
		os.Stdout.WriteString(text)
	}
}

// With -receivers, idem's side runs that many consumers on the same queue
// and ledger, sharing the concurrency: every message is still handled
// once (idemE2E counts the handler's runs) and acked.
func TestE2EReceiversShareTheQueue(t *testing.T) {
	cfg := testConfig(t)
	var out bytes.Buffer
	cfg.out = &out
	cfg.only = map[string]bool{"e2e-sqlite": true}
	cfg.rounds, cfg.receivers = 1, 3
	if err := run(context.Background(), cfg); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if text := out.String(); !strings.Contains(text, "no-op handler in 3 consumers (receive loops)") {
		t.Errorf("idem's line does not name its 3 consumers:\n%s", text)
	}
}

// countPG counts exactly the transactions a run commits in the database and
// the rows it writes in the schema, once its connections are closed, and
// not the counter's own statements.
func TestCountPGCountsCommitsAndRowWrites(t *testing.T) {
	cfg := testConfig(t)
	needPostgres(t, cfg)
	ctx := context.Background()
	const db = "idem_bench_test_count"
	dbURL, err := benchDatabase(ctx, cfg.pgURL, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dropBenchDatabase(ctx, cfg.pgURL, db) })
	setup, err := newPool(ctx, dbURL, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Exec(ctx, "CREATE SCHEMA counted; CREATE TABLE counted.t (k int PRIMARY KEY, v int); CREATE TABLE public.other (k int)"); err != nil {
		t.Fatal(err)
	}
	setup.Close()
	counter, err := newPGCounter(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer counter.close()

	cost, err := countPG(ctx, counter, "counted", func() error {
		pc, err := pgxpool.ParseConfig(dbURL)
		if err != nil {
			return err
		}
		pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol // no prepare transactions
		pc.MaxConns = 1                                                      // connecting commits 1 (the backend reads its catalogs)
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return err
		}
		defer pool.Close()
		for k := range 10 { // 10 commits, 10 rows
			if _, err := pool.Exec(ctx, "INSERT INTO counted.t VALUES ($1, 0)", k); err != nil {
				return err
			}
		}
		// 1 commit, 4 rows in the schema (3 updated, 1 deleted), 1 row elsewhere
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		for _, q := range []string{"UPDATE counted.t SET v = 1 WHERE k < 3", "DELETE FROM counted.t WHERE k = 9", "INSERT INTO public.other VALUES (1)"} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		// a rolled-back transaction commits nothing
		tx, err = pool.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO counted.t VALUES (100, 0)"); err != nil {
			return err
		}
		return tx.Rollback(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	// Connecting counts 1 commit. A rolled-back insert counts in n_tup_ins:
	// PostgreSQL counts the row written, whether or not it is kept.
	if want := (pgCost{commits: 1 + 11, rows: 15}); cost != want {
		t.Fatalf("countPG = %+v; want %+v", cost, want)
	}
}

// With three sides the summary gives every pair's median ratio, and a
// target applies only to idem against the anchor it names.
func TestSummaryPairsEverySide(t *testing.T) {
	var out bytes.Buffer
	rep := &report{out: &out}
	rep.target(target{comp: "e2e pg", anchor: "river", ratio: 1.5})
	rep.target(target{comp: "e2e pg", anchor: "dbos", ratio: 20})
	rep.target(target{comp: "e2e pg", anchor: "river", ratio: 3, callers: 64}) // another concurrency's: not this one's
	for round, rates := range [][3]float64{{3000, 1500, 300}, {3300, 1500, 100}} {
		for i, side := range []string{"idem", "river", "dbos"} {
			rep.add(sample{comp: "e2e pg", side: side, callers: 512, round: round + 1, rate: rates[i], cost: "1.00 rows, 1.00 commits"})
		}
	}
	rep.print()
	text := out.String()
	for _, want := range []string{
		"e2e pg, 512 callers: median ratio 2.10× idem÷river (min 2.00, max 2.20); target ≥ 1.5×: MET\n",
		"e2e pg, 512 callers: median ratio 21.50× idem÷dbos (min 10.00, max 33.00); target ≥ 20×: MET\n",
		"e2e pg, 512 callers: median ratio 10.00× river÷dbos (min 5.00, max 15.00)\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the summary has no line %q:\n%s", want, text)
		}
	}
}
