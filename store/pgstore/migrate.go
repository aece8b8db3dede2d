package pgstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"

	embedded "github.com/idemkit/idem/internal/migrations"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

// migrations returns the embedded migrations in version order. File names
// are NNN_description.sql, numbered from 1 without gaps.
func migrations() ([]migration, error) {
	loaded, err := embedded.Load(migrationFiles, "migrations", "pgstore")
	if err != nil {
		return nil, err
	}
	ms := make([]migration, len(loaded))
	for i, m := range loaded {
		ms[i] = migration{version: m.Version, name: m.Name, sql: m.SQL}
	}
	return ms, nil
}

// names are the identifiers of a store's objects.
type names struct {
	schema, table string // as given; schema "" for the search_path
	qtable        string // quoted, qualified when schema is set
	qversions     string // the migrations table, quoted and qualified
	lockKey       int64  // the advisory lock of the migrations
}

func newNames(schema, table string) names {
	qual := func(name string) string {
		if schema == "" {
			return pgx.Identifier{name}.Sanitize()
		}
		return pgx.Identifier{schema, name}.Sanitize()
	}
	h := fnv.New64a()
	h.Write([]byte("idem/pgstore\x00" + schema + "\x00" + table))
	return names{
		schema:    schema,
		table:     table,
		qtable:    qual(table),
		qversions: qual(table + "_migrations"),
		lockKey:   int64(h.Sum64()),
	}
}

// render fills a migration's placeholders.
func (n names) render(sql string) string {
	id := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	return strings.NewReplacer(
		"{{table}}", n.qtable,
		"{{pkey}}", id(n.table+"_pkey"),
		"{{expires_idx}}", id(n.table+"_expires_at_idx"),
		"{{in_progress_idx}}", id(n.table+"_in_progress_idx"),
	).Replace(sql)
}

// Migrate brings the store's table up to date: it creates the schema (if
// one was named with [WithSchema] and it does not exist), the table, its
// indexes and its migrations table, and applies the migrations the
// database has not seen. It is what [Open] and [New] do unless
// [WithMigrate] turned it off, and is safe to run from many processes at
// once: the migrations run in one transaction holding an advisory lock
// (pg_advisory_xact_lock) derived from the schema and table names. When
// the database is already up to date it only reads the migrations table.
//
// A database migrated by a newer version of this package (with
// migrations this one does not know) is left as it is: migrations only
// add, so older versions keep working on it.
func (s *Store) Migrate(ctx context.Context) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	return migrate(ctx, s.pool, s.names)
}

func migrate(ctx context.Context, pool *pgxpool.Pool, n names) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	latest := ms[len(ms)-1].version
	// Fast path, without a lock or DDL: already up to date.
	if v, err := currentVersion(ctx, pool, n); err == nil && v >= latest {
		return nil
	}

	tx, err := pool.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return fmt.Errorf("pgstore: migrating %s: %w", n.qtable, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	fail := func(what string, err error) error {
		return fmt.Errorf("pgstore: migrating %s: %s: %w", n.qtable, what, err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", n.lockKey); err != nil {
		return fail("taking the migration lock", err)
	}
	if n.schema != "" {
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", n.schema).Scan(&exists); err != nil {
			return fail("looking up the schema", err)
		}
		if !exists {
			if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{n.schema}.Sanitize()); err != nil {
				return fail("creating the schema", err)
			}
		}
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+n.qversions+` (
	version    integer PRIMARY KEY,
	name       text NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`); err != nil {
		return fail("creating the migrations table", err)
	}
	var cur int
	if err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+n.qversions).Scan(&cur); err != nil {
		return fail("reading the version", err)
	}
	for _, m := range ms {
		if m.version <= cur {
			continue
		}
		if _, err := tx.Exec(ctx, n.render(m.sql)); err != nil {
			return fail(m.name, err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+n.qversions+" (version, name) VALUES ($1, $2)", m.version, m.name); err != nil {
			return fail("recording "+m.name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fail("commit", err)
	}
	return nil
}

// currentVersion returns the latest migration applied to n's table, 0 if
// the migrations table does not exist.
func currentVersion(ctx context.Context, pool *pgxpool.Pool, n names) (int, error) {
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", n.qversions).Scan(&exists); err != nil {
		return 0, err
	}
	if !exists {
		return 0, nil
	}
	var v int
	err := pool.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+n.qversions).Scan(&v)
	return v, err
}

// ErrNoTable is wrapped by the error of a call on a store whose table does
// not exist: opened with [WithMigrate](false) before the migrations ran, or
// with a mistyped schema or table name.
var ErrNoTable = errors.New("pgstore: the record table does not exist")
