package sqlitestore

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"log/slog"
	"time"

	embedded "github.com/idemkit/idem/internal/migrations"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// component names this package's rows in idem_migrations; other idem
// packages that keep tables in the same file (an embedded queue) keep their
// own version under their own name.
const component = "sqlitestore"

type migration struct {
	version int
	name    string
	sql     string
}

// migrations returns the embedded migrations in version order. File names
// are NNN_description.sql, numbered from 1 without gaps.
func migrations() ([]migration, error) {
	loaded, err := embedded.Load(migrationFiles, "migrations", "sqlitestore")
	if err != nil {
		return nil, err
	}
	ms := make([]migration, len(loaded))
	for i, m := range loaded {
		ms[i] = migration{version: m.Version, name: m.Name, sql: m.SQL}
	}
	return ms, nil
}

// migrate brings the schema up to date. It runs in one IMMEDIATE
// transaction, so two processes that open a fresh file at once take turns:
// the second finds the migrations applied and does nothing.
func migrate(ctx context.Context, db *sql.DB, now time.Time, log *slog.Logger) (err error) {
	ms, err := migrations()
	if err != nil {
		return err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("sqlitestore: migrate: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			conn.ExecContext(context.Background(), "ROLLBACK")
		}
	}()
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS idem_migrations (
	component  TEXT    NOT NULL,
	version    INTEGER NOT NULL,
	name       TEXT    NOT NULL,
	applied_at INTEGER NOT NULL,
	PRIMARY KEY (component, version)
)`); err != nil {
		return fmt.Errorf("sqlitestore: migrate: %w", err)
	}
	var current int
	if err := conn.QueryRowContext(ctx,
		`SELECT COALESCE(MAX(version), 0) FROM idem_migrations WHERE component = ?`, component).Scan(&current); err != nil {
		return fmt.Errorf("sqlitestore: migrate: %w", err)
	}
	if current > len(ms) {
		return fmt.Errorf("sqlitestore: the database's schema is version %d, newer than this build knows (%d)", current, len(ms))
	}
	for _, m := range ms[current:] {
		if _, err := conn.ExecContext(ctx, m.sql); err != nil {
			return fmt.Errorf("sqlitestore: migration %s: %w", m.name, err)
		}
		if _, err := conn.ExecContext(ctx,
			`INSERT INTO idem_migrations (component, version, name, applied_at) VALUES (?, ?, ?, ?)`,
			component, m.version, m.name, now.UnixMicro()); err != nil {
			return fmt.Errorf("sqlitestore: migration %s: %w", m.name, err)
		}
		log.Info("sqlitestore: applied migration", "migration", m.name)
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return fmt.Errorf("sqlitestore: migrate: %w", err)
	}
	committed = true
	return nil
}
