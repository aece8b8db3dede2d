//go:build !sqlqueue

package main

import (
	"context"

	"github.com/idemkit/idem/store/sqlitestore"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Until queue/sqlqueue is on main, the end-to-end runs use queue/memqueue
// on idem's side (the ledger is still durable: sqlitestore or pgstore).
// Build with -tags sqlqueue once it is.
const defaultQueue = "memqueue"

func queueKinds() []string { return []string{"memqueue"} }

func newSQLiteQueue(context.Context, *config, *sqlitestore.Store) (idemQueue, error) {
	return newMemQueue(), nil
}

func newPGQueue(context.Context, *config, *pgxpool.Pool, int) (idemQueue, error) {
	return newMemQueue(), nil
}
