package pgstore

import (
	"context"
	"math/rand/v2"
	"net/url"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/chaostest"
	"github.com/idemkit/idem/store"
	"github.com/jackc/pgx/v5"
)

// TestChaos runs worker processes on one schema while their connections
// are terminated (pg_terminate_backend of about a third of the backends
// whose application_name is the workers', every 200-400 ms, while writes
// to the record table wait 20-80 ms for a lock) and workers are SIGKILLed, under each policy and DoTx (see internal/chaostest).
func TestChaos(t *testing.T) {
	testURL(t)
	effects := func(locator string) string {
		u, _ := url.Parse(locator)
		return pgx.Identifier{u.Query().Get(ParamSchema), "chaos_effects"}.Sanitize()
	}
	tg := chaostest.Target{
		Faults: "pg_terminate_backend during a table lock",
		Setup: func(t *testing.T, transactional bool) string {
			schema := newSchema(t)
			ctx := context.Background()
			s, err := New(ctx, testPool(t), WithSchema(schema))
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
			loc := withParams(t, testURL(t), ParamSchema, schema)
			if _, err := testPool(t).Exec(ctx, "CREATE TABLE "+effects(loc)+" (key text NOT NULL, who text NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			return loc
		},
		Open: func(ctx context.Context, locator, connName string) (store.Store, error) {
			u, err := url.Parse(locator)
			if err != nil {
				return nil, err
			}
			q := u.Query()
			q.Set("application_name", connName)
			q.Set("pool_max_conns", "4")
			u.RawQuery = q.Encode()
			return Open(ctx, u.String())
		},
		Fault: func(ctx context.Context, locator, connName string) (int, error) {
			// Most of a worker's connections are idle at any moment, and a
			// statement takes a millisecond: the record table is locked
			// against writes for a moment (reads go on), so that the cut
			// lands on claims and completions in flight as well.
			u, _ := url.Parse(locator)
			tx, err := testPool(t).Begin(ctx)
			if err != nil {
				return 0, err
			}
			defer tx.Rollback(context.WithoutCancel(ctx))
			if _, err := tx.Exec(ctx, "LOCK TABLE "+newNames(u.Query().Get(ParamSchema), DefaultTable).qtable+" IN EXCLUSIVE MODE"); err != nil {
				return 0, err
			}
			select {
			case <-time.After(20*time.Millisecond + rand.N(60*time.Millisecond)):
			case <-ctx.Done():
			}
			var n int
			err = testPool(t).QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
				FROM pg_stat_activity WHERE application_name = $1 AND random() < 1.0/3`, connName).Scan(&n)
			return n, err
		},
		DoTx: func(ctx context.Context, locator string, l *idem.Ledger, key, who string, opts ...idem.CallOption) (idem.Result, error) {
			return idem.DoTx(ctx, l, idem.RawKey(key), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				_, err := tx.Exec(ctx, "INSERT INTO "+effects(locator)+" (key, who) VALUES ($1, $2)", key, who)
				return []byte(who), err
			}, opts...)
		},
		Effects: func(ctx context.Context, locator string) (map[string][]string, error) {
			rows, err := testPool(t).Query(ctx, "SELECT key, who FROM "+effects(locator))
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			return chaostest.ScanEffects(rows)
		},
	}
	for _, sc := range []chaostest.Scenario{{Policy: idem.AtLeastOnce}, {Policy: idem.AtMostOnce}, {Transactional: true}} {
		t.Run(sc.String(), func(t *testing.T) { chaostest.Run(t, tg, sc) })
	}
}
