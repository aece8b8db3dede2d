package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The DBOS side of e2e-pg: its system tables live in dbosSchema, the
// workflows run from one queue.
const (
	dbosSchema       = "bench_dbos"
	dbosQueue        = "idem_bench"
	dbosWorkflowName = "idem_bench_e2e"
	dbosMigrations   = "dbos_migrations" // the one table a reset keeps
)

// dbosConfig is the DBOS configuration every DBOS context of the run uses:
// the system tables in dbosSchema on pool, a fixed application version
// (DBOS would otherwise hash this executable at start), the run's logger.
func dbosConfig(cfg *config, pool *pgxpool.Pool) dbos.Config {
	return dbos.Config{AppName: "idem-bench", SystemDBPool: pool, DatabaseSchema: dbosSchema,
		ApplicationVersion: "bench", Logger: cfg.log}
}

// migrateDBOS makes dbosSchema and DBOS's system tables in it on a pool of
// its own (DBOS migrates when its context is made), unmeasured.
func migrateDBOS(ctx context.Context, cfg *config) error {
	pool, err := newPool(ctx, cfg.pgURL, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	dctx, err := dbos.NewContext(ctx, dbosConfig(cfg, pool))
	if err != nil {
		return fmt.Errorf("dbos: %w", err)
	}
	return dbos.Shutdown(dctx, 10*time.Second)
}

// truncateDBOS empties every DBOS system table but the migrations' record,
// so that each round starts from an empty queue on migrated tables.
func truncateDBOS(ctx context.Context, cfg *config) error {
	pool, err := newPool(ctx, cfg.pgURL, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	rows, err := pool.Query(ctx, "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = $1 AND tablename <> $2",
		dbosSchema, dbosMigrations)
	if err != nil {
		return err
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	if len(tables) == 0 {
		return fmt.Errorf("no DBOS tables in schema %s", dbosSchema)
	}
	q := "TRUNCATE"
	for i, t := range tables {
		if i > 0 {
			q += ","
		}
		q += " " + dbosSchema + "." + t
	}
	_, err = pool.Exec(ctx, q+" CASCADE")
	return err
}

// dbosE2E enqueues n workflows on a DBOS queue in transactions of
// publishBatch (dbos.WithEnqueueTransaction on a transaction of pool), then
// launches DBOS and waits until every workflow is recorded SUCCESS. Each
// workflow runs one step (dbos.RunAsStep), the no-op effect, which must run
// exactly once per workflow. The queue has cfg.dbosWorkers worker
// concurrency and polls every cfg.dbosPoll. DBOS closes pool when it shuts
// down. watch, on a connection of its own, reads the completions at the end.
func dbosE2E(ctx context.Context, cfg *config, pool *pgxpool.Pool, watch *pgCounter, n int) (e2eResult, error) {
	res := e2eResult{n: n}
	dctx, err := dbos.NewContext(ctx, dbosConfig(cfg, pool))
	if err != nil {
		return res, fmt.Errorf("dbos: %w", err)
	}
	shutdown := func() error { return dbos.Shutdown(dctx, 30*time.Second) }
	var effects, returned atomic.Int64
	allReturned := make(chan struct{})
	effect := func(context.Context) (int, error) {
		effects.Add(1)
		return 0, nil
	}
	dbos.RegisterWorkflow(dctx, func(wctx dbos.Context, i int) (int, error) {
		defer func() {
			if returned.Add(1) == int64(n) {
				close(allReturned)
			}
		}()
		return dbos.RunAsStep(wctx, effect, dbos.WithStepName("effect"))
	}, dbos.WithWorkflowName(dbosWorkflowName))
	if _, err := dbos.RegisterQueue(dctx, dbosQueue, dbos.WithWorkerConcurrency(cfg.dbosWorkers),
		dbos.WithQueueBasePollingInterval(cfg.dbosPoll)); err != nil {
		shutdown()
		return res, fmt.Errorf("dbos: register queue: %w", err)
	}

	cpu0 := cpuTime()
	start := time.Now()
	for done := 0; done < n; done += publishBatch {
		if err := enqueueDBOS(ctx, dctx, pool, done, min(publishBatch, n-done)); err != nil {
			shutdown()
			return res, fmt.Errorf("dbos: enqueue: %w", err)
		}
	}
	res.publish = time.Since(start)

	start = time.Now()
	if err := dbos.Launch(dctx); err != nil {
		shutdown()
		return res, fmt.Errorf("dbos: launch: %w", err)
	}
	// DBOS records a workflow SUCCESS after its function returns: count the
	// records once the functions have all returned.
	if err := waitClosed(ctx, allReturned, returned.Load, 2*time.Minute); err != nil {
		shutdown()
		return res, fmt.Errorf("dbos: workflows returned: %w", err)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		var succeeded int64
		if err := watch.row(ctx, "SELECT count(*) FROM "+dbosSchema+".workflow_status WHERE status = 'SUCCESS'").Scan(&succeeded); err != nil {
			shutdown()
			return res, err
		}
		if succeeded == int64(n) {
			break
		}
		if time.Now().After(deadline) {
			shutdown()
			return res, fmt.Errorf("dbos: %d of %d workflows recorded SUCCESS a minute after all returned", succeeded, n)
		}
		time.Sleep(time.Millisecond)
	}
	res.consume = time.Since(start)
	res.cpu = cpuTime() - cpu0
	if err := shutdown(); err != nil {
		return res, fmt.Errorf("dbos: %w", err)
	}
	if e := effects.Load(); e != int64(n) {
		return res, fmt.Errorf("dbos: the step ran %d times for %d workflows", e, n)
	}
	return res, nil
}

// enqueueDBOS enqueues the workflows first..first+count-1 in one
// transaction of pool.
func enqueueDBOS(ctx context.Context, dctx dbos.Context, pool *pgxpool.Pool, first, count int) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	for i := first; i < first+count; i++ {
		if _, err := dbos.Enqueue[int](dctx, dbosQueue, dbosWorkflowName, i, dbos.WithEnqueueTransaction(tx)); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// waitClosed waits until done is closed, or fails when count (of the work
// done so far) has not moved in stall.
func waitClosed(ctx context.Context, done <-chan struct{}, count func() int64, stall time.Duration) error {
	t := time.NewTicker(stall)
	defer t.Stop()
	last := int64(-1)
	for {
		select {
		case <-done:
			return nil
		case <-t.C:
			c := count()
			if c == last {
				return fmt.Errorf("no progress in %s (at %d)", stall, c)
			}
			last = c
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
