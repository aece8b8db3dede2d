package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/pgstore"
	"github.com/idemkit/idem/store/sqlitestore"
)

// fillQueues publishes to two queues and dead-letters two messages of
// "orders": orders has 1 ready, 1 in flight, 1 delayed and 2 dead letters;
// mail has 1 ready. It returns the dead letters' ids, oldest first.
func fillQueues(t *testing.T, orders, mail interface {
	queue.Source
	queue.Publisher
}) (dead []string) {
	t.Helper()
	ctx := context.Background()
	for _, b := range []string{"o1", "o2", "o3", "o4"} {
		if _, err := orders.Publish(ctx, queue.Outgoing{Body: []byte(b)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := orders.Publish(ctx, queue.Outgoing{Body: []byte("later"), Delay: 1 << 40}); err != nil {
		t.Fatal(err)
	}
	if _, err := mail.Publish(ctx, queue.Outgoing{Body: []byte("m1")}); err != nil {
		t.Fatal(err)
	}
	ds, err := orders.Receive(ctx, 3)
	if err != nil || len(ds) != 3 {
		t.Fatalf("receive: %d, %v", len(ds), err)
	}
	for _, d := range ds[:2] {
		if err := d.DeadLetter(ctx, "poison"); err != nil {
			t.Fatal(err)
		}
		dead = append(dead, d.Message().ID)
	}
	return dead
}

func checkQueueCommands(t *testing.T, store string, dead []string, extra ...string) {
	ctx := context.Background()
	args := func(a ...string) []string { return append(append([]string{"--store", store}, a...), extra...) }
	r := idemRun(ctx, args("queue", "stats")...)
	r.expect(t, 0, "QUEUE", "IN FLIGHT")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), "mail 1 0 0 0") ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[2]), " "), "orders 1 1 1 2") {
		t.Fatalf("queue stats:\n%s", r)
	}
	idemRun(ctx, args("queue", "stats", "--queue", "orders", "--json")...).
		expect(t, 0, `"queue":"orders","ready":1,"in_flight":1,"delayed":1,"dead_lettered":2`)
	idemRun(ctx, args("queue", "redrive", "--queue", "orders", "--limit", "1")...).
		expect(t, 0, "queue orders: 1 of 2 dead letters redriven")
	// --limit moved the oldest; --id moves the one named, and only once.
	idemRun(ctx, args("queue", "redrive", "--queue", "orders", "--id", dead[0])...).
		expectErr(t, 1, "queue orders has no dead letter "+dead[0])
	idemRun(ctx, args("queue", "redrive", "--id", dead[1])...).expectErr(t, 2, "--id needs --queue")
	idemRun(ctx, args("queue", "redrive", "--queue", "orders", "--id", "x1")...).expectErr(t, 2, "not a message id")
	idemRun(ctx, args("queue", "redrive", "--queue", "orders", "--id", dead[1], "--json")...).
		expect(t, 0, `{"queue":"orders","redriven":1`)
	idemRun(ctx, args("queue", "redrive")...).expect(t, 0, "no queue has dead letters")
	idemRun(ctx, args("queue", "stats", "--queue", "orders", "--json")...).
		expect(t, 0, `"ready":3,"in_flight":1,"delayed":1,"dead_lettered":0`)
	idemRun(ctx, args("queue", "redrive", "--limit", "-1")...).expectErr(t, 2, "--limit")
	idemRun(ctx, args("queue", "purge")...).expectErr(t, 2, "unknown subcommand")
	idemRun(ctx, "queue", "stats", "--help").expect(t, 0, "Usage: idem [--store URL] queue stats", "--queue Q")
}

func TestQueueCommandsSQLite(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	st, err := sqlitestore.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	// Without queue tables: an error that says so.
	idemRun(ctx, "--store", "sqlite:"+path, "queue", "stats").expectErr(t, 1, "no queue tables")
	qs, err := sqlqueue.NewSQLite(ctx, st.DB())
	if err != nil {
		t.Fatal(err)
	}
	orders, _ := qs.Queue("orders")
	mail, _ := qs.Queue("mail")
	dead := fillQueues(t, orders, mail)
	qs.Close()
	st.Close()
	checkQueueCommands(t, "sqlite:"+path, dead)
	idemRun(ctx, "--store", "mem:", "queue", "stats").expectErr(t, 1, "keeps no queues")
}

func TestQueueCommandsPostgres(t *testing.T) {
	ctx := context.Background()
	schema := newPostgresSchema(t)
	u := postgresURL(t, schema, "")
	pool, err := pgxpool.New(ctx, testPostgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// The store's table must exist for the command to open the store.
	if _, err := pgstore.New(ctx, pool, pgstore.WithSchema(schema)); err != nil {
		t.Fatal(err)
	}
	idemRun(ctx, "--store", u, "queue", "stats").expectErr(t, 1, "no queue tables")
	qs, err := sqlqueue.NewPostgres(ctx, pool, sqlqueue.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	defer qs.Close()
	orders, _ := qs.Queue("orders")
	mail, _ := qs.Queue("mail")
	dead := fillQueues(t, orders, mail)
	checkQueueCommands(t, u, dead)
}
