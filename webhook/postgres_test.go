package webhook

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/store/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgPub is a queue table in the pgstore's database, written in the claim's
// transaction (queue.TxPublisher[pgx.Tx]), for these tests until
// queue/sqlqueue lands. It keeps every publish.
type pgPub struct {
	pool  *pgxpool.Pool
	table string
	fail  bool
}

func (p *pgPub) PublishTx(ctx context.Context, tx pgx.Tx, m queue.Outgoing) (queue.Published, error) {
	attrs, _ := json.Marshal(m.Attributes)
	var id int64
	err := tx.QueryRow(ctx, "INSERT INTO "+p.table+" (dedup_id, body, attrs) VALUES ($1, $2, $3) RETURNING id",
		m.DedupID, m.Body, string(attrs)).Scan(&id)
	if err != nil {
		return queue.Published{}, err
	}
	if p.fail {
		return queue.Published{}, errInjected // after the row was written: the rollback must undo it
	}
	return queue.Published{ID: itoa(id)}, nil
}

func (p *pgPub) count(t *testing.T) int {
	t.Helper()
	var n int
	if err := p.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+p.table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// On PostgreSQL, PublishTx captures in the pgstore's transaction: one
// message however many deliveries, concurrent ones included (they wait for
// the row lock and then replay), and nothing from a publish that failed
// after writing.
func TestReceiverPostgresTx(t *testing.T) {
	url := testenv.Require(t, testenv.Postgres, "the webhook Receiver's PostgreSQL capture test")
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "webhooktest_" + hex.EncodeToString(b[:])
	st, err := pgstore.Open(ctx, url, pgstore.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	pool := st.Pool()
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		st.Close()
	})
	table := pgx.Identifier{schema, "webhook_queue"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+table+" (id bigserial PRIMARY KEY, dedup_id text NOT NULL, body bytea NOT NULL, attrs text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	pub := &pgPub{pool: pool, table: table}
	l := idem.New(st, idem.WithLogger(quiet))
	s := mustStandard(t, testSecret)
	rc, err := NewReceiver("acme", s, l, PublishTx[pgx.Tx](pub), WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}

	pub.fail = true
	if a := serve(rc, swRequest(t, s, "msg_pg", `{"pg":1}`, time.Now())); a.status != http.StatusInternalServerError {
		t.Fatalf("failed publish: %d %s", a.status, a.body)
	}
	if n := pub.count(t); n != 0 {
		t.Fatalf("%d rows after a rolled-back capture", n)
	}
	pub.fail = false

	const n = 8
	var wg sync.WaitGroup
	answers := make([]answer, n)
	for i := range n {
		wg.Go(func() { answers[i] = serve(rc, swRequest(t, s, "msg_pg", `{"pg":1}`, time.Now())) })
	}
	wg.Wait()
	fresh := 0
	for _, a := range answers {
		if a.status != 200 {
			t.Fatalf("concurrent delivery: %d %s", a.status, a.body)
		}
		if a.header.Get(ReplayedHeader) == "" {
			fresh++
		}
	}
	if fresh != 1 {
		t.Fatalf("%d fresh answers, want 1", fresh)
	}
	if c := pub.count(t); c != 1 {
		t.Fatalf("%d messages, want 1", c)
	}
}
