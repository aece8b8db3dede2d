package pgmigrations

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/migrations"
	"github.com/idemkit/idem/internal/testenv"
)

func testPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	url := testenv.Require(t, testenv.Postgres, "the PostgreSQL migration tests")
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// target returns a Target in a schema of t's own (not created yet; dropped
// when t ends) whose migrations fill {{t}} with a table in it.
func target(t *testing.T, pool *pgxpool.Pool, log *slog.Logger) Target {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "pgmigrations_test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	table := pgx.Identifier{schema, "things"}.Sanitize()
	return Target{
		Component: "test",
		Object:    table,
		Schema:    schema,
		Versions:  pgx.Identifier{schema, "things_migrations"}.Sanitize(),
		LockKey:   int64(b[0])<<40 | int64(b[1])<<32 | int64(b[2])<<24 | int64(b[3])<<16 | int64(b[4])<<8 | int64(b[5]),
		Render:    strings.NewReplacer("{{t}}", table).Replace,
		Log:       log,
	}
}

var twoMigrations = []migrations.Migration{
	{Version: 1, Name: "001_create.sql", SQL: "CREATE TABLE {{t}} (id integer PRIMARY KEY)"},
	{Version: 2, Name: "002_column.sql", SQL: "ALTER TABLE {{t}} ADD COLUMN name text"},
}

func versions(t *testing.T, pool *pgxpool.Pool, tg Target) (n, latest int) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), "SELECT count(*), coalesce(max(version), 0) FROM "+tg.Versions).Scan(&n, &latest); err != nil {
		t.Fatal(err)
	}
	return n, latest
}

// TestApply: a fresh schema gets its schema, table and versions; Apply
// again, an upgrade, and many processes at once apply each migration once;
// a database a newer build migrated is left as it is.
func TestApply(t *testing.T) {
	ctx := context.Background()
	pool := testPool(t)
	var logged bytes.Buffer
	tg := target(t, pool, slog.New(slog.NewTextHandler(&logged, nil)))

	if err := Apply(ctx, pool, twoMigrations[:1], tg); err != nil {
		t.Fatalf("Apply on a fresh schema: %v", err)
	}
	if n, v := versions(t, pool, tg); n != 1 || v != 1 {
		t.Fatalf("after the first migration: %d versions, latest %d", n, v)
	}
	if !strings.Contains(logged.String(), "test: applied migration") || !strings.Contains(logged.String(), "001_create.sql") {
		t.Errorf("log: %q, want the applied migration", logged.String())
	}

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() { errs <- Apply(ctx, pool, twoMigrations, tg) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent Apply: %v", err)
		}
	}
	if n, v := versions(t, pool, tg); n != 2 || v != 2 {
		t.Fatalf("after the upgrade: %d versions, latest %d", n, v)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+tg.Object+" (id, name) VALUES (1, 'x')"); err != nil {
		t.Fatalf("the migrated table: %v", err)
	}

	// Newer than this build: left as it is.
	if err := Apply(ctx, pool, twoMigrations[:1], tg); err != nil {
		t.Fatalf("Apply of fewer migrations than applied: %v", err)
	}
	if n, v := versions(t, pool, tg); n != 2 || v != 2 {
		t.Fatalf("after Apply of fewer migrations: %d versions, latest %d", n, v)
	}
}

// TestApplyError: a failing migration is rolled back whole and named.
func TestApplyError(t *testing.T) {
	ctx := context.Background()
	pool := testPool(t)
	tg := target(t, pool, nil)
	bad := append(twoMigrations[:1:1], migrations.Migration{Version: 2, Name: "002_bad.sql", SQL: "ALTER TABLE {{t}} ADD COLUMN"})
	err := Apply(ctx, pool, bad, tg)
	if err == nil || !strings.Contains(err.Error(), "test: migrating "+tg.Object+": 002_bad.sql: ") {
		t.Fatalf("Apply with a bad migration: %v, want an error naming it", err)
	}
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", tg.Versions).Scan(&exists); err != nil || exists {
		t.Fatalf("after the failed Apply: migrations table exists %v (%v), want nothing left", exists, err)
	}
}
