// Package idemtest is the conformance suite that every store.Store must pass,
// and the benchmarks that measure one. Use it when you write a store, or
// wrap one: a store's tests call [TestStore] (and its benchmarks
// [BenchmarkStore]) with a [Harness] that makes fresh stores.
//
//	var clocks idemtest.Clocks // one fake clock per test
//	var h = idemtest.Harness{
//		New: func(t testing.TB) store.Store {
//			return memstore.New(memstore.WithClock(clocks.Get(t).Now))
//		},
//		Advance: clocks.Advance, // leases lapse without sleeping
//	}
//
//	func TestConformance(t *testing.T)      { idemtest.TestStore(t, h) }
//	func BenchmarkConformance(b *testing.B) { idemtest.BenchmarkStore(b, h) }
//
// # What the suite checks
//
// The suite runs the store both directly (the Store contract) and under an
// idem.Ledger (the outcomes users see): duplicates, busy keys, lapsed leases
// under each policy, stale holders, retention, fingerprints, permanent
// failures, races between goroutines and between OS processes, a process
// killed inside fn, closed and unreachable stores and corrupt records.
//
// Beyond the store.Store interface, the suite holds a store to what its doc
// comments imply: times kept to the millisecond at least; keys kept
// byte for byte (case, trailing spaces, escapes, up to idem.MaxKeyLen bytes
// of UTF-8) and ordered byte-wise by List and its After cursor (a SQL
// store needs a binary collation); fences and attempt numbers that keep
// growing across a record's expiry, so a holder from before it is still
// refused; and a refused write or heartbeat of a stale holder marking its
// journal entry's LateFinish.
//
// # The Harness
//
// Only Harness.New is required; each other field turns on tests that are
// skipped without it. Advance moves a test's clock (without it the suite
// sleeps through leases of 300 ms); Locator and Open let child processes
// open the same store (the cross-process tests); Corrupt damages a record
// (the corrupt-record tests); Unreachable makes a store whose backend does
// not answer. Parallelism (default 1) and HeartbeatLease (default
// [DefaultHeartbeatLease], 300 ms) suit stores that wait on I/O.
//
// The suite's subtests run in parallel, each on a fresh store from
// Harness.New. With Harness.Advance the whole suite takes a few seconds on
// an in-memory store; without it, it sleeps through leases of 300 ms.
// Heartbeat tests always take real time (about a second).
//
// [FaultStore] wraps a real store and makes chosen calls fail, for the
// faults a real service cannot produce on demand (a completion that fails
// after fn ran).
package idemtest
