package sqlqueue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/migrations"
	"github.com/idemkit/idem/internal/pgmigrations"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store/sqlitestore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// sqliteBefore003 returns a store (closed when t ends) whose database
// holds the queue tables as migrations 001 – 002 left them.
func sqliteBefore003(t *testing.T) *sqlitestore.Store {
	t.Helper()
	return sqliteBefore(t, 3)
}

// sqliteBefore is sqliteBefore003 for the migrations before version.
func sqliteBefore(t *testing.T, version int) *sqlitestore.Store {
	t.Helper()
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ms, err := migrations.Load(migrationFiles, "migrations/sqlite", "sqlqueue")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) < version {
		t.Fatalf("%d migrations, want %03d", len(ms), version)
	}
	if err := migrations.ApplySQLite(ctx, st.DB(), sqliteComponent, ms[:version-1], time.Now().UnixMicro(), false, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	return st
}

// pgBefore003 returns a pool and a schema of t's own (dropped when t
// ends) that holds the queue tables as migrations 001 – 002 left them,
// and the schema's names.
func pgBefore003(t *testing.T) (*pgxpool.Pool, string, pgNames) {
	t.Helper()
	return pgBefore(t, 3)
}

// pgBefore is pgBefore003 for the migrations before version.
func pgBefore(t *testing.T, version int) (*pgxpool.Pool, string, pgNames) {
	t.Helper()
	u := testenv.Require(t, testenv.Postgres, "the PostgreSQL queue tests")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	schema := fmt.Sprintf("sqlqueue_before%03d_%d", version, time.Now().UnixNano())
	t.Cleanup(func() {
		pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	ms, err := migrations.Load(migrationFiles, "migrations/postgres", "sqlqueue")
	if err != nil {
		t.Fatal(err)
	}
	n := newPGNames(schema)
	if err := pgmigrations.Apply(ctx, pool, ms[:version-1], pgmigrations.Target{
		Component: "sqlqueue", Object: n.messages, Schema: schema, Versions: n.versions, LockKey: n.lockKey, Render: n.render,
	}); err != nil {
		t.Fatal(err)
	}
	return pool, schema, n
}

// TestSQLiteMigrateHeld: migration 003 holds the messages of a populated
// table that are not their group's head (in flight, delayed or waiting
// heads stay as they were), and the queue then hands each group out in
// id order.
func TestSQLiteMigrateHeld(t *testing.T) {
	ctx := context.Background()
	st := sqliteBefore003(t)
	db := st.DB()
	now := time.Now().UnixMicro()
	// Group a: a1 in flight, a2 and a3 waiting. Group b: b1 delayed, b2
	// waiting. Group c: c1 waiting alone. n1 ungrouped.
	hour := int64(time.Hour / time.Microsecond)
	for _, r := range []struct {
		body, group string
		visible     int64
		receipt     any
	}{
		{"a1", "a", now + hour, 42},
		{"a2", "a", now - 2, nil},
		{"b1", "b", now + hour, nil},
		{"a3", "a", now - 1, nil},
		{"b2", "b", now - 1, nil},
		{"c1", "c", now - 1, nil},
		{"n1", "", now - 1, nil},
	} {
		var group any
		if r.group != "" {
			group = r.group
		}
		if _, err := db.Exec(`INSERT INTO idem_queue_messages (queue, body, group_id, visible_at, receipt, receive_count, published)
VALUES ('q', ?, ?, ?, ?, ?, ?)`, []byte(r.body), group, r.visible, r.receipt, map[bool]int{true: 1}[r.receipt != nil], now); err != nil {
			t.Fatal(err)
		}
	}
	s, err := NewSQLite(ctx, db, WithGroupCommit(st))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	held := map[string]int64{}
	rows, err := db.Query(`SELECT body, held_visible_at FROM idem_queue_messages WHERE held_visible_at IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var b []byte
		var v int64
		if err := rows.Scan(&b, &v); err != nil {
			t.Fatal(err)
		}
		held[string(b)] = v
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	if want := (map[string]int64{"a2": now - 2, "a3": now - 1, "b2": now - 1}); fmt.Sprint(held) != fmt.Sprint(want) {
		t.Fatalf("held after the migration = %v, want %v", held, want)
	}
	q, err := s.Queue("q")
	if err != nil {
		t.Fatal(err)
	}
	receiveAfterMigration(t, q, func() error {
		_, err := db.Exec(`DELETE FROM idem_queue_messages WHERE group_id = 'a' AND receipt = 42`)
		return err
	})
}

// receiveAfterMigration receives from q, filled as the migration tests
// fill it: c1 and n1 first (a1 in flight, b1 delayed, a2 and a3 held),
// then, after ackA1 deletes a1, a2 and a3 in that order.
func receiveAfterMigration(t *testing.T, q queue.Source, ackA1 func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ds, err := q.Receive(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(deliveryBodies(ds)); got != "[c1 n1]" {
		t.Fatalf("receive after the migration = %s, want c1 n1 (a1 in flight, b1 delayed)", got)
	}
	// a1's receipt was set by hand: its ack is a delete.
	if err := ackA1(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"a2", "a3"} {
		ds, err := q.Receive(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(deliveryBodies(ds)); got != "["+want+"]" {
			t.Fatalf("got %s, want %s", got, want)
		}
		if err := ds[0].Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// deliveryBodies returns the deliveries' bodies as strings (the external
// tests' bodies, through export_test.go).
func deliveryBodies(ds []queue.Delivery) []string {
	var out []string
	for _, d := range ds {
		out = append(out, string(d.Message().Body))
	}
	return out
}

// TestPostgresMigrateHeld: as TestSQLiteMigrateHeld, on PostgreSQL.
func TestPostgresMigrateHeld(t *testing.T) {
	ctx := context.Background()
	pool, schema, n := pgBefore003(t)
	for _, r := range []struct {
		body, group string
		visible     string
		receipt     any
	}{
		{"a1", "a", "1 hour", 42},
		{"a2", "a", "-2 seconds", nil},
		{"b1", "b", "1 hour", nil},
		{"a3", "a", "-1 second", nil},
		{"b2", "b", "-1 second", nil},
		{"c1", "c", "-1 second", nil},
		{"n1", "", "-1 second", nil},
	} {
		if _, err := pool.Exec(ctx, `INSERT INTO `+n.messages+` (queue, body, group_id, visible_at, receipt, published)
VALUES ('q', $1, nullif($2, ''), now() + $3::interval, $4, now())`, []byte(r.body), r.group, r.visible, r.receipt); err != nil {
			t.Fatal(err)
		}
	}
	p, err := NewPostgres(ctx, pool, WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rows, err := pool.Query(ctx, `SELECT convert_from(body, 'UTF8') FROM `+n.messages+` WHERE held_visible_at IS NOT NULL ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	held, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(held); got != "[a2 a3 b2]" {
		t.Fatalf("held after the migration = %s, want [a2 a3 b2]", got)
	}
	q, err := p.Queue("q")
	if err != nil {
		t.Fatal(err)
	}
	receiveAfterMigration(t, q, func() error {
		_, err := pool.Exec(ctx, `DELETE FROM `+n.messages+` WHERE group_id = 'a' AND receipt = 42`)
		return err
	})
}

// TestPostgresMigrateHoldOnce: migration 004 makes visible again the
// messages that the hold trigger of migration 003 hid for good (several
// messages of one group published in one transaction): held ones and one
// already released into 2200. The queue then hands each group out in id
// order.
func TestPostgresMigrateHoldOnce(t *testing.T) {
	ctx := context.Background()
	pool, schema, n := pgBefore(t, 4)
	for _, group := range []string{"a", "b"} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for i := 1; i <= 3; i++ {
				if _, err := tx.Exec(ctx, `INSERT INTO `+n.messages+` (id, queue, body, group_id, visible_at, published)
VALUES (nextval(`+n.seq+`), 'q', $1, $2, now(), now())`, []byte(fmt.Sprint(group, i)), group); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Published with delays reaching 2200 (no bound on a delay), a plain
	// message and a group's head: not hidden by the trigger, so left alone.
	for _, group := range []string{"", "late"} {
		if _, err := pool.Exec(ctx, `INSERT INTO `+n.messages+` (id, queue, body, group_id, visible_at, published)
VALUES (nextval(`+n.seq+`), 'q', 'late', nullif($1, ''), now() + interval '200 years', now())`, group); err != nil {
			t.Fatal(err)
		}
	}
	// b1 is done: its delete released b2 into 2200.
	if _, err := pool.Exec(ctx, `DELETE FROM `+n.messages+` WHERE body = 'b1'`); err != nil {
		t.Fatal(err)
	}
	var hidden int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+n.messages+`
WHERE visible_at = '2200-01-01 00:00:00+00' AND coalesce(held_visible_at, visible_at) = '2200-01-01 00:00:00+00'`).Scan(&hidden); err != nil || hidden != 4 {
		t.Fatalf("before migration 004, %d messages hidden for good (%v); want a2, a3, b2, b3", hidden, err)
	}
	p, err := NewPostgres(ctx, pool, WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	q, err := p.Queue("q")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 5 {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ds, err := q.Receive(rctx, 10)
		cancel()
		if err != nil {
			t.Fatalf("receive after %v: %v", got, err)
		}
		for _, d := range ds {
			got = append(got, string(d.Message().Body))
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if ds, err := q.Receive(rctx, 10); len(ds) > 0 {
		t.Fatalf("received %q (%v); the messages delayed past 2200 must wait", ds[0].Message().Body, err)
	}
	var a, b []string
	for _, m := range got {
		if strings.HasPrefix(m, "a") {
			a = append(a, m)
		} else {
			b = append(b, m)
		}
	}
	if fmt.Sprint(a, b) != "[a1 a2 a3] [b2 b3]" {
		t.Fatalf("received %v after migration 004; want each group whole, in order", got)
	}
}

// TestPostgresMigrateHoldOnceRace: a transaction that publishes several
// messages of one group while migration 004 runs commits after it, with
// the new trigger function: nothing is hidden that the migration's repair
// did not see.
func TestPostgresMigrateHoldOnceRace(t *testing.T) {
	ctx := context.Background()
	pool, _, n := pgBefore(t, 4)
	sql, err := migrationFiles.ReadFile("migrations/postgres/004_hold_once.sql")
	if err != nil {
		t.Fatal(err)
	}
	migration, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer migration.Rollback(ctx)
	if _, err := migration.Exec(ctx, n.render(string(sql))); err != nil {
		t.Fatal(err)
	}
	published := make(chan error, 1)
	go func() {
		published <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for i := 1; i <= 3; i++ {
				if _, err := tx.Exec(ctx, `INSERT INTO `+n.messages+` (id, queue, body, group_id, visible_at, published)
VALUES (nextval(`+n.seq+`), 'q', $1, 'g', now(), now())`, []byte(fmt.Sprint(i))); err != nil {
					return err
				}
			}
			return nil
		})
	}()
	select {
	case err := <-published:
		t.Fatalf("the publish committed while the migration ran (%v); it must wait for it", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := migration.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	var hidden int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+n.messages+` WHERE held_visible_at = '2200-01-01 00:00:00+00'`).Scan(&hidden); err != nil || hidden != 0 {
		t.Fatalf("%d messages hidden for good after migration 004 (%v)", hidden, err)
	}
}

// TestSQLiteOlderTables: a handle opened with WithMigrate(false) on tables
// from before migration 003 reports them as ErrNoTables (older than the
// build) where it reads the new column, instead of a bare SQL error.
func TestSQLiteOlderTables(t *testing.T) {
	ctx := context.Background()
	st := sqliteBefore003(t)
	s, err := NewSQLite(ctx, st.DB(), WithMigrate(false))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Stats(ctx); !errors.Is(err, ErrNoTables) {
		t.Fatalf("Stats on tables before migration 003 = %v, want ErrNoTables", err)
	}

	// Before migration 002, the receive's index is missing: the writer
	// cannot prepare it.
	for _, gc := range []bool{false, true} {
		st := sqliteBefore(t, 2)
		opts := []Option{WithMigrate(false)}
		if gc {
			opts = append(opts, WithGroupCommit(st))
		}
		s, err := NewSQLite(ctx, st.DB(), opts...)
		if err == nil {
			q, qerr := s.Queue("q")
			if qerr != nil {
				t.Fatal(qerr)
			}
			_, err = q.Receive(ctx, 1)
			s.Close()
		}
		if !errors.Is(err, ErrNoTables) {
			t.Fatalf("group commit %v: on tables before migration 002 = %v, want ErrNoTables", gc, err)
		}
	}
}

// TestPostgresOlderTablesAndIsolation: as TestSQLiteOlderTables on
// PostgreSQL; and NewPostgres refuses a pool whose transactions default
// to REPEATABLE READ.
func TestPostgresOlderTablesAndIsolation(t *testing.T) {
	ctx := context.Background()
	pool, schema, _ := pgBefore003(t)
	p, err := NewPostgres(ctx, pool, WithSchema(schema), WithMigrate(false))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Stats(ctx); !errors.Is(err, ErrNoTables) {
		t.Fatalf("Stats on tables before migration 003 = %v, want ErrNoTables", err)
	}

	cfg, err := pgxpool.ParseConfig(os.Getenv(testenv.Postgres))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	rr, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rr.Close()
	if _, err := NewPostgres(ctx, rr, WithSchema(schema)); !errors.Is(err, ErrIsolation) {
		t.Fatalf("NewPostgres on a REPEATABLE READ pool = %v, want ErrIsolation", err)
	}
}
