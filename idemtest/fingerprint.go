package idemtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/idemkit/idem"
)

// testFingerprint holds request fingerprints: a key reused for a different
// request is refused with ErrMismatch instead of replaying another
// request's result (Powertools' payload validation).
func testFingerprint(t *testing.T, h Harness) {
	payload := []byte(`{"order":8891,"amount":100}`)
	other := []byte(`{"order":8891,"amount":999}`)

	t.Run("stored_as_sha256", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		var c counter
		do(t, ledger(h, s), idem.Key("k"), c.fn(nil), idem.Fingerprint(payload))
		sum := sha256.Sum256(payload)
		if got := get(t, s, "k").Fingerprint; got != hex.EncodeToString(sum[:]) {
			t.Fatalf("stored fingerprint %q, want the hex sha256 of the request", got)
		}
	})

	t.Run("completed", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s)
		var c counter
		do(t, l, idem.Key("k"), c.fn([]byte("r")), idem.Fingerprint(payload))
		_, err := l.Do(context.Background(), idem.Key("k"), c.fn(nil), idem.Fingerprint(other))
		wantMismatch(t, err, idem.StatusCompleted)
		res := do(t, l, idem.Key("k"), c.fn(nil), idem.Fingerprint(payload))
		wantResult(t, res, []byte("r"), true, 1, 1)
		res = do(t, l, idem.Key("k"), c.fn(nil)) // no fingerprint: never a mismatch
		wantResult(t, res, []byte("r"), true, 1, 1)
		c.want(t, 1)
	})

	t.Run("failed", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s)
		var c counter
		_, err := l.Do(context.Background(), idem.Key("k"), c.fail(idem.Permanent(errBoom)), idem.Fingerprint(payload))
		wantErr(t, "Do", err, errBoom)
		_, err = l.Do(context.Background(), idem.Key("k"), c.fn(nil), idem.Fingerprint(other))
		wantMismatch(t, err, idem.StatusFailed)
		_, err = l.Do(context.Background(), idem.Key("k"), c.fn(nil), idem.Fingerprint(payload))
		wantErr(t, "Do with the same fingerprint on a failed key", err, idem.ErrFailed)
		_, err = l.Do(context.Background(), idem.Key("k"), c.fn(nil))
		wantErr(t, "Do without a fingerprint on a failed key", err, idem.ErrFailed)
		c.want(t, 1)
	})

	t.Run("first_call_without", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s)
		var c counter
		do(t, l, idem.Key("k"), c.fn([]byte("r")))
		res := do(t, l, idem.Key("k"), c.fn(nil), idem.Fingerprint(other))
		wantResult(t, res, []byte("r"), true, 1, 1)
		c.want(t, 1)
	})

	// A key reused for a different request while its first attempt runs is
	// a mismatch, as after it finished (the IETF draft's 422 for a record
	// in any state); the same request is busy.
	t.Run("in_progress_is_a_mismatch", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		r := req(h, "k")
		sum := sha256.Sum256(payload)
		r.Fingerprint, r.Lease = hex.EncodeToString(sum[:]), heldLease
		held := acquire(t, s, r)
		var c counter
		_, err := ledger(h, s).Do(context.Background(), idem.RawKey("k"), c.fn(nil), idem.Fingerprint(other))
		wantMismatch(t, err, idem.StatusInProgress)
		_, err = ledger(h, s).Do(context.Background(), idem.RawKey("k"), c.fn(nil), idem.Fingerprint(payload))
		wantBusy(t, err, held.Record, r.Lease)
		c.want(t, 0)
	})

	t.Run("released_takes_the_new_fingerprint", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		l := ledger(h, s)
		var c counter
		_, err := l.Do(context.Background(), idem.Key("k"), c.fail(errBoom), idem.Fingerprint(payload))
		wantErr(t, "Do", err, errBoom)
		do(t, l, idem.Key("k"), c.fn([]byte("r")), idem.Fingerprint(other))
		_, err = l.Do(context.Background(), idem.Key("k"), c.fn(nil), idem.Fingerprint(payload))
		wantMismatch(t, err, idem.StatusCompleted)
	})
}

// wantMismatch fails the test unless err is an *idem.MismatchError about a
// record with status st.
func wantMismatch(t testing.TB, err error, st idem.Status) {
	t.Helper()
	if !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("Do with another fingerprint: err = %v, want ErrMismatch", err)
	}
	var me *idem.MismatchError
	if !errors.As(err, &me) || me.Status != st {
		t.Fatalf("err = %#v, want *idem.MismatchError with status %s", err, st)
	}
}
