package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkit/idem/store"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// Schemas the Postgres comparisons own: dropped and made again at the start
// of a run (and dropped at its end unless -keep).
const (
	idemSchema  = "bench_idem"
	riverSchema = "bench_river"
)

// keyArgs is the job River inserts: its one field is the dedup key, so
// UniqueOpts{ByArgs: true} makes River decide "new or duplicate" on the
// same key idem claims.
type keyArgs struct {
	Key string `json:"key"`
}

func (keyArgs) Kind() string { return "idem_bench_key" }

// pgxTx is the transaction type of River's pgx driver.
type pgxTx = pgx.Tx

var uniqueByArgs = &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}

// claimRequest is the claim idem makes for every key: the defaults of
// idem.Ledger.Do (at-least-once, 30 s lease), kept for an hour.
func claimRequest(key string) store.ClaimRequest {
	return store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: key, Owner: "bench", Correlation: "bench", Policy: idem.AtLeastOnce,
		Lease: 30 * time.Second, Retention: time.Hour}
}

// benchAppName is the application_name of every connection the bench
// opens, so that the row and commit counting can tell when all of a side's
// connections have gone (see pgCounter).
const benchAppName = "idem-bench"

// newPool opens a pool of exactly conns connections, all connected before
// it returns.
func newPool(ctx context.Context, url string, conns int) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pc.MaxConns, pc.MinConns = int32(conns), int32(conns)
	pc.ConnConfig.RuntimeParams["application_name"] = benchAppName
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	// Touch every connection once so that connecting is not measured.
	conns32 := make([]*pgxpool.Conn, 0, conns)
	defer func() {
		for _, c := range conns32 {
			c.Release()
		}
	}()
	for range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			pool.Close()
			return nil, err
		}
		conns32 = append(conns32, c)
	}
	return pool, nil
}

// resetSchemas drops and makes again the two schemas, and migrates River's.
func resetSchemas(ctx context.Context, url string, log *slog.Logger) error {
	pool, err := newPool(ctx, url, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	for _, s := range []string{idemSchema, riverSchema} {
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+s+" CASCADE"); err != nil {
			return err
		}
	}
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+riverSchema); err != nil {
		return err
	}
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: riverSchema, Logger: log})
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrate: %w", err)
	}
	return nil
}

func dropSchemas(ctx context.Context, url string) error {
	pool, err := newPool(ctx, url, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	for _, s := range []string{idemSchema, riverSchema} {
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+s+" CASCADE"); err != nil {
			return err
		}
	}
	return nil
}

// dropSchema drops one schema and all in it.
func dropSchema(ctx context.Context, url, schema string) error {
	pool, err := newPool(ctx, url, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	_, err = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	return err
}

// truncate empties a table on a connection of its own.
func truncate(ctx context.Context, url, table string) error {
	pool, err := newPool(ctx, url, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	_, err = pool.Exec(ctx, "TRUNCATE "+table)
	return err
}

// riverInserter returns an insert-only River client (no queues) on a pool
// of conns connections, after truncating River's job table if truncate.
func riverInserter(ctx context.Context, cfg *config, conns int, truncate bool) (*river.Client[pgxTx], *pgxpool.Pool, error) {
	pool, err := newPool(ctx, cfg.pgURL, conns)
	if err != nil {
		return nil, nil, err
	}
	if truncate {
		if _, err := pool.Exec(ctx, "TRUNCATE "+riverSchema+".river_job"); err != nil {
			pool.Close()
			return nil, nil, err
		}
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[keyArgs]) error { return nil }))
	c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: riverSchema, Workers: workers, Logger: cfg.log})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return c, pool, nil
}

// idemStore returns a pgstore.Store on a fresh table of its own in
// bench_idem, on a pool of conns connections.
func idemStore(ctx context.Context, cfg *config, conns int, table string) (*pgstore.Store, *pgxpool.Pool, error) {
	pool, err := newPool(ctx, cfg.pgURL, conns)
	if err != nil {
		return nil, nil, err
	}
	s, err := pgstore.New(ctx, pool, pgstore.WithSchema(idemSchema), pgstore.WithTable(table))
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return s, pool, nil
}

// comparePG: pgstore's Claim against River's unique Insert, and
// pgstore's ClaimBatch of 10 against River's InsertMany of 10 unique jobs,
// on the same database, at each concurrency.
func comparePG(ctx context.Context, cfg *config, rep *report) error {
	if cfg.pgURL == "" {
		return errors.New("set IDEM_TEST_POSTGRES (or -pg) to run the Postgres comparison")
	}
	if err := resetSchemas(ctx, cfg.pgURL, cfg.log); err != nil {
		return err
	}
	if !cfg.keep {
		defer dropSchemas(context.WithoutCancel(ctx), cfg.pgURL)
	}
	rep.target(target{comp: "pg claim", ratio: 1})
	rep.target(target{comp: "pg claim-batch10", ratio: 2})
	var sc string
	if pool, err := newPool(ctx, cfg.pgURL, 1); err == nil {
		_ = pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sc)
		pool.Close()
	}
	rep.note("Postgres synchronous_commit = %s (the same for both sides)", sc)

	// Both sides work on tables already in use: prefill rows are claimed
	// (inserted) before the first measurement, and the tables keep growing
	// through the run. (On a new, near-empty table pgstore plans each
	// statement per call until the table passes 1 MB; see store/pgstore's
	// plans.go. River caches its plans from the start.)
	const table = "keys"
	if err := prefillPG(ctx, cfg, table, cfg.prefill); err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	rep.note("pg: each side's table was prefilled with %d keys (jobs) before the first measurement and grows through the run", cfg.prefill)
	for round := 1; round <= cfg.rounds; round++ {
		for _, n := range cfg.callers {
			for _, batch := range []int{1, 10} {
				comp := "pg claim"
				if batch > 1 {
					comp = fmt.Sprintf("pg claim-batch%d", batch)
				}
				idemSide := func() error {
					s, pool, err := idemStore(ctx, cfg, n, table)
					if err != nil {
						return err
					}
					defer pool.Close()
					defer s.Close()
					ks := newKeys("pg")
					load := loadavg()
					rate, cpu, err := throughput(ctx, n, cfg.warmup, cfg.duration, func(int) op {
						if batch == 1 {
							return func(ctx context.Context) (int, error) {
								r, err := s.Claim(ctx, claimRequest(ks.next()))
								if err == nil && !r.Acquired {
									err = fmt.Errorf("claim of a new key %q not acquired", r.Record.Key)
								}
								return 1, err
							}
						}
						reqs := make([]store.ClaimRequest, batch)
						return func(ctx context.Context) (int, error) {
							for i := range reqs {
								reqs[i] = claimRequest(ks.next())
							}
							res, err := s.ClaimBatch(ctx, reqs)
							if err != nil {
								return 0, err
							}
							for _, r := range res {
								if !r.Acquired {
									return 0, fmt.Errorf("batch claim of a new key %q not acquired", r.Record.Key)
								}
							}
							return batch, nil
						}
					})
					if err != nil {
						return fmt.Errorf("idem: %w", err)
					}
					what := "pgstore.Store.Claim (new key)"
					if batch > 1 {
						what = fmt.Sprintf("pgstore.Store.ClaimBatch of %d new keys", batch)
					}
					rep.add(sample{comp: comp, side: "idem", what: what, callers: n, round: round, rate: rate, cpu: cpu, load: load})
					return nil
				}
				riverSide := func() error {
					c, pool, err := riverInserter(ctx, cfg, n, false)
					if err != nil {
						return err
					}
					defer pool.Close()
					ks := newKeys("pg")
					load := loadavg()
					rate, cpu, err := throughput(ctx, n, cfg.warmup, cfg.duration, func(int) op {
						if batch == 1 {
							return func(ctx context.Context) (int, error) {
								r, err := c.Insert(ctx, keyArgs{Key: ks.next()}, uniqueByArgs)
								if err == nil && r.UniqueSkippedAsDuplicate {
									err = errors.New("river: a new key was skipped as a duplicate")
								}
								return 1, err
							}
						}
						params := make([]river.InsertManyParams, batch)
						return func(ctx context.Context) (int, error) {
							for i := range params {
								params[i] = river.InsertManyParams{Args: keyArgs{Key: ks.next()}, InsertOpts: uniqueByArgs}
							}
							res, err := c.InsertMany(ctx, params)
							if err != nil {
								return 0, err
							}
							for _, r := range res {
								if r.UniqueSkippedAsDuplicate {
									return 0, errors.New("river: a new key was skipped as a duplicate")
								}
							}
							return batch, nil
						}
					})
					if err != nil {
						return fmt.Errorf("river: %w", err)
					}
					what := "river.Client.Insert, UniqueOpts{ByArgs: true}"
					if batch > 1 {
						what = fmt.Sprintf("river.Client.InsertMany of %d, UniqueOpts{ByArgs: true}", batch)
					}
					rep.add(sample{comp: comp, side: "river", what: what, callers: n, round: round, rate: rate, cpu: cpu, load: load})
					return nil
				}
				if err := sides(round, idemSide, riverSide); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// prefillPG claims n new keys in idem's table and inserts n unique jobs in
// River's, in batches, unmeasured.
func prefillPG(ctx context.Context, cfg *config, table string, n int) error {
	s, pool, err := idemStore(ctx, cfg, 1, table)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer s.Close()
	c, rpool, err := riverInserter(ctx, cfg, 1, true)
	if err != nil {
		return err
	}
	defer rpool.Close()
	ks := newKeys("prefill")
	for done := 0; done < n; done += 500 {
		reqs := make([]store.ClaimRequest, min(500, n-done))
		params := make([]river.InsertManyParams, len(reqs))
		for i := range reqs {
			reqs[i] = claimRequest(ks.next())
			params[i] = river.InsertManyParams{Args: keyArgs{Key: reqs[i].Key}, InsertOpts: uniqueByArgs}
		}
		if _, err := s.ClaimBatch(ctx, reqs); err != nil {
			return err
		}
		if _, err := c.InsertMany(ctx, params); err != nil {
			return err
		}
	}
	if _, err := pool.Exec(ctx, "ANALYZE "+s.Table()); err != nil {
		return err
	}
	_, err = rpool.Exec(ctx, "ANALYZE "+riverSchema+".river_job")
	return err
}
