package idemtest

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// testDo holds what a user of idem.Ledger sees on the store: the first
// execution, duplicates, busy keys, typed and empty results.
func testDo(t *testing.T, h Harness) {
	t.Run("first_execution", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s, idem.WithRetention(5*time.Hour))
		var c counter
		before := now(t, s)
		res := do(t, l, idem.Key("receipt", 8891, 7), c.fn([]byte("msg-1")))
		after := now(t, s)
		c.want(t, 1)
		wantResult(t, res, []byte("msg-1"), false, 1)
		if res.Takeover || res.Reconciled {
			t.Fatalf("first execution: Takeover %v, Reconciled %v; want false", res.Takeover, res.Reconciled)
		}
		rec := get(t, s, "receipt:8891:7")
		if rec.Status != idem.StatusCompleted || rec.Owner != l.Owner() || rec.Fence != res.Fence || rec.Attempt != 1 {
			t.Fatalf("record {%s, owner %q, fence %d, attempt %d}, want {completed, %q, the Result's fence %d, 1}", rec.Status, rec.Owner, rec.Fence, rec.Attempt, l.Owner(), res.Fence)
		}
		wantFirstFence(t, "the first execution's record", rec.Fence, before)
		wantBytes(t, "stored Result", rec.Result, []byte("msg-1"))
		wantBetween(t, "ExpiresAt", rec.ExpiresAt, before.Add(5*time.Hour), after.Add(5*time.Hour))
		if len(rec.Journal) != 1 || rec.Journal[0].Outcome != store.OutcomeCompleted || rec.Journal[0].Correlation == "" {
			t.Fatalf("journal %+v, want one completed entry with a correlation id", rec.Journal)
		}
	})

	t.Run("duplicate_replays", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s)
		key := idem.Key("receipt", 1)
		var c counter
		do(t, l, key, c.fn([]byte("first")))
		res := do(t, l, key, c.fn([]byte("second")))
		c.want(t, 1)
		wantResult(t, res, []byte("first"), true, 1)
		// Another ledger (another process) on the same store replays too.
		res = do(t, ledger(h, s, idem.WithOwner("other")), key, c.fn([]byte("third")))
		c.want(t, 1)
		wantResult(t, res, []byte("first"), true, 1)
	})

	t.Run("correlation_id_in_journal", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		var c counter
		do(t, ledger(h, s), idem.Key("k"), c.fn(nil), idem.WithCorrelationID("msg-77"))
		if j := get(t, s, "k").Journal; j[0].Correlation != "msg-77" {
			t.Fatalf("journal correlation %q, want msg-77", j[0].Correlation)
		}
	})

	t.Run("busy_other_holder", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s)
		r := req(h, "k")
		r.Owner, r.Lease = "holder", heldLease
		held := acquire(t, s, r)
		var c counter
		_, err := l.Do(context.Background(), idem.RawKey("k"), c.fn(nil))
		c.want(t, 0)
		wantBusy(t, err, held.Record, r.Lease)
	})

	t.Run("busy_while_fn_runs", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		// The key stays held by its lease, not by heartbeats answered in
		// a third of 300 ms on a loaded machine's real clock.
		l := ledger(h, s, idem.WithLease(lease(h)+window(h)))
		key := idem.Key("k")
		inside, release := make(chan struct{}), make(chan struct{})
		type out struct {
			res idem.Result
			err error
		}
		first := make(chan out, 1)
		go func() {
			res, err := l.Do(context.Background(), key, func(context.Context) ([]byte, error) {
				close(inside)
				<-release
				return []byte("done"), nil
			})
			first <- out{res, err}
		}()
		<-inside
		var c counter
		_, err := l.Do(context.Background(), key, c.fn(nil))
		c.want(t, 0)
		wantBusy(t, err, get(t, s, "k"), lease(h)+window(h))
		close(release)
		o := <-first
		noErr(t, "first Do", o.err)
		wantResult(t, o.res, []byte("done"), false, 1)
		res := do(t, l, key, c.fn(nil))
		c.want(t, 0)
		wantResult(t, res, []byte("done"), true, 1)
	})

	t.Run("typed_run", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s)
		type receipt struct {
			MessageID  string            `json:"message_id"`
			Recipients []string          `json:"recipients"`
			Cost       float64           `json:"cost"`
			Meta       map[string]string `json:"meta"`
			When       time.Time         `json:"when"`
		}
		want := receipt{MessageID: "<8891.7@example.com>", Recipients: []string{"a@example.com", "ü@example.com"}, Cost: 0.25,
			Meta: map[string]string{"x": "y"}, When: time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)}
		var n int
		fn := func(context.Context) (receipt, error) { n++; return want, nil }
		got, res, err := idem.Run(context.Background(), l, idem.Key("receipt", 8891), fn)
		noErr(t, "Run", err)
		if res.Replayed || !reflect.DeepEqual(got, want) {
			t.Fatalf("first Run = %+v (replayed %v), want %+v", got, res.Replayed, want)
		}
		got, res, err = idem.Run(context.Background(), ledger(h, s), idem.Key("receipt", 8891), fn)
		noErr(t, "second Run", err)
		if n != 1 {
			t.Fatalf("fn ran %d times, want 1", n)
		}
		if !res.Replayed || !reflect.DeepEqual(got, want) {
			t.Fatalf("replayed Run = %+v (replayed %v), want %+v", got, res.Replayed, want)
		}
	})

	t.Run("typed_run_nil_pointer", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s)
		type thing struct{ A int }
		fn := func(context.Context) (*thing, error) { return nil, nil }
		_, _, err := idem.Run(context.Background(), l, idem.Key("k"), fn)
		noErr(t, "Run", err)
		got, res, err := idem.Run(context.Background(), l, idem.Key("k"), func(context.Context) (*thing, error) { return &thing{A: 1}, nil })
		noErr(t, "second Run", err)
		if !res.Replayed || got != nil {
			t.Fatalf("replayed Run = %v (replayed %v), want nil replayed", got, res.Replayed)
		}
	})

	for _, tc := range []struct {
		name string
		val  []byte
	}{{"nil_result", nil}, {"empty_result", []byte{}}, {"binary_result", []byte{0, 0xff, '\n', 0x80, 0}}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, h)
			l := ledger(h, s)
			var c counter
			res := do(t, l, idem.Key("k"), c.fn(tc.val))
			wantResult(t, res, tc.val, false, 1)
			res = do(t, l, idem.Key("k"), c.fn([]byte("other")))
			c.want(t, 1)
			wantResult(t, res, tc.val, true, 1)
		})
	}

	t.Run("large_result", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s)
		val := make([]byte, 256<<10)
		for i := range val {
			val[i] = byte(i * 7)
		}
		var c counter
		do(t, l, idem.Key("k"), c.fn(val))
		res := do(t, l, idem.Key("k"), c.fn(nil))
		wantResult(t, res, val, true, 1)
	})
}

// wantBusy fails the test unless err says the key is in progress, held by
// the attempt in held, with a positive RetryAfter no longer than lease.
func wantBusy(t testing.TB, err error, held idem.Record, lease time.Duration) {
	t.Helper()
	if !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("Do on a held key: err = %v, want ErrInProgress", err)
	}
	var ip *idem.InProgressError
	if !errors.As(err, &ip) {
		t.Fatalf("Do on a held key: err = %T, want *idem.InProgressError", err)
	}
	if ip.RetryAfter <= 0 || ip.RetryAfter > lease {
		t.Fatalf("InProgressError.RetryAfter = %v, want > 0 and at most the lease %v", ip.RetryAfter, lease)
	}
	if ip.Fence != held.Fence || ip.Owner != held.Owner || ip.Attempt != held.Attempt {
		t.Fatalf("InProgressError = {fence %d, owner %q, attempt %d}, want the holder's {%d, %q, %d}",
			ip.Fence, ip.Owner, ip.Attempt, held.Fence, held.Owner, held.Attempt)
	}
	if ip.LeaseUntil.IsZero() {
		t.Fatal("InProgressError.LeaseUntil is zero")
	}
}
