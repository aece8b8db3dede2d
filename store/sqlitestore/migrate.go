package sqlitestore

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"time"

	embedded "github.com/idemkit/idem/internal/migrations"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// component names this package's rows in idem_migrations; other idem
// packages that keep tables in the same file (an embedded queue) keep their
// own version under their own name.
const component = "sqlitestore"

// migrate brings the schema up to date (see migrations.ApplySQLite); a
// schema newer than this build is refused.
func migrate(ctx context.Context, db *sql.DB, now time.Time, log *slog.Logger) error {
	ms, err := embedded.Load(migrationFiles, "migrations", component)
	if err != nil {
		return err
	}
	return embedded.ApplySQLite(ctx, db, component, ms, now.UnixMicro(), false, log)
}

// ErrNotMigrated is wrapped by the error of [Open] with [WithMigrate](false)
// on a file that has no idem store at this build's schema version: the
// file does not exist, holds no table idem_records, or its store is at an
// older version (a process of this build opened with migrations on, the
// default, migrates it).
var ErrNotMigrated = errors.New("sqlitestore: no idem store at this build's schema version")

// fileExists refuses, for WithMigrate(false), a path that names no file:
// opening it would create an empty one.
func fileExists(path string) error {
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: %w", ErrNotMigrated, err)
		}
		return err
	}
	return nil
}

// checkSchema refuses, without writing, a database whose store is missing
// or at another schema version than this build's (see WithMigrate).
func checkSchema(ctx context.Context, db *sql.DB) error {
	ms, err := embedded.Load(migrationFiles, "migrations", component)
	if err != nil {
		return err
	}
	var tables int
	if err := db.QueryRowContext(ctx,
		`SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name IN ('idem_records', 'idem_migrations')`).Scan(&tables); err != nil {
		return fmt.Errorf("%s: reading the schema: %w", component, err)
	}
	if tables < 2 {
		return fmt.Errorf("%w: the file has no tables idem_records and idem_migrations", ErrNotMigrated)
	}
	var current int
	if err := db.QueryRowContext(ctx,
		`SELECT COALESCE(MAX(version), 0) FROM idem_migrations WHERE component = ?`, component).Scan(&current); err != nil {
		return fmt.Errorf("%s: reading the schema version: %w", component, err)
	}
	switch {
	case current > len(ms):
		return fmt.Errorf("%s: the database's schema is version %d, newer than this build knows (%d)", component, current, len(ms))
	case current < len(ms):
		return fmt.Errorf("%w: the store is at schema version %d, this build's is %d (once migrated, the older builds that may still use it refuse it)",
			ErrNotMigrated, current, len(ms))
	}
	return nil
}
