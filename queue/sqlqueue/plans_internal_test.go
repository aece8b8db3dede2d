package sqlqueue

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

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
