package idemtest

import (
	"testing"
	"time"

	"github.com/idemkit/idem/store"
)

// Harness tells the suite how to make and manipulate the store under test.
type Harness struct {
	// New returns a fresh, empty store for one test; the suite closes it.
	// Required.
	New func(t testing.TB) store.Store
	// Advance moves the clock of the stores New returns forward by d, so
	// leases and retention can lapse without sleeping. When nil the suite
	// sleeps instead (it keeps its durations short for that case).
	//
	// The suite calls Advance with the same t it passed to New, and runs
	// tests in parallel: keep one clock per t (see [Clocks]), so that time
	// passing in one test does not lapse leases in another. Advance may be
	// called from several goroutines. Leases are extended by the Ledger's
	// heartbeats on real tickers, so a test about heartbeats moves a frozen
	// clock along in real time itself.
	Advance func(t testing.TB, d time.Duration)
	// Locator, when set, makes a fresh store that other processes can open
	// and returns a string naming it (a file path, a URL with a table or
	// prefix). Open opens it; the suite calls Open in child processes,
	// which run the same test binary and re-enter TestStore. Without them
	// the tests that need separate processes are skipped.
	// Stores from Open must use the real clock (processes share them).
	Locator func(t testing.TB) string
	Open    func(locator string) (store.Store, error)
	// Corrupt, when set, damages the stored record of key so that it cannot
	// be decoded (the corrupt-record tests are skipped without it).
	Corrupt func(t testing.TB, s store.Store, key string)
	// Unreachable, when set, returns a store whose backend cannot be reached
	// (a port nobody listens on). Closed stores are always tested.
	Unreachable func(t testing.TB) store.Store
	// Parallelism, when positive, is passed to b.SetParallelism by the
	// parallel benchmarks of [BenchmarkStore] (goroutines per GOMAXPROCS).
	// Stores that wait on I/O (a network round trip, a disk sync) need more
	// goroutines than CPUs to be measured at their throughput. Default 1.
	Parallelism int
	// HeartbeatLease is the lease of the tests that run heartbeats on the
	// real clock (default [DefaultHeartbeatLease]; heartbeats come every
	// third of it). A store whose calls can take tens of milliseconds under
	// load (an emulator behind an HTTP API) sets a longer one, so that a
	// slow heartbeat is not taken for a lost lease.
	HeartbeatLease time.Duration

	// coalesce makes the suite's ledgers use idem.WithCoalescing (set by
	// the suite for its "coalesced" group).
	coalesce bool
}

// DefaultHeartbeatLease is the default of [Harness.HeartbeatLease].
const DefaultHeartbeatLease = 300 * time.Millisecond

func (h Harness) hbLease() time.Duration {
	if h.HeartbeatLease > 0 {
		return h.HeartbeatLease
	}
	return DefaultHeartbeatLease
}
