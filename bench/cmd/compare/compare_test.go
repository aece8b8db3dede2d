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
			"e2e-pg":     {"e2e pg, 8 callers: median ratio"},
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
