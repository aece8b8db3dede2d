package sqlqueue

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/idemkit/idem/store/sqlitestore"
	"github.com/jackc/pgx/v5"
)

// TestSQLiteReceivePlan: the receive reads the groups in flight on their
// partial index. SQLite, without statistics, preferred the range on
// (queue, visible_at) there, which passes every delayed and retried
// message of the queue too: a receive of 10 grouped messages took 100 ms
// beside 200,000 delayed ones, against 1 ms on the partial index.
func TestSQLiteReceivePlan(t *testing.T) {
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	qs, err := NewSQLite(ctx, st.DB(), WithGroupCommit(st)) // every migration
	if err != nil {
		t.Fatal(err)
	}
	defer qs.Close()
	rows, err := st.DB().QueryContext(ctx, "EXPLAIN QUERY PLAN "+sqliteReceive, int64(2e15), int64(1e15), "q", 10)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	plan := strings.Join(lines, "\n")
	if !strings.Contains(plan, "SEARCH f USING INDEX idem_queue_messages_group_in_flight") {
		t.Fatalf("the receive does not read the groups in flight on their index:\n%s", plan)
	}
}

// TestPostgresReceivePlan: on a large queue, the receive's generic plan
// (the one a cached statement soon uses, not knowing how many messages are
// asked for) reads the messages it hands out by index, never the whole
// table.
func TestPostgresReceivePlan(t *testing.T) {
	ctx := context.Background()
	pool, schema, n := pgBefore(t, 1)
	p, err := NewPostgres(ctx, pool, WithSchema(schema)) // every migration
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := pool.Exec(ctx, `INSERT INTO `+n.messages+` (id, queue, body, visible_at, published)
SELECT nextval(`+n.seq+`), 'q', 'x', now(), now() FROM generate_series(1, 20000)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "ANALYZE "+n.messages); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, sql := range []string{"SET plan_cache_mode = force_generic_plan", "PREPARE recv(text, int, bigint) AS " + n.receive} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	defer conn.Exec(ctx, "DEALLOCATE recv; RESET plan_cache_mode")
	rows, err := conn.Query(ctx, "EXPLAIN EXECUTE recv('q', 10, 1000000)")
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	plan := strings.Join(lines, "\n")
	if strings.Contains(plan, "Seq Scan") {
		t.Fatalf("the receive reads the whole table:\n%s", plan)
	}
}

// TestSQLiteLimitsAreNotBoundValues: no statement the queue's writer
// prepares once takes its LIMIT from a bare parameter. SQLite reads the
// value bound to such a parameter when it plans (it marks the statement
// to be prepared again whenever that value changes), and the Consumer asks
// for as many messages as it has free handlers, a different number nearly
// every time: the receive was prepared again on most calls. End to end on
// SQLite (BenchmarkEndToEnd, consumer=256x128, group commit) that was
// about a seventh of the writer's time: 15,173 consumed/s with the bare
// parameter, 17,715 and 18,614 with ?4 + 0, which the planner does not
// read.
func TestSQLiteLimitsAreNotBoundValues(t *testing.T) {
	bare := regexp.MustCompile(`(?i)\bLIMIT\s+\?\d*\s*(\)|$|\bOFFSET\b|;)`)
	for _, q := range sqliteQueries {
		if bare.MatchString(q) {
			t.Errorf("a statement's LIMIT is a bare parameter, so SQLite prepares it again whenever the value changes:\n%s", q)
		}
	}
	if !strings.Contains(sqliteReceive, "LIMIT ?4 + 0") {
		t.Errorf("the receive's limit is not ?4 + 0:\n%s", sqliteReceive)
	}
}
