package pgstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Cached plans on a young table.
//
// pgx prepares each statement once per connection, and PostgreSQL soon
// reuses a generic plan for it. A plan made while the table holds a few
// rows reads it sequentially (cheaper than an index on a page or two), and
// it stays in the connection's cache while the table grows, until
// autovacuum next analyzes the table: on a new table under load, about a
// minute in which every call reads the whole table. So while the table is
// smaller than warmPages, the store has each statement planned for its
// own execution (pgx.QueryExecModeExec: PostgreSQL's unnamed statement,
// still one round trip), and looks at the table's size at most once a
// second, in the background; once it is larger, the store uses cached
// statements for good. The migration also keeps the table from shrinking
// (vacuum_truncate = false), so a table that was once large never looks
// small to the planner again.
//
// Planning per call is not cheap: the claim statement is long, and from
// pgbench it runs at 0.17 – 0.28× its prepared rate when parsed and
// planned for each call (BenchmarkEngineStatements/claim-planned against
// claim, 8 clients): a new store's first few thousand claims are slower.

// warmPages is the table size (in pages) from which cached plans are
// used. Generic plans (what a connection caches) of the statements that
// look keys up use the key's index from here on, on a table never
// analyzed or analyzed while empty; at 32 pages the batch claim's and
// FinishBatch's still read the whole table (TestWarmPagesPlans, default
// cost settings). 64 pages did not shorten the young phase (2,718 and
// 2,852 claims against 2,037 and 2,171 at 128, 8 callers): how many rows
// fill the pages depends on how PostgreSQL extends a table under
// concurrent inserts (14 to 43 rows a page in those runs).
const warmPages = 128

// modeArgs returns args, preceded by pgx.QueryExecModeExec while the
// table is young.
func (s *Store) modeArgs(args []any) []any {
	if s.warm.Load() {
		return args
	}
	now := time.Now().UnixNano()
	if next := s.warmCheck.Load(); now >= next && s.warmCheck.CompareAndSwap(next, now+int64(time.Second)) {
		go s.checkWarm()
	}
	return append([]any{pgx.QueryExecModeExec}, args...)
}

// checkWarm looks at the table's size, in the background of the call that
// asked (so that no call waits for it).
func (s *Store) checkWarm() {
	if s.closed.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var warm bool
	err := s.pool.QueryRow(ctx, `SELECT coalesce(pg_relation_size(to_regclass($1)) >= $2::bigint * current_setting('block_size')::bigint, false)`,
		pgx.QueryExecModeExec, s.names.qtable, warmPages).Scan(&warm)
	if err == nil && warm {
		s.warm.Store(true)
	}
}

// query, queryRow and exec run a statement on q in the store's mode.
func (s *Store) query(ctx context.Context, q querier, sql string, args ...any) (pgx.Rows, error) {
	return q.Query(ctx, sql, s.modeArgs(args)...)
}

func (s *Store) queryRow(ctx context.Context, q querier, sql string, args ...any) pgx.Row {
	return q.QueryRow(ctx, sql, s.modeArgs(args)...)
}

func (s *Store) exec(ctx context.Context, q querier, sql string, args ...any) (pgconn.CommandTag, error) {
	return q.Exec(ctx, sql, s.modeArgs(args)...)
}
