package migrations

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
)

// ApplySQLite brings component's schema in the SQLite database db up to
// ms, recording each migration in idem_migrations (one table for every
// idem package that keeps tables in the file, a version per component). It
// runs in one IMMEDIATE transaction, so two processes that open a fresh
// file at once take turns: the second finds the migrations applied and
// does nothing. appliedAt is stored with each row (the caller's clock, in
// microseconds).
//
// A schema newer than ms (a newer build migrated the file) is an error
// unless allowNewer: a component whose migrations only add tables and
// columns lets an older build work on it.
func ApplySQLite(ctx context.Context, db *sql.DB, component string, ms []Migration, appliedAt int64, allowNewer bool, log *slog.Logger) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("%s: migrate: %w", component, err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("%s: migrate: %w", component, err)
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
		return fmt.Errorf("%s: migrate: %w", component, err)
	}
	var current int
	if err := conn.QueryRowContext(ctx,
		`SELECT COALESCE(MAX(version), 0) FROM idem_migrations WHERE component = ?`, component).Scan(&current); err != nil {
		return fmt.Errorf("%s: migrate: %w", component, err)
	}
	if current > len(ms) {
		if !allowNewer {
			return fmt.Errorf("%s: the database's schema is version %d, newer than this build knows (%d)", component, current, len(ms))
		}
		current = len(ms)
	}
	for _, m := range ms[current:] {
		if _, err := conn.ExecContext(ctx, m.SQL); err != nil {
			return fmt.Errorf("%s: migration %s: %w", component, m.Name, err)
		}
		if _, err := conn.ExecContext(ctx,
			`INSERT INTO idem_migrations (component, version, name, applied_at) VALUES (?, ?, ?, ?)`,
			component, m.Version, m.Name, appliedAt); err != nil {
			return fmt.Errorf("%s: migration %s: %w", component, m.Name, err)
		}
		log.Info(component+": applied migration", "migration", m.Name)
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return fmt.Errorf("%s: migrate: %w", component, err)
	}
	committed = true
	return nil
}
