package pgstore

import (
	"context"
	"embed"
	"errors"
	"hash/fnv"
	"strings"

	embedded "github.com/idemkit/idem/internal/migrations"
	"github.com/idemkit/idem/internal/pgmigrations"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrations returns the embedded migrations in version order. File names
// are NNN_description.sql, numbered from 1 without gaps.
func migrations() ([]embedded.Migration, error) {
	return embedded.Load(migrationFiles, "migrations", "pgstore")
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
// add, so older versions keep working on it, as long as the newer
// processes do not write what the older cannot read: see
// [WithImplicitJournal] for the upgrade past schema version 3.
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
	return pgmigrations.Apply(ctx, pool, ms, pgmigrations.Target{
		Component: "pgstore",
		Object:    n.qtable,
		Schema:    n.schema,
		Versions:  n.qversions,
		LockKey:   n.lockKey,
		Render:    n.render,
	})
}

// ErrNoTable is wrapped by the error of a call on a store whose table does
// not exist: opened with [WithMigrate](false) before the migrations ran, or
// with a mistyped schema or table name.
var ErrNoTable = errors.New("pgstore: the record table does not exist")
