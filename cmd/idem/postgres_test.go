package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/pgstore"
)

// envPostgres names the PostgreSQL database the tests use; without it the
// PostgreSQL subtests are skipped.
const envPostgres = "IDEM_TEST_POSTGRES"

// testPostgres returns the test database's URL, or skips t.
func testPostgres(t *testing.T) string {
	t.Helper()
	u := os.Getenv(envPostgres)
	if u == "" {
		t.Skip("set " + envPostgres + "=postgres://postgres@127.0.0.1:5432/test?sslmode=disable to run the command tests on PostgreSQL")
	}
	return u
}

// pgConnect returns a connection to the test database, closed when t ends.
func pgConnect(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), testPostgres(t))
	if err != nil {
		t.Fatalf("connecting to %s: %v", envPostgres, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// newPostgresSchema creates a schema of t's own on the test database and
// drops it, with the tables in it, when t ends.
func newPostgresSchema(t *testing.T) string {
	t.Helper()
	conn := pgConnect(t)
	var b [6]byte
	rand.Read(b[:])
	schema := "idemcmd_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(context.Background(), "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("creating schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	return schema
}

// postgresURL returns the test database's URL naming the store table in
// schema, with further query parameters kv (key, value, ...).
func postgresURL(t *testing.T, schema, table string, kv ...string) string {
	t.Helper()
	u, err := url.Parse(testPostgres(t))
	if err != nil {
		t.Fatalf("%s is not a URL: %v", envPostgres, err)
	}
	q := u.Query()
	q.Set(pgstore.ParamSchema, schema)
	q.Set(pgstore.ParamTable, table)
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// openPostgres is the PostgreSQL backend of the command tests: a fresh
// table in a schema of the test's own, which the commands open by its
// postgres:// URL (so they go through the scheme and its MustExist
// check).
//
// The store's clock is the server's statement_timestamp(). To put it on
// clk, the schema holds a function of that name returning clk's time (kept
// in a one-row table that Advance updates), and the URL puts the schema
// before pg_catalog in the connection's search_path, where pgstore's
// unqualified calls find it first.
func openPostgres(t *testing.T, clk *clock) (store.Store, string) {
	t.Helper()
	ctx := context.Background()
	schema := newPostgresSchema(t)
	conn := pgConnect(t)
	qclock := pgx.Identifier{schema, "test_clock"}.Sanitize()
	for _, stmt := range []string{
		"CREATE TABLE " + qclock + " (t timestamptz NOT NULL)",
		"INSERT INTO " + qclock + " VALUES ('" + clk.Now().Format(time.RFC3339Nano) + "')",
		"CREATE FUNCTION " + pgx.Identifier{schema, "statement_timestamp"}.Sanitize() +
			"() RETURNS timestamptz LANGUAGE sql STABLE AS 'SELECT t FROM " + strings.ReplaceAll(qclock, "'", "''") + "'",
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("making the test clock: %v", err)
		}
	}
	clk.onSet = func(now time.Time) {
		if _, err := conn.Exec(ctx, "UPDATE "+qclock+" SET t = $1", now); err != nil {
			t.Fatalf("advancing the test clock: %v", err)
		}
	}
	u := postgresURL(t, schema, "receipt_keys", "search_path", schema+",pg_catalog")
	s, err := pgstore.Open(ctx, u)
	if err != nil {
		t.Fatalf("pgstore.Open: %v", err)
	}
	if now, err := s.Now(ctx); err != nil || !now.Equal(clk.Now()) {
		t.Fatalf("the store's clock is %v (%v), want the test's %v", now, err, clk.Now())
	}
	return s, u
}

// TestPostgresURL opens a postgres:// store as an operator's command does:
// an existing table only.
func TestPostgresURL(t *testing.T) {
	ctx := context.Background()
	schema := newPostgresSchema(t)
	missing := postgresURL(t, schema, "nope")
	for _, args := range [][]string{{"ls"}, {"inspect", "k"}, {"sweep"}, {"release", "k"}} {
		r := idemRun(ctx, append([]string{"--store", missing}, args...)...)
		r.expectErr(t, 1, `no table "`+schema+`"."nope" in the database`)
	}
	var exists bool
	if err := pgConnect(t).QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{schema, "nope"}.Sanitize()).Scan(&exists); err != nil || exists {
		t.Errorf("an operator's command created the table (%v)", err)
	}

	// The workers' store creates the table; then the commands open it,
	// whichever way the scheme is spelt.
	u := postgresURL(t, schema, "keys")
	s, err := pgstore.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	res, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "receipt:1:7", Owner: "w1", Lease: time.Minute, Retention: time.Hour})
	if err != nil || !res.Acquired {
		t.Fatalf("claim: %v %+v", err, res)
	}
	if err := s.Finish(ctx, store.FinishRequest{Key: "receipt:1:7", Fence: res.Record.Fence, AttemptID: res.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("ses-1"), Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	rest := strings.TrimPrefix(u, "postgres:")
	for _, scheme := range []string{"postgres", "postgresql", "PostgreSQL"} {
		idemRun(ctx, "--store", scheme+":"+rest, "inspect", "receipt:1:7").expect(t, 0, `"ses-1" (5 bytes)`, "status       completed")
	}
	idemRun(ctx, "--store", u, "inspect", "nope").expectErr(t, 3, "no record")
}
