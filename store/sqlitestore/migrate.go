package sqlitestore

import (
	"context"
	"database/sql"
	"embed"
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

// migrate brings the schema up to date (see migrations.ApplySQLite); a
// schema newer than this build is refused.
func migrate(ctx context.Context, db *sql.DB, now time.Time, log *slog.Logger) error {
	ms, err := embedded.Load(migrationFiles, "migrations", component)
	if err != nil {
		return err
	}
	return embedded.ApplySQLite(ctx, db, component, ms, now.UnixMicro(), false, log)
}
