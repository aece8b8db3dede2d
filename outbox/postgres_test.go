package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testlog"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestPostgresOutbox: on PostgreSQL the application's pgx.Tx writes the
// order and its outbox message together (a rollback writes neither); a
// relay that dies before its acks leaves the messages to a restarted one,
// which republishes them with the same dedup ids; the target holds one
// copy of each and the consumer runs each effect once.
func TestPostgresOutbox(t *testing.T) {
	url := testenv.Require(t, testenv.Postgres, "the PostgreSQL outbox test")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "outbox_test_" + hex.EncodeToString(b[:])
	ident := pgx.Identifier{schema}.Sanitize()
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+ident+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+ident+"; CREATE TABLE "+ident+".orders (id text PRIMARY KEY, total int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	qs, err := sqlqueue.NewPostgres(ctx, pool, sqlqueue.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qs.Close() })
	const vis = time.Second
	ob, err := qs.Queue("outbox", sqlqueue.WithVisibility(vis))
	if err != nil {
		t.Fatal(err)
	}

	placeOrder := func(id string, commit bool) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, "INSERT INTO "+ident+".orders(id, total) VALUES ($1, 100)", id); err != nil {
			t.Fatal(err)
		}
		if _, err := outbox.PublishTx(ctx, ob, tx, idem.Key("order-placed", id), queue.Outgoing{Body: []byte("order placed " + id)}); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range 3 {
		placeOrder(fmt.Sprint("o", i), true)
	}
	placeOrder("rolled-back", false)
	var orders int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+ident+".orders").Scan(&orders); err != nil || orders != 3 {
		t.Fatalf("%d orders (%v), want 3", orders, err)
	}
	if st := stats(t, ob); st.Ready != 3 {
		t.Fatalf("outbox: %+v, want 3 ready", st)
	}

	tg := openTarget(t, "")
	doomed, err := outbox.NewRelay(crashingSource{ob}, tg.q, outbox.WithPublishTimeout(vis/2), outbox.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := doomed.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	var log testlog.Buffer
	r, err := outbox.NewRelay(ob, tg.q, outbox.WithPublishTimeout(vis/2), outbox.WithLogger(debugLog(&log)))
	if err != nil {
		t.Fatal(err)
	}
	if n := drainUntilEmpty(t, r, ob); n != 3 {
		t.Fatalf("the restarted relay relayed %d, want 3", n)
	}
	if got := strings.Count(log.String(), "duplicate=true"); got != 3 {
		t.Fatalf("%d duplicates logged, want 3:\n%s", got, log.String())
	}
	if st := stats(t, ob); st != (sqlqueue.Stats{Queue: "outbox"}) {
		t.Fatalf("outbox after the relay: %+v, want empty", st)
	}
	if st := stats(t, tg.q); st.Ready != 3 {
		t.Fatalf("target: %+v, want 3 ready", st)
	}
	effects := tg.consume(t)
	for i := range 3 {
		if k := idem.Key("order-placed", fmt.Sprint("o", i)).String(); effects[k] != 1 {
			t.Fatalf("effects %v: %s ran %d times, want 1", effects, k, effects[k])
		}
	}
	if len(effects) != 3 {
		t.Fatalf("effects %v, want 3 keys", effects)
	}
}
