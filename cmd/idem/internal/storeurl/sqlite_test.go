package storeurl

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem/store/sqlitestore"
)

func TestOpenSQLiteErrors(t *testing.T) {
	for raw, want := range map[string]string{
		"sqlite:":                      "no database file",
		"sqlite:/nonexistent/dir/x.db": "no database file /nonexistent/dir/x.db",
	} {
		s, err := New().Open(context.Background(), raw, Options{MustExist: true})
		if err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", raw)
		} else if !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%q) = %v, want it to mention %q", raw, err, want)
		}
	}
}

func TestOpenSQLite(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	o := New()
	for _, raw := range []string{
		"sqlite:" + filepath.Join(dir, "a.db"),
		"sqlite://" + filepath.Join(dir, "b.db"), // absolute: sqlite:///tmp/...
		"SQLite:" + filepath.Join(dir, "c.db"),
	} {
		s, err := o.Open(ctx, raw, Options{})
		if err != nil {
			t.Fatalf("Open(%q): %v", raw, err)
		}
		if _, err := s.Now(ctx); err != nil {
			t.Errorf("%q: Now: %v", raw, err)
		}
		s.Close()
		// Now it exists, MustExist opens it.
		s, err = o.Open(ctx, raw, Options{MustExist: true})
		if err != nil {
			t.Fatalf("Open(%q, MustExist): %v", raw, err)
		}
		s.Close()
	}
	if got := SQLitePath("//rel/x.db"); got != "rel/x.db" {
		t.Errorf("SQLitePath(//rel/x.db) = %q", got)
	}
	if got := SQLitePath("///abs/x.db"); got != "/abs/x.db" {
		t.Errorf("SQLitePath(///abs/x.db) = %q", got)
	}
}

// TestOpenSQLiteMustExistNeverMigrates: with MustExist a file that holds
// no idem store, or a store at an older schema, is refused and left as it
// was (no tables created, no migration, journal mode unchanged).
func TestOpenSQLiteMustExistNeverMigrates(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	query := func(path, q string) string {
		t.Helper()
		db, err := sql.Open("sqlite", path)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var v string
		if err := db.QueryRow(q).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	exec := func(path string, qs ...string) {
		t.Helper()
		db, err := sql.Open("sqlite", path)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		for _, q := range qs {
			if _, err := db.Exec(q); err != nil {
				t.Fatal(err)
			}
		}
	}
	const tables = `SELECT group_concat(name) FROM (SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name)`

	app := filepath.Join(dir, "app.db")
	exec(app, `CREATE TABLE orders (id INTEGER PRIMARY KEY)`)
	if s, err := New().Open(ctx, "sqlite:"+app, Options{MustExist: true}); err == nil {
		s.Close()
		t.Error("opened another program's database as a store")
	} else if !errors.Is(err, sqlitestore.ErrNotMigrated) || !strings.Contains(err.Error(), "no tables idem_records") ||
		!strings.Contains(err.Error(), "neither creates nor migrates") {
		t.Errorf("another program's database: %v", err)
	}
	if got := query(app, tables); got != "orders" {
		t.Errorf("tables after Open: %s", got)
	}
	if got := query(app, `PRAGMA journal_mode`); got != "delete" {
		t.Errorf("journal mode after Open: %s", got)
	}

	old := filepath.Join(dir, "idem.db")
	s, err := sqlitestore.Open(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	// Undo migrations 004 (the fence floor), 003 (attempt_id) and 002
	// (correlation): a store as a schema-1 build left it.
	exec(old, `DROP TRIGGER idem_records_fence_floor`, `DROP TABLE idem_fence_floor`,
		`ALTER TABLE idem_records DROP COLUMN attempt_id`, `ALTER TABLE idem_records DROP COLUMN correlation`,
		`DELETE FROM idem_migrations WHERE component = 'sqlitestore' AND version > 1`)
	if s, err := New().Open(ctx, "sqlite:"+old, Options{MustExist: true}); err == nil {
		s.Close()
		t.Error("opened a store at schema 1")
	} else if !errors.Is(err, sqlitestore.ErrNotMigrated) || !strings.Contains(err.Error(), "schema version 1") {
		t.Errorf("schema 1: %v", err)
	}
	if got := query(old, `SELECT MAX(version) FROM idem_migrations`); got != "1" {
		t.Errorf("Open migrated the store to version %s", got)
	}
}
