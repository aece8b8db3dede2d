package memstore_test

import (
	"testing"
	"time"

	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

// harness runs the suite on memstore with one fake clock per test.
func harness() idemtest.Harness {
	var clocks idemtest.Clocks
	return idemtest.Harness{
		New: func(t testing.TB) store.Store {
			return memstore.New(memstore.WithClock(clocks.Get(t).Now))
		},
		Advance: clocks.Advance,
	}
}

func TestConformance(t *testing.T) { idemtest.TestStore(t, harness()) }

// TestConformanceRealClock runs the suite on the real clock, where it sleeps
// through short leases instead of advancing a fake clock.
func TestConformanceRealClock(t *testing.T) {
	if testing.Short() {
		t.Skip("sleeps through leases; skipped with -short")
	}
	// A heartbeat lease of 1 s, not the default 300 ms: a heartbeat timer
	// fired 200 ms late under CI's load (-race, every package at once)
	// and slow_fn_keeps_its_key saw its lease lapse.
	idemtest.TestStore(t, idemtest.Harness{
		New:            func(testing.TB) store.Store { return memstore.New() },
		HeartbeatLease: time.Second,
	})
}

// BenchmarkConformance measures memstore on the real clock (the benchmarks
// never need time to pass).
func BenchmarkConformance(b *testing.B) {
	idemtest.BenchmarkStore(b, idemtest.Harness{New: func(testing.TB) store.Store { return memstore.New() }})
}
