package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

// TestAnswer: what a claim that was not acquired means, as the Ledger and
// idem serve answer it. A different fingerprint is a mismatch before
// anything else; a released record never comes back unclaimed.
func TestAnswer(t *testing.T) {
	now := time.Date(2025, 6, 1, 10, 0, 0, 0, time.UTC)
	found := func(st store.Status, fp string, leaseUntil time.Time) store.ClaimResult {
		return store.ClaimResult{Now: now, Record: store.Record{Key: "k", Status: st, Fence: 3, Attempt: 2, Owner: "w",
			Fingerprint: fp, Result: []byte("ses-1"), Reason: "boom", LeaseUntil: leaseUntil}}
	}
	for _, c := range []struct {
		name string
		cr   store.ClaimResult
		fp   string
		want store.Answer
	}{
		{"acquired", store.ClaimResult{Acquired: true}, "a", store.AnswerAcquired},
		{"completed", found(store.StatusCompleted, "a", now), "a", store.AnswerDuplicate},
		{"completed, no fingerprint asked", found(store.StatusCompleted, "a", now), "", store.AnswerDuplicate},
		{"completed, none stored", found(store.StatusCompleted, "", now), "a", store.AnswerDuplicate},
		{"completed, another request", found(store.StatusCompleted, "b", now), "a", store.AnswerMismatch},
		{"failed", found(store.StatusFailed, "", now), "a", store.AnswerFailed},
		{"failed, another request", found(store.StatusFailed, "b", now), "a", store.AnswerMismatch},
		{"running", found(store.StatusInProgress, "a", now.Add(2*time.Second)), "a", store.AnswerBusy},
		{"running, another request", found(store.StatusInProgress, "b", now.Add(time.Minute)), "a", store.AnswerMismatch},
		{"lapsed (not taken over)", found(store.StatusInProgress, "a", now), "a", store.AnswerIndeterminate},
		{"lapsed, another request", found(store.StatusInProgress, "b", now), "a", store.AnswerMismatch},
	} {
		got, err := c.cr.Answer(c.fp)
		if err != nil || got != c.want {
			t.Errorf("%s: Answer = %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	if got, err := found(store.StatusReleased, "", now).Answer("a"); err == nil {
		t.Errorf("a released record not taken: Answer = %v, nil; want a store-bug error", got)
	}
}

// TestUndoLostClaim: a claim that landed though its caller never got the
// answer is found by its attempt id and undone as not run; one that did
// not land, or whose attempt no longer holds the key, is left alone.
func TestUndoLostClaim(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	req := store.ClaimRequest{Key: "k", AttemptID: store.NewAttemptID(), Owner: "w", Lease: time.Minute, Retention: time.Hour}

	if found, err := store.UndoLostClaim(ctx, s, req, "lost"); found || err != nil {
		t.Fatalf("nothing landed: found %v, %v; want nothing to undo", found, err)
	}
	if _, err := s.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}
	other := req
	other.AttemptID = store.NewAttemptID()
	if found, err := store.UndoLostClaim(ctx, s, other, "lost"); found || err != nil {
		t.Fatalf("another attempt holds the key: found %v, %v; want it left alone", found, err)
	}
	found, err := store.UndoLostClaim(ctx, s, req, "the answer was lost")
	if !found || err != nil {
		t.Fatalf("the claim landed: found %v, %v; want it undone", found, err)
	}
	rec, err := s.Get(ctx, "k")
	if err != nil || rec.Status != store.StatusReleased || len(rec.Journal) != 1 || !rec.Journal[0].NotRun() {
		t.Fatalf("after the undo: %+v, %v; want released, its attempt marked not run", rec, err)
	}
	if found, err := store.UndoLostClaim(ctx, s, req, "again"); found || err != nil {
		t.Fatalf("undone already: found %v, %v; want nothing to undo", found, err)
	}
}

// TestNewAttemptID: ids are 22 base64url characters and do not repeat.
func TestNewAttemptID(t *testing.T) {
	seen := make(map[string]bool)
	for range 10000 {
		id := store.NewAttemptID()
		if len(id) != 22 || seen[id] {
			t.Fatalf("attempt id %q: length %d, seen before %v", id, len(id), seen[id])
		}
		seen[id] = true
	}
}
