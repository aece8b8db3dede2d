package idemtest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem"
)

// testFailure holds what an error or a panic from fn means under each
// policy (see "Policies" in docs/design.md): released for a retry, left
// indeterminate, released by NotDone, failed for good by Permanent.
func testFailure(t *testing.T, h Harness) {
	t.Run("error/at_least_once_releases", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s)
		var c counter
		_, err := l.Do(context.Background(), idem.Key("k"), c.fail(errBoom))
		if err != errBoom { //nolint:errorlint // the error must come back unchanged
			t.Fatalf("Do returned %v (%T), want fn's error unchanged", err, err)
		}
		rec := get(t, s, "k")
		if rec.Status != idem.StatusReleased || rec.Reason != errBoom.Error() {
			t.Fatalf("after fn's error: {%s, reason %q}, want {released, %q}", rec.Status, rec.Reason, errBoom.Error())
		}
		res := do(t, l, idem.Key("k"), c.fn([]byte("ok")))
		c.want(t, 2)
		wantResult(t, res, []byte("ok"), false, 2)
		if res.Takeover {
			t.Fatal("retry after a released error: Takeover = true, want false")
		}
	})

	t.Run("error/at_most_once_indeterminate", func(t *testing.T) {
		// "Throw after the send on purpose": the effect may have happened,
		// so the key is never run again by itself.
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s, idem.WithPolicy(idem.AtMostOnce))
		var c counter
		_, err := l.Do(context.Background(), idem.Key("k"), c.fail(errBoom))
		wantErr(t, "Do", err, errBoom)
		rec := get(t, s, "k")
		if rec.Status != idem.StatusInProgress || !rec.Lapsed(now(t, s)) || rec.Reason != errBoom.Error() {
			t.Fatalf("after fn's error under AtMostOnce: {%s, lapsed %v, reason %q}, want {in_progress, lapsed, %q}",
				rec.Status, rec.Lapsed(now(t, s)), rec.Reason, errBoom.Error())
		}
		_, err = l.Do(context.Background(), idem.Key("k"), c.fn(nil))
		wantIndeterminate(t, err, rec)
		var ie *idem.IndeterminateError
		if errors.As(err, &ie) && ie.Reason != errBoom.Error() {
			t.Fatalf("IndeterminateError.Reason = %q, want fn's error %q", ie.Reason, errBoom.Error())
		}
		c.want(t, 1) // no second effect
	})

	t.Run("error/at_most_once_not_done_releases", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s, idem.WithPolicy(idem.AtMostOnce))
		var c counter
		_, err := l.Do(context.Background(), idem.Key("k"), c.fail(idem.NotDone(errBoom)))
		wantErr(t, "Do", err, errBoom)
		rec := get(t, s, "k")
		if rec.Status != idem.StatusReleased {
			t.Fatalf("after NotDone: %s, want released", rec.Status)
		}
		res := do(t, l, idem.Key("k"), c.fn([]byte("sent")))
		c.want(t, 2)
		wantResult(t, res, []byte("sent"), false, 2)
		if res.Fence != rec.Fence+1 {
			t.Fatalf("Do after NotDone: fence %d, want %d (the released attempt's + 1)", res.Fence, rec.Fence+1)
		}
	})

	for _, p := range []idem.Policy{idem.AtLeastOnce, idem.AtMostOnce} {
		t.Run("permanent/"+p.String(), func(t *testing.T) {
			t.Parallel()
			s := newStore(t, h)
			l := ledger(h, s, idem.WithPolicy(p))
			var c counter
			_, err := l.Do(context.Background(), idem.Key("k"), c.fail(idem.Permanent(errBoom)))
			wantErr(t, "Do", err, errBoom)
			rec := get(t, s, "k")
			if rec.Status != idem.StatusFailed || rec.Reason != errBoom.Error() {
				t.Fatalf("after Permanent: {%s, %q}, want {failed, %q}", rec.Status, rec.Reason, errBoom.Error())
			}
			for _, l := range []*idem.Ledger{l, ledger(h, s, idem.WithOwner("other"))} {
				_, err = l.Do(context.Background(), idem.Key("k"), c.fn(nil))
				wantErr(t, "Do on a failed key", err, idem.ErrFailed)
				var fe *idem.FailedError
				if !errors.As(err, &fe) {
					t.Fatalf("err = %T, want *idem.FailedError", err)
				}
				if fe.Reason != errBoom.Error() || fe.Attempt != 1 || fe.Fence != rec.Fence || fe.Key != "k" {
					t.Fatalf("FailedError = %+v, want the stored reason %q, attempt 1, the record's fence %d", fe, errBoom.Error(), rec.Fence)
				}
			}
			c.want(t, 1)
		})
	}

	for _, p := range []idem.Policy{idem.AtLeastOnce, idem.AtMostOnce} {
		t.Run("panic/"+p.String(), func(t *testing.T) {
			t.Parallel()
			s := newStore(t, h)
			l := ledger(h, s, idem.WithPolicy(p))
			type boom struct{ msg string }
			pv := func() (v any) {
				defer func() { v = recover() }()
				_, _ = l.Do(context.Background(), idem.Key("k"), func(context.Context) ([]byte, error) { panic(boom{"kaput"}) })
				return nil
			}()
			if pv != (boom{"kaput"}) {
				t.Fatalf("Do re-panicked with %v, want fn's panic value", pv)
			}
			rec := get(t, s, "k")
			if !strings.Contains(rec.Reason, "kaput") {
				t.Fatalf("after a panic: Reason %q, want it to mention the panic", rec.Reason)
			}
			var c counter
			switch p {
			case idem.AtLeastOnce:
				if rec.Status != idem.StatusReleased {
					t.Fatalf("after a panic under AtLeastOnce: %s, want released", rec.Status)
				}
				res := do(t, l, idem.Key("k"), c.fn([]byte("ok")))
				wantResult(t, res, []byte("ok"), false, 2)
			case idem.AtMostOnce:
				if rec.Status != idem.StatusInProgress || !rec.Lapsed(now(t, s)) {
					t.Fatalf("after a panic under AtMostOnce: {%s, lapsed %v}, want abandoned (lapsed)", rec.Status, rec.Lapsed(now(t, s)))
				}
				_, err := l.Do(context.Background(), idem.Key("k"), c.fn(nil))
				wantErr(t, "Do after a panic under AtMostOnce", err, idem.ErrIndeterminate)
				c.want(t, 0)
			}
		})
	}

	t.Run("typed_run_unencodable_result_abandons", func(t *testing.T) {
		// The effect happened but its result cannot be recorded: the
		// attempt is left for its policy, like a crash.
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s, idem.WithPolicy(idem.AtMostOnce))
		_, _, err := idem.Run(context.Background(), l, idem.Key("k"), func(context.Context) (chan int, error) { return make(chan int), nil })
		if err == nil {
			t.Fatal("Run with a result that JSON cannot encode: no error")
		}
		rec := get(t, s, "k")
		if rec.Status != idem.StatusInProgress || !rec.Lapsed(now(t, s)) {
			t.Fatalf("after an unencodable result: {%s, lapsed %v}, want in_progress and lapsed", rec.Status, rec.Lapsed(now(t, s)))
		}
	})
}
