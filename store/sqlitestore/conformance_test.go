package sqlitestore

import (
	"context"
	"database/sql/driver"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/store"
)

func TestConformance(t *testing.T) { idemtest.TestStore(t, harness()) }

// BenchmarkConformance runs idemtest's benchmarks (keys spread over many
// prefixes, so commits touch more pages than BenchmarkClaimComplete's).
func BenchmarkConformance(b *testing.B) { idemtest.BenchmarkStore(b, harness()) }

func harness() idemtest.Harness {
	var clocks idemtest.Clocks
	open := func(path string) (store.Store, error) { return Open(context.Background(), path) }
	return idemtest.Harness{
		New: func(t testing.TB) store.Store {
			s, err := Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"), WithClock(clocks.Get(t).Now))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Advance: clocks.Advance,
		Locator: func(t testing.TB) string { return filepath.Join(t.TempDir(), "shared.db") },
		Open:    open,
		Corrupt: func(t testing.TB, s store.Store, key string) {
			if _, err := s.(*Store).DB().Exec(`UPDATE idem_records SET status = 'garbled' WHERE key = ?`, key); err != nil {
				t.Fatal(err)
			}
		},
		Unreachable: func(t testing.TB) store.Store {
			s, err := Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"),
				WithClock(clocks.Get(t).Now), WithBusyTimeout(100*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			breakStore(t, s)
			return s
		},
		// The writer waits on the disk: measure it with many callers.
		Parallelism: 32,
		// Every extension waits for a synced commit, behind the parallel
		// suite's other writes: at 300 ms a slow disk made the one
		// heartbeat after an injected failure miss the lease; at 1 s, a
		// CI run beside other test suites (slow_fn_keeps_its_key took 6.75
		// s for its 3 s) let the lease run out before an extension was
		// granted. pgstore and dynamostore use 3 s for the same reason.
		HeartbeatLease: 3 * time.Second,
	}
}

// breakStore makes every read and write of s fail with the driver's or
// SQLite's own errors, as a database that cannot be reached would: an
// embedded database has no server to be unreachable, so its nearest
// failure is connections that stop working. Reads go to a closed pool;
// the writer's connection becomes read-only (SQLITE_READONLY on every
// write). s is not closed: its errors are not ErrClosed.
func breakStore(t testing.TB, s *Store) {
	t.Helper()
	if err := s.rdb.Close(); err != nil {
		t.Fatal(err)
	}
	err := s.w.do(context.Background(), false, func(w rw, _ time.Time) error {
		_, err := w.(*driverRW).conn.(driver.ExecerContext).ExecContext(context.Background(), "PRAGMA query_only = 1", nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
