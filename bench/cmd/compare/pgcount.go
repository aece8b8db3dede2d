package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgActivity is what PostgreSQL's statistics say at one moment.
type pgActivity struct {
	commits int64 // pg_stat_database.xact_commit of the database
	rows    int64 // n_tup_ins + n_tup_upd + n_tup_del summed over one schema's tables
	own     int64 // the counter's own transactions so far, this read included
}

// pgCost is what one side's run cost the server: transactions committed in
// the database and rows written in the side's schema.
type pgCost struct {
	commits, rows int64
}

// costBetween returns the commits and row writes between two snapshots,
// less the counter's own transactions: those from the first read (counted
// by the second, not by itself) up to the second (not counted by itself).
func costBetween(before, after pgActivity) pgCost {
	return pgCost{commits: after.commits - before.commits - (after.own - before.own), rows: after.rows - before.rows}
}

// perMessage formats c divided by n messages.
func (c pgCost) perMessage(n int) string {
	return fmt.Sprintf("%.2f rows, %.2f commits", float64(c.rows)/float64(n), float64(c.commits)/float64(n))
}

// pgCounter reads from PostgreSQL's statistics the transactions committed
// in one database (pg_stat_database.xact_commit) and the rows written to
// one schema's tables (pg_stat_user_tables).
//
// A backend counts its activity in its own memory and publishes it at most
// once a second while connected, and always when it exits. So snapshot
// first waits until none of the bench's other connections (application_name
// benchAppName) is left in the database (a side is counted with its pool
// closed, before and after its run), then forces out its own connection's
// counts (pg_stat_force_next_flush, PostgreSQL 15) and reads. The commits
// are the whole database's: only in a database of its own are they the
// side's alone. Its own statements are transactions too, one each (simple
// protocol: no separate prepare), and costBetween takes them out.
// Autovacuum's transactions in the database, if it runs during a side, are
// not taken out; they are a few against tens of thousands.
type pgCounter struct {
	pool *pgxpool.Pool // one connection
	own  int64         // statements run on pool
}

func newPGCounter(ctx context.Context, dbURL string) (*pgCounter, error) {
	pc, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	pc.MaxConns, pc.MinConns = 1, 1
	pc.ConnConfig.RuntimeParams["application_name"] = benchAppName + "-counter"
	pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	return &pgCounter{pool: pool}, nil
}

func (c *pgCounter) close() { c.pool.Close() }

// row runs one statement (one transaction) that returns one row.
func (c *pgCounter) row(ctx context.Context, sql string, args ...any) pgx.Row {
	c.own++
	return c.pool.QueryRow(ctx, sql, args...)
}

// snapshot waits up to 30 s for the bench's other connections to the
// database to close, then reads the database's commits and schema's row
// writes.
func (c *pgCounter) snapshot(ctx context.Context, schema string) (pgActivity, error) {
	for deadline := time.Now().Add(30 * time.Second); ; {
		var others int64
		if err := c.row(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name = $1`, benchAppName).Scan(&others); err != nil {
			return pgActivity{}, err
		}
		if others == 0 {
			break
		}
		if time.Now().After(deadline) {
			return pgActivity{}, fmt.Errorf("counting: %d connections named %s still in the database after 30 s", others, benchAppName)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var flushed string
	if err := c.row(ctx, "SELECT pg_stat_force_next_flush()::text").Scan(&flushed); err != nil {
		return pgActivity{}, fmt.Errorf("counting needs PostgreSQL 15 or later: %w", err)
	}
	var a pgActivity
	err := c.row(ctx, `SELECT
		(SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
		(SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint FROM pg_stat_user_tables WHERE schemaname = $1)`,
		schema).Scan(&a.commits, &a.rows)
	a.own = c.own
	return a, err
}

// countPG runs one side between two snapshots of c for schema and returns
// what the run cost. run must close its connections before it returns.
func countPG(ctx context.Context, c *pgCounter, schema string, run func() error) (pgCost, error) {
	before, err := c.snapshot(ctx, schema)
	if err != nil {
		return pgCost{}, err
	}
	if err := run(); err != nil {
		return pgCost{}, err
	}
	after, err := c.snapshot(ctx, schema)
	if err != nil {
		return pgCost{}, err
	}
	return costBetween(before, after), nil
}

// benchDatabase makes the database e2e-pg runs in (unless it exists) on the
// server of pgURL, and returns pgURL with that database. It has a
// database of its own because PostgreSQL counts commits per database: the
// counts are this run's alone only if nothing else uses it.
func benchDatabase(ctx context.Context, pgURL, name string) (string, error) {
	u, err := url.Parse(pgURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("-e2e-pg-db needs -pg as a postgres:// URL, not %q", pgURL)
	}
	pool, err := newPool(ctx, pgURL, 1)
	if err != nil {
		return "", err
	}
	defer pool.Close()
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", err
	}
	if !exists {
		if _, err := pool.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			return "", err
		}
	}
	u.Path = "/" + strings.TrimPrefix(name, "/")
	return u.String(), nil
}

// dropBenchDatabase drops the database benchDatabase made, ending any
// session still in it.
func dropBenchDatabase(ctx context.Context, pgURL, name string) error {
	pool, err := newPool(ctx, pgURL, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	_, err = pool.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	return err
}
