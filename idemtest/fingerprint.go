package idemtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
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
		wantResult(t, res, []byte("r"), true, 1)
		res = do(t, l, idem.Key("k"), c.fn(nil)) // no fingerprint: never a mismatch
		wantResult(t, res, []byte("r"), true, 1)
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
		wantResult(t, res, []byte("r"), true, 1)
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

	// A lapsed attempt is not taken over by a different request, under
	// AtLeastOnce nor with TakeLapsed (a Reconcile hook): it may have done
	// its request's effect, and running another request's under the same
	// key would make two effects of one operation (the IETF draft's 422 for
	// a record in any state). The call is a mismatch; fn and the hook do
	// not run, and the record stays as it was, for the same request to
	// take over.
	t.Run("lapsed_is_a_mismatch", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		r := req(h, "k")
		r.Fingerprint = store.FingerprintOf(payload)
		acquire(t, s, r)
		lapse(t, h, s, "k")
		before := get(t, s, "k")
		var c counter
		l := ledger(h, s)
		_, err := l.Do(context.Background(), idem.RawKey("k"), c.fn(nil), idem.Fingerprint(other))
		wantMismatch(t, err, idem.StatusInProgress)
		hook := func(context.Context, idem.Lapsed) ([]byte, bool, error) {
			t.Error("the Reconcile hook ran for another request's lapsed attempt")
			return nil, false, nil
		}
		_, err = l.Do(context.Background(), idem.RawKey("k"), c.fn(nil), idem.Fingerprint(other), idem.WithReconcile(hook))
		wantMismatch(t, err, idem.StatusInProgress)
		c.want(t, 0)
		wantUnchanged(t, "after calls with another fingerprint", get(t, s, "k"), before)
		res := do(t, l, idem.RawKey("k"), c.fn([]byte("r")), idem.Fingerprint(payload))
		if !res.Takeover || res.Fence != before.Fence+1 || res.Attempt != 2 {
			t.Fatalf("the same request on the lapsed key: takeover %v, fence %d, attempt %d; want true, %d (the lapsed attempt's + 1), 2", res.Takeover, res.Fence, res.Attempt, before.Fence+1)
		}
		c.want(t, 1)
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

// testClaimFingerprint holds the Store contract of fingerprints: a claim
// does not take over a lapsed attempt whose fingerprint differs from its
// own (both set), whatever the policy and TakeLapsed; it finds the record
// as it is and writes nothing. A missing fingerprint on either side
// matches any, and a released record is claimable by any request.
func testClaimFingerprint(t *testing.T, h Harness) {
	a, b := store.FingerprintOf([]byte("request a")), store.FingerprintOf([]byte("request b"))
	// lapsed makes key an in_progress record under p with fingerprint fp
	// whose lease has passed.
	lapsed := func(t *testing.T, s store.Store, key string, p idem.Policy, fp string) idem.Record {
		t.Helper()
		r := req(h, key)
		r.Policy, r.Fingerprint, r.Owner = p, fp, "first"
		acquire(t, s, r)
		lapse(t, h, s, key)
		return get(t, s, key)
	}
	taker := func(key string, p idem.Policy, take bool, fp string) store.ClaimRequest {
		r := req(h, key)
		r.Policy, r.TakeLapsed, r.Fingerprint, r.Owner = p, take, fp, "taker"
		return r
	}
	for _, c := range []struct {
		name string
		p    idem.Policy
		take bool
	}{
		{"at_least_once", idem.AtLeastOnce, false},
		{"at_least_once_take_lapsed", idem.AtLeastOnce, true},
		{"at_most_once_take_lapsed", idem.AtMostOnce, true},
	} {
		t.Run("lapsed_other_not_taken/"+c.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, h)
			before := lapsed(t, s, "k", c.p, a)
			cr := claim(t, s, taker("k", c.p, c.take, b))
			if cr.Acquired || cr.Takeover {
				t.Fatalf("claim with another fingerprint of a lapsed attempt: acquired %v, takeover %v; want not acquired", cr.Acquired, cr.Takeover)
			}
			wantUnchanged(t, "the record the claim found", cr.Record, before)
			if !cr.Record.Lapsed(cr.Now) {
				t.Fatal("the record the claim found is not lapsed")
			}
			wantUnchanged(t, "the record after the claim", get(t, s, "k"), before)
			// The same request still takes it over.
			cr = acquire(t, s, taker("k", c.p, c.take, a))
			if !cr.Takeover || cr.Record.Fence != before.Fence+1 || cr.Record.Attempt != 2 || cr.Record.Fingerprint != a {
				t.Fatalf("claim with the same fingerprint after it: takeover %v, fence %d, attempt %d, fingerprint %q; want true, %d (the lapsed attempt's + 1), 2, %q",
					cr.Takeover, cr.Record.Fence, cr.Record.Attempt, cr.Record.Fingerprint, before.Fence+1, a)
			}
		})
	}

	for _, c := range []struct{ name, stored, requested string }{
		{"same", a, a},
		{"request_without", a, ""},
		{"record_without", "", b},
	} {
		t.Run("lapsed_taken/"+c.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t, h)
			before := lapsed(t, s, "k", idem.AtLeastOnce, c.stored)
			r := taker("k", idem.AtLeastOnce, false, c.requested)
			cr := claim(t, s, r)
			if !cr.Acquired || !cr.Takeover || cr.Record.Fence != before.Fence+1 || cr.Record.Attempt != 2 || cr.Record.Owner != "taker" {
				t.Fatalf("claim (fingerprint %q) of a lapsed attempt (fingerprint %q): acquired %v, takeover %v, fence %d, attempt %d, owner %q; want true, true, %d (the lapsed attempt's + 1), 2, taker",
					c.requested, c.stored, cr.Acquired, cr.Takeover, cr.Record.Fence, cr.Record.Attempt, cr.Record.Owner, before.Fence+1)
			}
			if rec := get(t, s, "k"); rec.Fingerprint != c.requested || rec.Fence != cr.Record.Fence || rec.AttemptID != r.AttemptID {
				t.Fatalf("after the takeover: fingerprint %q, fence %d, attempt id %q; want the taker's %q, %d, %q", rec.Fingerprint, rec.Fence, rec.AttemptID, c.requested, cr.Record.Fence, r.AttemptID)
			}
		})
	}

	t.Run("released_other_acquired", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		r := req(h, "k")
		r.Fingerprint = a
		first := acquire(t, s, r)
		noErr(t, "Release", s.Finish(context.Background(), store.FinishRequest{Key: "k", Fence: first.Record.Fence, AttemptID: first.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: "not done"}))
		cr := claim(t, s, taker("k", idem.AtLeastOnce, false, b))
		if !cr.Acquired || cr.Takeover || cr.Record.Fence != first.Record.Fence+1 || cr.Record.Fingerprint != b {
			t.Fatalf("claim with another fingerprint of a released key: acquired %v, takeover %v, fence %d, fingerprint %q; want true, false, %d (the released attempt's + 1), %q",
				cr.Acquired, cr.Takeover, cr.Record.Fence, cr.Record.Fingerprint, first.Record.Fence+1, b)
		}
	})

	t.Run("batch", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		bc, ok := s.(store.BatchClaimer)
		if !ok {
			t.Skip("the store does not implement store.BatchClaimer")
		}
		for _, k := range []string{"other", "same", "none"} {
			r := req(h, k)
			r.Fingerprint, r.Owner = a, "first"
			acquire(t, s, r)
		}
		rel := req(h, "released")
		rel.Fingerprint = a
		cr := acquire(t, s, rel)
		noErr(t, "Release", s.Finish(context.Background(), store.FinishRequest{Key: "released", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: "not done"}))
		for _, k := range []string{"other", "same", "none"} {
			lapse(t, h, s, k)
		}
		before := get(t, s, "other")
		reqs := []store.ClaimRequest{
			taker("other", idem.AtLeastOnce, false, b),
			taker("same", idem.AtLeastOnce, false, a),
			taker("new", idem.AtLeastOnce, false, b),
			taker("none", idem.AtLeastOnce, false, ""),
			taker("released", idem.AtLeastOnce, false, b),
		}
		res, err := bc.ClaimBatch(context.Background(), reqs)
		noErr(t, "ClaimBatch", err)
		if len(res) != len(reqs) {
			t.Fatalf("ClaimBatch returned %d results for %d requests", len(res), len(reqs))
		}
		acquired := []bool{false, true, true, true, true}
		takeover := []bool{false, true, false, true, false}
		for i, r := range res {
			if r.Err != nil || r.Record.Key != reqs[i].Key || r.Acquired != acquired[i] || r.Takeover != takeover[i] {
				t.Fatalf("result %d (%q): key %q, acquired %v, takeover %v, err %v; want acquired %v, takeover %v",
					i, reqs[i].Key, r.Record.Key, r.Acquired, r.Takeover, r.Err, acquired[i], takeover[i])
			}
		}
		wantUnchanged(t, "the lapsed record of another request the batch found", res[0].Record, before)
		wantUnchanged(t, "the lapsed record of another request after the batch", get(t, s, "other"), before)
	})
}

// wantUnchanged fails the test unless rec is the record was as found
// before: the same attempt (status, fence, attempt, owner, fingerprint,
// policy, lease) and journal.
func wantUnchanged(t testing.TB, what string, rec, was idem.Record) {
	t.Helper()
	if rec.Status != was.Status || rec.Fence != was.Fence || rec.Attempt != was.Attempt || rec.AttemptID != was.AttemptID || rec.Owner != was.Owner ||
		rec.Fingerprint != was.Fingerprint || rec.Policy != was.Policy || !sameTime(rec.LeaseUntil, was.LeaseUntil) {
		t.Fatalf("%s: {%s, fence %d, attempt %d, attempt id %q, owner %q, fingerprint %q, %s, lease until %v}; want it unchanged: {%s, fence %d, attempt %d, attempt id %q, owner %q, fingerprint %q, %s, lease until %v}",
			what, rec.Status, rec.Fence, rec.Attempt, rec.AttemptID, rec.Owner, rec.Fingerprint, rec.Policy, rec.LeaseUntil,
			was.Status, was.Fence, was.Attempt, was.AttemptID, was.Owner, was.Fingerprint, was.Policy, was.LeaseUntil)
	}
	if len(rec.Journal) != len(was.Journal) {
		t.Fatalf("%s: journal of %d entries, want %d (unchanged)", what, len(rec.Journal), len(was.Journal))
	}
	if n := len(rec.Journal); n > 0 && (rec.Journal[n-1].Fence != was.Journal[n-1].Fence || rec.Journal[n-1].Outcome != was.Journal[n-1].Outcome) {
		t.Fatalf("%s: last journal entry %+v, want %+v (unchanged)", what, rec.Journal[n-1], was.Journal[n-1])
	}
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
