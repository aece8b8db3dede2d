package main

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/sqlitestore"
)

// openSQLite is the SQLite backend of the command tests: a database file
// on a fake clock, reached through a mem:NAME alias for the store.
func openSQLite(t *testing.T, clk *clock) (store.Store, string) {
	s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"), sqlitestore.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	return s, ""
}

// TestSQLiteURL runs the commands on a database file named by --store, as
// an operator does, on the real clock.
func TestSQLiteURL(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	s, err := sqlitestore.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	claim := func(key string, p idem.Policy, l time.Duration) idem.Record {
		t.Helper()
		res, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: key, Owner: "w1", Correlation: "m-" + key, Policy: p, Lease: l, Retention: time.Hour})
		if err != nil || !res.Acquired {
			t.Fatalf("claim %s: %v %+v", key, err, res)
		}
		return res.Record
	}
	f := claim("receipt:1:7", idem.AtLeastOnce, time.Minute)
	if err := s.Finish(ctx, store.FinishRequest{Key: "receipt:1:7", Fence: f.Fence, AttemptID: f.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("ses-1"), Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	f = claim("old", idem.AtLeastOnce, time.Minute)
	if err := s.Finish(ctx, store.FinishRequest{Key: "old", Fence: f.Fence, AttemptID: f.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("x"), Retention: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	claim("receipt:2:7", idem.AtMostOnce, time.Millisecond)
	claim("receipt:3:7", idem.AtLeastOnce, time.Hour)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)

	for _, url := range []string{"sqlite:" + path, "sqlite://" + path} {
		r := idemRun(ctx, "--store", url, "inspect", "receipt:1:7")
		r.expect(t, 0, `"ses-1" (5 bytes)`, "status       completed")
	}
	r := idemRun(ctx, "--store", "sqlite:"+path, "ls", "--stuck")
	r.expect(t, 0, "receipt:2:7  indeterminate")
	if strings.Contains(r.stdout, "receipt:3:7") {
		t.Errorf("a live lease listed as stuck:\n%s", r)
	}
	idemRun(ctx, "--store", "sqlite:"+path, "release", "receipt:3:7").expectErr(t, 4, "live lease")
	idemRun(ctx, "--store", "sqlite:"+path, "inspect", "old").expectErr(t, 3, "no record")
	idemRun(ctx, "--store", "sqlite:"+path, "explain", "receipt:2:7").expect(t, 0, "waiting for `idem resolve receipt:2:7")
	idemRun(ctx, "--store", "sqlite:"+path, "resolve", "receipt:2:7", "--not-done", "--reason", "bounced").expect(t, 0, "resolved receipt:2:7 as not done")
	idemRun(ctx, "--store", "sqlite:"+path, "sweep").expect(t, 0, "swept 1 expired records in 1 batch")
	r = idemRun(ctx, "--store", "sqlite:"+path, "ls", "--json")
	r.expect(t, 0, `"key":"receipt:1:7"`, `"key":"receipt:2:7","status":"released"`, `"key":"receipt:3:7"`)
	if strings.Count(r.stdout, "\n") != 3 {
		t.Errorf("after sweep:\n%s", r)
	}
}

// TestSQLiteReadOnlyNeverMigrates: a command on an existing SQLite file
// that holds no idem store (a mistyped path to the application's own
// database), or a store at an older schema that older workers still use,
// exits 1 and leaves the file as it was: no idem tables, no migration.
func TestSQLiteReadOnlyNeverMigrates(t *testing.T) {
	ctx := context.Background()
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
	scan := func(path, q string) string {
		t.Helper()
		db, err := sql.Open("sqlite", path)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var v sql.NullString
		if err := db.QueryRow(q).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v.String
	}

	app := filepath.Join(t.TempDir(), "app.db")
	exec(app, `CREATE TABLE orders (id INTEGER PRIMARY KEY)`)
	for _, args := range [][]string{{"ls", "--stuck"}, {"inspect", "k"}, {"sweep"}, {"release", "k"}} {
		r := idemRun(ctx, append([]string{"--store", "sqlite:" + app}, args...)...)
		r.expectErr(t, 1, "no idem store", "no tables idem_records", "neither creates nor migrates")
	}
	if got := scan(app, `SELECT group_concat(name) FROM sqlite_master WHERE type = 'table'`); got != "orders" {
		t.Errorf("a read-only command created tables in the application's database: %s", got)
	}

	old := filepath.Join(t.TempDir(), "idem.db")
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
	idemRun(ctx, "--store", "sqlite:"+old, "ls").expectErr(t, 1, "schema version 1, this build's is 4")
	if got := scan(old, `SELECT MAX(version) FROM idem_migrations WHERE component = 'sqlitestore'`); got != "1" {
		t.Errorf("idem ls migrated the workers' store from schema 1 to %s", got)
	}
}
