package idemtest

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// testCache holds the Ledger's local result cache (idem.WithCache) on the
// store: completed results are answered without store I/O; in_progress,
// failed and mismatched answers never are.
func testCache(t *testing.T, h Harness) {
	t.Run("second_call_no_store_io", func(t *testing.T) {
		t.Parallel()
		fs := NewFaultStore(newStore(t, h))
		l := ledger(h, fs, idem.WithCache(16))
		var c counter
		do(t, l, idem.Key("k"), c.fn([]byte("r")))
		calls := fs.TotalCalls()
		for range 3 {
			res := do(t, l, idem.Key("k"), c.fn(nil))
			wantResult(t, res, []byte("r"), true, 1)
		}
		if n := fs.TotalCalls() - calls; n != 0 {
			t.Fatalf("cached replays made %d store calls, want 0", n)
		}
		c.want(t, 1)
	})

	t.Run("store_replay_fills_the_cache", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		var c counter
		do(t, ledger(h, s), idem.Key("k"), c.fn([]byte("r")))
		fs := NewFaultStore(s)
		l := ledger(h, fs, idem.WithCache(16))
		res := do(t, l, idem.Key("k"), c.fn(nil))
		wantResult(t, res, []byte("r"), true, 1)
		if n := fs.Calls(OpClaim); n != 1 {
			t.Fatalf("replay from the store made %d claims, want 1", n)
		}
		res = do(t, l, idem.Key("k"), c.fn(nil))
		wantResult(t, res, []byte("r"), true, 1)
		if n := fs.TotalCalls(); n != 1 {
			t.Fatalf("second replay made %d store calls in all, want 1 (the first replay's claim)", n)
		}
	})

	t.Run("in_progress_never_cached", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		fs := NewFaultStore(s)
		l := ledger(h, fs, idem.WithCache(16))
		held := hold(t, h, s, "k")
		var c counter
		for range 2 {
			_, err := l.Do(context.Background(), idem.RawKey("k"), c.fn(nil))
			wantBusy(t, err, held.Record, heldLease)
		}
		if n := fs.Calls(OpClaim); n != 2 {
			t.Fatalf("two calls on an in_progress key made %d claims, want 2 (never answered from the cache)", n)
		}
		noErr(t, "Complete", s.Finish(context.Background(), store.FinishRequest{Key: "k", Fence: held.Record.Fence, AttemptID: held.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("done"), Retention: time.Hour}))
		res := do(t, l, idem.RawKey("k"), c.fn(nil))
		wantResult(t, res, []byte("done"), true, 1)
		c.want(t, 0)
	})

	t.Run("failed_never_cached", func(t *testing.T) {
		t.Parallel()
		fs := NewFaultStore(newStore(t, h))
		l := ledger(h, fs, idem.WithCache(16))
		var c counter
		_, err := l.Do(context.Background(), idem.Key("k"), c.fail(idem.Permanent(errBoom)))
		wantErr(t, "Do", err, errBoom)
		before := fs.Calls(OpClaim)
		_, err = l.Do(context.Background(), idem.Key("k"), c.fn(nil))
		wantErr(t, "Do on a failed key", err, idem.ErrFailed)
		if fs.Calls(OpClaim) != before+1 {
			t.Fatal("a failed key was answered without asking the store")
		}
	})

	t.Run("mismatch_from_cache", func(t *testing.T) {
		t.Parallel()
		fs := NewFaultStore(newStore(t, h))
		l := ledger(h, fs, idem.WithCache(16))
		var c counter
		do(t, l, idem.Key("k"), c.fn([]byte("r")), idem.Fingerprint([]byte("a")))
		calls := fs.TotalCalls()
		_, err := l.Do(context.Background(), idem.Key("k"), c.fn(nil), idem.Fingerprint([]byte("b")))
		wantMismatch(t, err, idem.StatusCompleted)
		res := do(t, l, idem.Key("k"), c.fn(nil), idem.Fingerprint([]byte("a")))
		wantResult(t, res, []byte("r"), true, 1)
		if n := fs.TotalCalls() - calls; n != 0 {
			t.Fatalf("cached mismatch and replay made %d store calls, want 0", n)
		}
		c.want(t, 1)
	})

	t.Run("expired_entry_falls_through", func(t *testing.T) {
		// Powertools: an expired local-cache entry falls through to the
		// store. The cache counts retention on the local clock.
		t.Parallel()
		fs := NewFaultStore(newStore(t, h))
		ret := 50 * time.Millisecond
		l := ledger(h, fs, idem.WithCache(16), idem.WithRetention(ret))
		var c counter
		do(t, l, idem.Key("k"), c.fn([]byte("r")))
		before := fs.Calls(OpClaim)
		time.Sleep(ret + 20*time.Millisecond)
		if _, err := l.Do(context.Background(), idem.Key("k"), c.fn([]byte("r2"))); err != nil {
			t.Fatalf("Do after the cache entry expired: %v", err)
		}
		if fs.Calls(OpClaim) != before+1 {
			t.Fatal("a cache entry past its retention answered without asking the store")
		}
	})

	t.Run("evicts_beyond_capacity", func(t *testing.T) {
		t.Parallel()
		fs := NewFaultStore(newStore(t, h))
		l := ledger(h, fs, idem.WithCache(2))
		var c counter
		for _, k := range []string{"a", "b", "c"} {
			do(t, l, idem.Key(k), c.fn([]byte(k)))
		}
		before := fs.Calls(OpClaim)
		res := do(t, l, idem.Key("a"), c.fn(nil)) // evicted: asks the store
		wantResult(t, res, []byte("a"), true, 1)
		if fs.Calls(OpClaim) != before+1 {
			t.Fatal("a cache of 2 still held the first of 3 keys")
		}
		c.want(t, 3)
	})
}
