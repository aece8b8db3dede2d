package idemtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// testRetention holds retention: a finished record is remembered for its
// retention and then behaves as absent, on every read, whatever the
// backend's own TTL does; Sweep deletes expired records in batches.
func testRetention(t *testing.T, h Harness) {
	t.Run("completed_expires", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		ret := retention(h)
		cr := acquire(t, s, req(h, "k"))
		noErr(t, "Complete", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: ret}))
		// Expired by the store's clock now plus the retention (on the
		// real clock a Get for ExpiresAt could come after it).
		passUntil(t, h, s, now(t, s).Add(ret))
		wantNotFound(t, s, "k")
		if recs, err := s.List(ctx, store.ListQuery{}); err != nil || len(recs) != 0 {
			t.Fatalf("List after expiry = %v, %v; want nothing", keysOf(recs), err)
		}
		wantErr(t, "Delete of an expired record", s.Delete(ctx, "k"), store.ErrNotFound)
		_, err := s.Resolve(ctx, store.ResolveRequest{Key: "k", Done: true, Retention: time.Hour})
		wantErr(t, "Resolve of an expired record", err, store.ErrNotFound)

		cr2 := acquire(t, s, req(h, "k"))
		if cr2.Takeover {
			t.Error("claim after expiry: Takeover = true, want false")
		}
		if cr2.Record.Fence != cr.Record.Fence+1 {
			t.Fatalf("claim after expiry: fence %d, want %d, the expired record's + 1 (fences keep growing across expiry, so a holder from before is still refused)", cr2.Record.Fence, cr.Record.Fence+1)
		}
		if n := len(cr2.Record.Journal); n == 0 || !cr2.Record.Journal[n-1].AfterExpiry {
			t.Fatalf("claim after expiry: journal %+v, want the newest entry marked AfterExpiry", cr2.Record.Journal)
		}
		if len(cr2.Record.Result) != 0 {
			t.Fatalf("claim after expiry kept the old result %q", cr2.Record.Result)
		}
		wantErr(t, "Complete with the fence from before the expiry", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("old"), Retention: time.Hour}), idem.ErrLeaseLost)
	})

	t.Run("failed_expires", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		cr := acquire(t, s, req(h, "k"))
		noErr(t, "Fail", s.Finish(context.Background(), store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeFailed, Reason: "declined", Retention: retention(h)}))
		passUntil(t, h, s, now(t, s).Add(retention(h))) // past ExpiresAt, as in completed_expires
		wantNotFound(t, s, "k")
		if again := acquire(t, s, req(h, "k")); again.Record.Fence <= cr.Record.Fence {
			t.Fatalf("claim after expiry: fence %d, want above the expired record's %d (fences never repeat)", again.Record.Fence, cr.Record.Fence)
		}
	})

	t.Run("in_progress_expires", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		r := req(h, "k")
		r.Policy = idem.AtMostOnce
		r.Retention = 2*r.Lease + window(h) // the claim after the lapse must come before the expiry
		cr := acquire(t, s, r)
		wantTime(t, "ExpiresAt", cr.Record.ExpiresAt, cr.Now.Add(r.Retention))
		lapse(t, h, s, "k")
		if c := claim(t, s, req(h, "k")); c.Acquired {
			t.Fatal("lapsed AtMostOnce record before its retention: acquired, want indeterminate")
		}
		passUntil(t, h, s, cr.Record.ExpiresAt)
		wantNotFound(t, s, "k")
		c := acquire(t, s, req(h, "k"))
		if c.Takeover {
			t.Error("claim of an expired in_progress record: Takeover = true, want false (it is absent)")
		}
		if c.Record.Fence <= cr.Record.Fence {
			t.Fatalf("claim of an expired in_progress record: fence %d, want above the expired record's %d (fences never repeat)", c.Record.Fence, cr.Record.Fence)
		}
	})

	t.Run("expiry_is_checked_on_every_call", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		cr := acquire(t, s, req(h, "k"))
		// Retention and the Get before expiry leave a window of window(h)
		// on the real clock; on a fake clock the Get comes retention(h)/4
		// before ExpiresAt.
		noErr(t, "Complete", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: retention(h) + window(h)}))
		exp := get(t, s, "k").ExpiresAt
		passUntil(t, h, s, exp.Add(-retention(h)/4-window(h)))
		get(t, s, "k") // still there a little before
		passUntil(t, h, s, exp)
		wantNotFound(t, s, "k") // gone exactly at ExpiresAt
	})

	t.Run("sweep", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		ctx := context.Background()
		ret := retention(h)
		const expired, live = 25, 5
		for i := range expired {
			k := fmt.Sprintf("old-%02d", i)
			cr := acquire(t, s, req(h, k))
			noErr(t, "Complete", s.Finish(ctx, store.FinishRequest{Key: k, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: ret}))
		}
		for i := range live {
			k := fmt.Sprintf("live-%02d", i)
			cr := acquire(t, s, req(h, k))
			if i%2 == 0 {
				noErr(t, "Complete", s.Finish(ctx, store.FinishRequest{Key: k, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: longRetention}))
			}
		}
		passUntil(t, h, s, now(t, s).Add(ret))
		total := 0
		for i := 0; ; i++ {
			n, err := s.Sweep(ctx, 10)
			noErr(t, "Sweep", err)
			if n > 10 {
				t.Fatalf("Sweep(10) deleted %d records, want at most 10", n)
			}
			if n == 0 {
				break
			}
			total += n
			if i > expired {
				t.Fatalf("Sweep keeps returning %d after deleting %d records", n, total)
			}
		}
		if total != expired {
			t.Fatalf("Sweep deleted %d records in all, want %d", total, expired)
		}
		for i := range live {
			get(t, s, fmt.Sprintf("live-%02d", i))
		}
		recs, err := s.List(ctx, store.ListQuery{})
		noErr(t, "List", err)
		if len(recs) != live {
			t.Fatalf("List after Sweep = %v, want the %d live records", keysOf(recs), live)
		}
	})

	t.Run("sweep_nothing", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		acquire(t, s, req(h, "k"))
		n, err := s.Sweep(context.Background(), 100)
		if err != nil || n != 0 {
			t.Fatalf("Sweep with nothing expired = %d, %v; want 0, nil", n, err)
		}
		get(t, s, "k")
	})
}
