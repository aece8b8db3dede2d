package idemtest

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// TestStore runs the conformance suite on the stores h makes. Every test
// gets a fresh store from h.New. A store passes when TestStore passes with
// the race detector on.
//
// When the test binary runs as a child process of the suite (the
// environment variable IDEMTEST_CHILD_ROLE is set), TestStore plays the
// child's part instead and returns: call it from a top-level test, and let
// nothing else in that test depend on running in the parent.
func TestStore(t *testing.T, h Harness) {
	if os.Getenv(envRole) != "" {
		runChild(t, h)
		return
	}
	if h.New == nil {
		t.Fatal("idemtest: Harness.New is required")
	}
	suite := t.Name()
	t.Run("contract", func(t *testing.T) { t.Parallel(); testClaim(t, h) })
	t.Run("lease", func(t *testing.T) { t.Parallel(); testLease(t, h) })
	t.Run("retention", func(t *testing.T) { t.Parallel(); testRetention(t, h) })
	t.Run("admin", func(t *testing.T) { t.Parallel(); testAdmin(t, h) })
	t.Run("do", func(t *testing.T) { t.Parallel(); testDo(t, h) })
	t.Run("policy", func(t *testing.T) { t.Parallel(); testPolicy(t, h) })
	t.Run("failure", func(t *testing.T) { t.Parallel(); testFailure(t, h) })
	t.Run("heartbeat", func(t *testing.T) { t.Parallel(); testHeartbeat(t, h) })
	t.Run("fingerprint", func(t *testing.T) { t.Parallel(); testFingerprint(t, h) })
	t.Run("claim_fingerprint", func(t *testing.T) { t.Parallel(); testClaimFingerprint(t, h) })
	t.Run("cache", func(t *testing.T) { t.Parallel(); testCache(t, h) })
	t.Run("keys", func(t *testing.T) { t.Parallel(); testKeys(t, h) })
	t.Run("faults", func(t *testing.T) { t.Parallel(); testFaults(t, h) })
	t.Run("attempts", func(t *testing.T) { t.Parallel(); testAttempts(t, h) })
	t.Run("race", func(t *testing.T) { t.Parallel(); testRace(t, h) })
	t.Run("process", func(t *testing.T) { t.Parallel(); testProcess(t, h, suite) })
	t.Run("powertools", func(t *testing.T) { t.Parallel(); testPowertools(t, h) })
	t.Run("coalesced", func(t *testing.T) { t.Parallel(); testCoalesced(t, h) })
}

// testCoalesced runs the Ledger-level tests again on ledgers made with
// idem.WithCoalescing, for stores that batch claims or completions: the
// outcomes must not depend on whether calls shared a round trip.
func testCoalesced(t *testing.T, h Harness) {
	probe := newStore(t, h)
	_, claims := probe.(store.BatchClaimer)
	_, completes := probe.(store.BatchFinisher)
	if !claims && !completes {
		t.Skip("the store implements neither store.BatchClaimer nor store.BatchFinisher")
	}
	h.coalesce = true
	t.Run("do", func(t *testing.T) { t.Parallel(); testDo(t, h) })
	t.Run("policy", func(t *testing.T) { t.Parallel(); testPolicy(t, h) })
	t.Run("failure", func(t *testing.T) { t.Parallel(); testFailure(t, h) })
	t.Run("race", func(t *testing.T) { t.Parallel(); testRace(t, h) })
}

// newStore returns a fresh store from h, closed when t ends.
func newStore(t testing.TB, h Harness) store.Store {
	t.Helper()
	s := h.New(t)
	if s == nil {
		t.Fatal("idemtest: Harness.New returned nil")
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// lease is the lease the suite's claims use: long on a fake clock (it only
// passes when the test says so), short when the suite has to sleep.
func lease(h Harness) time.Duration {
	if h.Advance != nil {
		return 30 * time.Second
	}
	return 300 * time.Millisecond
}

// window is how much longer than the suite's lease or retention a claim or
// record lasts, on the real clock, when a test lets it lapse but first
// checks that it still holds a few store calls after it was made (busy,
// not yet expired): a loaded machine took more than the 300 ms of lease(h)
// for those calls. On a fake clock time passes only when the test says,
// and the window is 0.
func window(h Harness) time.Duration {
	if h.Advance != nil {
		return 0
	}
	return 2 * time.Second
}

// retention is the retention of records that a test lets expire.
func retention(h Harness) time.Duration {
	if h.Advance != nil {
		return time.Hour
	}
	return 300 * time.Millisecond
}

// longRetention is the retention of records that must outlive the test.
const longRetention = 24 * time.Hour

// now reads the store's clock.
func now(t testing.TB, s store.Store) time.Time {
	t.Helper()
	n, err := s.Now(context.Background())
	if err != nil {
		t.Fatalf("Now: %v", err)
	}
	return n
}

// passUntil makes the store's clock reach until: with h.Advance, at once;
// otherwise by sleeping and polling the store's clock.
func passUntil(t testing.TB, h Harness, s store.Store, until time.Time) {
	t.Helper()
	n := now(t, s)
	if !n.Before(until) {
		return
	}
	if h.Advance != nil {
		h.Advance(t, until.Sub(n))
		if n := now(t, s); n.Before(until) {
			t.Fatalf("Harness.Advance(%v) left the store's clock at %v, before %v", until.Sub(n), n, until)
		}
		return
	}
	deadline := time.Now().Add(until.Sub(n) + 10*time.Second)
	for {
		time.Sleep(min(until.Sub(n)+time.Millisecond, 50*time.Millisecond))
		n = now(t, s)
		if !n.Before(until) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store's clock stays at %v, before %v", n, until)
		}
	}
}

// pass lets d pass on the store's clock.
func pass(t testing.TB, h Harness, s store.Store, d time.Duration) {
	t.Helper()
	passUntil(t, h, s, now(t, s).Add(d))
}

// lapse lets the lease of rec pass.
func lapse(t testing.TB, h Harness, s store.Store, key string) {
	t.Helper()
	rec, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	passUntil(t, h, s, rec.LeaseUntil.Add(time.Millisecond))
}

// req is a claim request with the suite's defaults.
func req(h Harness, key string) store.ClaimRequest {
	return store.ClaimRequest{AttemptID: store.NewAttemptID(),
		Key:         key,
		Owner:       "idemtest-owner",
		Correlation: "corr-" + key,
		Policy:      idem.AtLeastOnce,
		Lease:       lease(h),
		Retention:   longRetention,
	}
}

// heldLease is the lease of claims that must stay held during a test.
const heldLease = time.Hour

// hold claims key for a holder whose lease does not pass during the test.
func hold(t testing.TB, h Harness, s store.Store, key string) store.ClaimResult {
	t.Helper()
	r := req(h, key)
	r.Owner, r.Lease = "holder", heldLease
	return acquire(t, s, r)
}

// claim claims r and fails the test on a store error.
func claim(t testing.TB, s store.Store, r store.ClaimRequest) store.ClaimResult {
	t.Helper()
	cr, err := s.Claim(context.Background(), r)
	if err != nil {
		t.Fatalf("Claim(%q): %v", r.Key, err)
	}
	return cr
}

// acquire claims r and fails the test unless it was acquired.
func acquire(t testing.TB, s store.Store, r store.ClaimRequest) store.ClaimResult {
	t.Helper()
	cr := claim(t, s, r)
	if !cr.Acquired {
		t.Fatalf("Claim(%q): not acquired (found %s, fence %d), want acquired", r.Key, cr.Record.Status, cr.Record.Fence)
	}
	if cr.Record.AttemptID != r.AttemptID {
		t.Fatalf("Claim(%q): acquired with record attempt id %q, want the request's %q", r.Key, cr.Record.AttemptID, r.AttemptID)
	}
	return cr
}

// wantFirstFence fails the test unless fence is the first fence of a new
// record claimed when the store's clock read now (the claim's
// ClaimResult.Now, or a reading before the claim): at least now in
// microseconds ([store.FirstFence]), so that the key's fences never repeat
// across delete, sweep and expiry.
func wantFirstFence(t testing.TB, what string, fence int64, now time.Time) {
	t.Helper()
	if fence < now.UnixMicro() {
		t.Fatalf("%s: fence %d, want a new record's first fence: at least the store's clock at the claim in microseconds, %d (%v)",
			what, fence, now.UnixMicro(), now)
	}
}

// get reads key and fails the test on any error.
func get(t testing.TB, s store.Store, key string) idem.Record {
	t.Helper()
	rec, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return rec
}

// wantNotFound fails the test unless key is absent.
func wantNotFound(t testing.TB, s store.Store, key string) {
	t.Helper()
	rec, err := s.Get(context.Background(), key)
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get(%q) = (%s record, %v), want ErrNotFound", key, rec.Status, err)
	}
}

// wantErr fails the test unless errors.Is(err, target).
func wantErr(t testing.TB, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: err = %v, want %v", what, err, target)
	}
}

// noErr fails the test on err.
func noErr(t testing.TB, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// sameTime reports whether a and b are the same instant to the millisecond
// (stores may keep times with less than nanosecond precision).
func sameTime(a, b time.Time) bool {
	d := a.Sub(b)
	return d > -time.Millisecond && d < time.Millisecond
}

// wantTime fails the test unless got is want to the millisecond.
func wantTime(t testing.TB, what string, got, want time.Time) {
	t.Helper()
	if !sameTime(got, want) {
		t.Fatalf("%s = %v, want %v (off by %v)", what, got, want, got.Sub(want))
	}
}

// wantBetween fails the test unless got is within [lo, hi], give or take a
// millisecond.
func wantBetween(t testing.TB, what string, got, lo, hi time.Time) {
	t.Helper()
	if got.Before(lo.Add(-time.Millisecond)) || got.After(hi.Add(time.Millisecond)) {
		t.Fatalf("%s = %v, want between %v and %v", what, got, lo, hi)
	}
}

// wantBytes fails the test unless got equals want (nil and empty are equal).
func wantBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Fatalf("%s = %q, want %q", what, got, want)
	}
}

// discard is the logger of the suite's ledgers.
var discard = slog.New(slog.DiscardHandler)

// ledger returns a Ledger on s that logs nothing, with the suite's lease.
func ledger(h Harness, s store.Store, opts ...idem.Option) *idem.Ledger {
	all := append([]idem.Option{idem.WithLogger(discard), idem.WithOwner("idemtest"), idem.WithLease(lease(h))}, opts...)
	if h.coalesce {
		// At any load: the suite's tests make a few calls at once, fewer
		// than a Ledger's default load for coalescing.
		all = append(all, idem.WithCoalescing(16), idem.WithCoalescingFrom(1))
	}
	return idem.New(s, all...)
}

// counter counts the calls of the fns it makes.
type counter struct{ n atomic.Int64 }

// fn returns an fn that counts its calls and returns val.
func (c *counter) fn(val []byte) func(context.Context) ([]byte, error) {
	return func(context.Context) ([]byte, error) {
		c.n.Add(1)
		return val, nil
	}
}

// fail returns an fn that counts its calls and returns err.
func (c *counter) fail(err error) func(context.Context) ([]byte, error) {
	return func(context.Context) ([]byte, error) {
		c.n.Add(1)
		return nil, err
	}
}

// want fails the test unless fn ran n times.
func (c *counter) want(t testing.TB, n int) {
	t.Helper()
	if got := c.n.Load(); got != int64(n) {
		t.Fatalf("fn ran %d times, want %d", got, n)
	}
}

// do calls l.Do and fails the test on an error.
func do(t testing.TB, l *idem.Ledger, key idem.OperationKey, fn func(context.Context) ([]byte, error), opts ...idem.CallOption) idem.Result {
	t.Helper()
	res, err := l.Do(context.Background(), key, fn, opts...)
	if err != nil {
		t.Fatalf("Do(%q): %v", key, err)
	}
	return res
}

// wantResult fails the test unless res has the value, flags and attempt
// number wanted and a fence. (Fences come from the store's clock: the
// suite checks how they grow where it claims keys itself.)
func wantResult(t testing.TB, res idem.Result, val []byte, replayed bool, attempt int) {
	t.Helper()
	if !bytes.Equal(res.Value, val) || res.Replayed != replayed || res.Attempt != attempt || res.Fence <= 0 {
		t.Fatalf("Result = {Value %q, Replayed %v, Attempt %d, Fence %d}, want {Value %q, Replayed %v, Attempt %d, a fence}",
			res.Value, res.Replayed, res.Attempt, res.Fence, val, replayed, attempt)
	}
}

var errBoom = errors.New("idemtest: boom")
