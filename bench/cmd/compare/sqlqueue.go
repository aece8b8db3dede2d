package main

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/sqlitestore"
	"github.com/jackc/pgx/v5/pgxpool"
)

const defaultQueue = "sqlqueue"

func queueKinds() []string { return []string{"sqlqueue", "memqueue"} }

// newSQLiteQueue returns a sqlqueue queue in the ledger's own SQLite file,
// sharing the store's write turn: idem's embedded default.
func newSQLiteQueue(ctx context.Context, cfg *config, st *sqlitestore.Store) (idemQueue, error) {
	if cfg.queue == "memqueue" {
		return newMemQueue(), nil
	}
	write := sqlqueue.WithGroupCommit(st)
	if cfg.fused {
		write = sqlqueue.WithLedger(st) // and the store's group commit
	}
	qs, err := sqlqueue.NewSQLite(ctx, st.DB(), write, sqlqueue.WithLogger(cfg.log))
	if err != nil {
		return idemQueue{}, err
	}
	q, err := qs.Queue("bench")
	if err != nil {
		qs.Close()
		return idemQueue{}, err
	}
	return idemQueue{name: "queue/sqlqueue (SQLite)", src: q, publish: publisherFunc(q, cfg.consumers), close: qs.Close}, nil
}

// newPGQueue returns a sqlqueue queue in bench_idem on pool.
func newPGQueue(ctx context.Context, cfg *config, pool *pgxpool.Pool, st store.Store, round int) (idemQueue, error) {
	if cfg.queue == "memqueue" {
		return newMemQueue(), nil
	}
	opts := []sqlqueue.Option{sqlqueue.WithSchema(idemSchema), sqlqueue.WithLogger(cfg.log)}
	if cfg.fused {
		opts = append(opts, sqlqueue.WithLedger(st))
	}
	qs, err := sqlqueue.NewPostgres(ctx, pool, opts...)
	if err != nil {
		return idemQueue{}, err
	}
	q, err := qs.Queue(fmt.Sprintf("bench_%d", round))
	if err != nil {
		qs.Close()
		return idemQueue{}, err
	}
	return idemQueue{name: "queue/sqlqueue (PostgreSQL)", src: q, publish: publisherFunc(q, cfg.consumers), close: qs.Close}, nil
}
