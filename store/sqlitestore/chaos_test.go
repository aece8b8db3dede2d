package sqlitestore

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/chaostest"
	"github.com/idemkit/idem/store"
)

// chaosBusyTimeout is how long the workers' writes wait for the write
// lock; the parent holds it for up to chaosHoldMax at a time, so some
// of their writes fail with SQLITE_BUSY.
const (
	chaosBusyTimeout = 250 * time.Millisecond
	chaosHoldMin     = 100 * time.Millisecond
	chaosHoldMax     = 500 * time.Millisecond
)

// TestChaos runs worker processes on one database file while they are
// SIGKILLed, under each policy and DoTx (see internal/chaostest). SQLite
// has no connection to cut: the fault it meets for real is another
// process holding the write lock. Every 200-400 ms the parent holds it
// (BEGIN IMMEDIATE) for 100-500 ms, longer than the workers' busy timeout
// (250 ms), so some of their claims, completions and heartbeats fail with
// SQLITE_BUSY and are retried by the Ledger; a SIGKILL during a commit
// tests the file's own recovery (WAL).
func TestChaos(t *testing.T) {
	var (
		mu  sync.Mutex
		dbs = map[string]*sql.DB{} // the parent's own connection to each file
	)
	parentDB := func(t *testing.T, path string) *sql.DB {
		mu.Lock()
		defer mu.Unlock()
		if db, ok := dbs[path]; ok {
			return db
		}
		db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)&_txlock=immediate")
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(1)
		dbs[path] = db
		t.Cleanup(func() { db.Close() })
		return db
	}
	tg := chaostest.Target{
		Faults: "write lock held by another process",
		Setup: func(t *testing.T, _ bool) string {
			path := filepath.Join(t.TempDir(), "chaos.db")
			s, err := Open(context.Background(), path)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if _, err := s.DB().Exec("CREATE TABLE chaos_effects (key TEXT NOT NULL, who TEXT NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			parentDB(t, path)
			return path
		},
		Open: func(ctx context.Context, path, _ string) (store.Store, error) {
			return Open(ctx, path, WithBusyTimeout(chaosBusyTimeout))
		},
		Fault: func(ctx context.Context, path, _ string) (int, error) {
			tx, err := parentDB(t, path).BeginTx(ctx, nil) // BEGIN IMMEDIATE: the write lock
			if err != nil {
				return 0, err
			}
			select {
			case <-time.After(chaosHoldMin + rand.N(chaosHoldMax-chaosHoldMin)):
			case <-ctx.Done():
			}
			return 1, tx.Rollback()
		},
		DoTx: func(ctx context.Context, _ string, l *idem.Ledger, key, who string, opts ...idem.CallOption) (idem.Result, error) {
			return idem.DoTx(ctx, l, idem.RawKey(key), func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
				_, err := tx.ExecContext(ctx, "INSERT INTO chaos_effects (key, who) VALUES (?, ?)", key, who)
				return []byte(who), err
			}, opts...)
		},
		Effects: func(ctx context.Context, path string) (map[string][]string, error) {
			rows, err := parentDB(t, path).QueryContext(ctx, "SELECT key, who FROM chaos_effects")
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
