package idem_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// TestClaimAnswer: the answers Do gives to a claim that was not acquired,
// as ClaimAnswer gives them to callers that claim through the store.Store.
func TestClaimAnswer(t *testing.T) {
	now := time.Date(2025, 6, 1, 10, 0, 0, 0, time.UTC)
	rec := func(st idem.Status, fp string, leaseUntil time.Time) store.ClaimResult {
		return store.ClaimResult{Now: now, Record: idem.Record{Key: "k", Status: st, Fence: 3, Attempt: 2, Owner: "w",
			Fingerprint: fp, Result: []byte("ses-1"), Reason: "boom", LeaseUntil: leaseUntil}}
	}
	req := store.ClaimRequest{Key: "k", Fingerprint: "a"}
	res, err := idem.ClaimAnswer(req, rec(idem.StatusCompleted, "a", now))
	if err != nil || !res.Replayed || string(res.Value) != "ses-1" || res.Fence != 3 || res.Attempt != 2 {
		t.Fatalf("completed: %+v %v", res, err)
	}
	if _, err := idem.ClaimAnswer(store.ClaimRequest{Key: "k"}, rec(idem.StatusCompleted, "a", now)); err != nil {
		t.Fatalf("completed, no fingerprint: %v", err)
	}
	for _, st := range []idem.Status{idem.StatusCompleted, idem.StatusFailed, idem.StatusInProgress} {
		var me *idem.MismatchError
		if _, err := idem.ClaimAnswer(req, rec(st, "b", now.Add(time.Minute))); !errors.As(err, &me) || me.Status != st {
			t.Fatalf("%s, other fingerprint: %v", st, err)
		}
	}
	var fe *idem.FailedError
	if _, err := idem.ClaimAnswer(req, rec(idem.StatusFailed, "", now)); !errors.As(err, &fe) || fe.Reason != "boom" {
		t.Fatalf("failed: %v", err)
	}
	var ie *idem.IndeterminateError
	if _, err := idem.ClaimAnswer(req, rec(idem.StatusInProgress, "a", now)); !errors.As(err, &ie) || ie.Fence != 3 {
		t.Fatalf("lapsed: %v", err)
	}
	var ip *idem.InProgressError
	if _, err := idem.ClaimAnswer(req, rec(idem.StatusInProgress, "", now.Add(2*time.Second))); !errors.As(err, &ip) || ip.RetryAfter != 2*time.Second {
		t.Fatalf("busy: %v", err)
	}
	for _, cr := range []store.ClaimResult{rec(idem.StatusReleased, "", now), {Acquired: true}} {
		if _, err := idem.ClaimAnswer(req, cr); err == nil || errors.Is(err, idem.ErrInProgress) || errors.Is(err, idem.ErrMismatch) {
			t.Fatalf("%+v: %v, want a plain error", cr, err)
		}
	}
}
