// Package pgmigrations applies a package's schema migrations (see
// internal/migrations) to a PostgreSQL database: pgstore's record table,
// sqlqueue's queue tables. It is apart from internal/migrations so that
// the SQLite packages, which use that one, do not link pgx.
package pgmigrations

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/migrations"
)

// Target is where a component's migrations go.
type Target struct {
	// Component prefixes errors and log lines ("pgstore", "sqlqueue").
	Component string
	// Object names what is migrated in errors (a quoted table name).
	Object string
	// Schema is created if it does not exist ("": the search_path, nothing
	// to create).
	Schema string
	// Versions is the table of applied versions, quoted and qualified.
	Versions string
	// LockKey is the pg_advisory_xact_lock the migrations run under.
	LockKey int64
	// Render fills a migration's placeholders.
	Render func(sql string) string
	// Log, if not nil, is told of each migration applied.
	Log *slog.Logger
}

// Apply brings t up to ms (in version order, numbered from 1 without
// gaps). When the versions table already holds len(ms) or more, it only
// reads that table. Otherwise, in one transaction holding t.LockKey, so
// that processes migrating at once take turns, it creates t.Schema if
// missing (looking it up first, so that an existing schema needs no
// CREATE privilege on the database) and the versions table, and applies
// and records the migrations the table does not hold yet. A database
// migrated by a newer build (versions this one does not know) is left as
// it is: migrations only add.
func Apply(ctx context.Context, pool *pgxpool.Pool, ms []migrations.Migration, t Target) error {
	fail := func(what string, err error) error {
		return fmt.Errorf("%s: migrating %s: %s: %w", t.Component, t.Object, what, err)
	}
	// Fast path, without a lock or DDL: already up to date.
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", t.Versions).Scan(&exists); err != nil {
		return fail("looking up the migrations table", err)
	}
	if exists {
		var v int
		if err := pool.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+t.Versions).Scan(&v); err == nil && v >= len(ms) {
			return nil
		}
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fail("begin", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", t.LockKey); err != nil {
		return fail("taking the migration lock", err)
	}
	if t.Schema != "" {
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", t.Schema).Scan(&exists); err != nil {
			return fail("looking up the schema", err)
		}
		if !exists {
			if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{t.Schema}.Sanitize()); err != nil {
				return fail("creating the schema", err)
			}
		}
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+t.Versions+` (
	version    integer PRIMARY KEY,
	name       text NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`); err != nil {
		return fail("creating the migrations table", err)
	}
	var cur int
	if err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+t.Versions).Scan(&cur); err != nil {
		return fail("reading the version", err)
	}
	for _, m := range ms {
		if m.Version <= cur {
			continue
		}
		if _, err := tx.Exec(ctx, t.Render(m.SQL)); err != nil {
			return fail(m.Name, err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+t.Versions+" (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
			return fail("recording "+m.Name, err)
		}
		if t.Log != nil {
			t.Log.Info(t.Component+": applied migration", "migration", m.Name)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fail("commit", err)
	}
	return nil
}
