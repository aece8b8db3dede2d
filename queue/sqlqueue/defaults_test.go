package sqlqueue_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/idemkit/idem/queue/queuetest"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/sqlitestore"
)

// A consumer of a SQLite queue at its defaults does not warn.
func TestSQLiteDefaultsAgree(t *testing.T) {
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	queues, err := sqlqueue.NewSQLite(ctx, st.DB())
	if err != nil {
		t.Fatal(err)
	}
	defer queues.Close()
	q, err := queues.Queue("orders")
	if err != nil {
		t.Fatal(err)
	}
	queuetest.DefaultsAgree(t, q)
}

// A consumer of a PostgreSQL queue at its defaults does not warn (the
// schema is the test's own, to keep it apart from other tests).
func TestPostgresDefaultsAgree(t *testing.T) {
	pool := pgPool(t)
	p := openPostgres(t, pool, pgSchema(t, pool))
	queuetest.DefaultsAgree(t, pgQueue(t, p, "orders"))
}
