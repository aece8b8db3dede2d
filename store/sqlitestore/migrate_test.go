package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/idem/store"
)

// fileState is what WithMigrate(false) must leave as it found: the tables
// of the file, its journal mode and the store's schema version.
func fileState(t *testing.T, path string) (tables []string, mode string, version int) {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, n)
	}
	rows.Close()
	if err := db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(tables, "idem_migrations") {
		if err := db.QueryRow(`SELECT COALESCE(MAX(version), 0) FROM idem_migrations WHERE component = ?`, component).Scan(&version); err != nil {
			t.Fatal(err)
		}
	}
	return tables, mode, version
}

// TestWithMigrateFalse: Open with WithMigrate(false) refuses, with an
// error wrapping ErrNotMigrated and without changing the file, a missing
// file, another program's database (no idem tables, journal mode DELETE)
// and a store at an older schema version; it opens a current store and
// works on it.
func TestWithMigrateFalse(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()

	missing := filepath.Join(dir, "missing.db")
	if s, err := Open(ctx, missing, WithMigrate(false)); err == nil {
		s.Close()
		t.Fatal("Open(WithMigrate(false)) opened a file that does not exist")
	} else if !errors.Is(err, ErrNotMigrated) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v, want ErrNotMigrated and fs.ErrNotExist", err)
	}
	if _, err := os.Stat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open(WithMigrate(false)) created %s: %v", missing, err)
	}

	foreign := filepath.Join(dir, "app.db")
	db, err := sql.Open("sqlite", foreign)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if s, err := Open(ctx, foreign, WithMigrate(false)); err == nil {
		s.Close()
		t.Error("Open(WithMigrate(false)) opened a file without an idem store")
	} else if !errors.Is(err, ErrNotMigrated) {
		t.Errorf("foreign file: %v, want ErrNotMigrated", err)
	}
	if tables, mode, _ := fileState(t, foreign); !slices.Equal(tables, []string{"orders"}) || mode != "delete" {
		t.Errorf("foreign file after Open(WithMigrate(false)): tables %v, journal mode %s; want [orders], delete", tables, mode)
	}

	// A store at schema 1, as a build from before migration 002 left it.
	old := filepath.Join(dir, "old.db")
	s, err := Open(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	db, err = sql.Open("sqlite", old)
	if err != nil {
		t.Fatal(err)
	}
	downgrade(t, db, 1)
	db.Close()
	if s, err := Open(ctx, old, WithMigrate(false)); err == nil {
		s.Close()
		t.Error("Open(WithMigrate(false)) opened a store at an older schema")
	} else if !errors.Is(err, ErrNotMigrated) {
		t.Errorf("schema 1: %v, want ErrNotMigrated", err)
	}
	if _, _, v := fileState(t, old); v != 1 {
		t.Errorf("Open(WithMigrate(false)) migrated schema 1 to %d", v)
	}

	// A current store opens, reads and writes.
	cur := filepath.Join(dir, "idem.db")
	if s, err = Open(ctx, cur); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(ctx, cur, WithMigrate(false))
	if err != nil {
		t.Fatalf("Open(WithMigrate(false)) on a current store: %v", err)
	}
	defer s.Close()
	if _, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "w", Lease: time.Minute, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}
}

// downgrade takes the store in db back to schema version to, as the build
// of that version left it, undoing the later migrations (the rows keep
// what the older columns say).
func downgrade(t testing.TB, db *sql.DB, to int) {
	t.Helper()
	undo := map[int][]string{
		4: {`DROP TRIGGER idem_records_fence_floor`, `DROP TABLE idem_fence_floor`},
		3: {`ALTER TABLE idem_records DROP COLUMN attempt_id`},
		2: {`ALTER TABLE idem_records DROP COLUMN correlation`},
	}
	var current int
	if err := db.QueryRow(`SELECT MAX(version) FROM idem_migrations WHERE component = ?`, component).Scan(&current); err != nil {
		t.Fatal(err)
	}
	if _, ok := undo[current]; !ok && current > to {
		t.Fatalf("downgrade: no undo for schema version %d", current)
	}
	for v := current; v > to; v-- {
		for _, q := range undo[v] {
			if _, err := db.Exec(q); err != nil {
				t.Fatalf("downgrade from %d: %s: %v", v, q, err)
			}
		}
		if _, err := db.Exec(`DELETE FROM idem_migrations WHERE component = ? AND version = ?`, component, v); err != nil {
			t.Fatal(err)
		}
	}
}
