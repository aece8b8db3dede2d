package idem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

// claimFor claims key on l's store as a queue would for Do: the request
// Ledger.ClaimRequest makes, sent by the caller.
func claimFor(t *testing.T, l *idem.Ledger, key idem.OperationKey, opts ...idem.CallOption) *idem.Claimed {
	t.Helper()
	req, err := l.ClaimRequest(key, opts...)
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	cr, err := l.Store().Claim(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return &idem.Claimed{Request: req, Result: cr, Sent: sent}
}

// Do under a claim made for it runs fn once under that claim, records the
// completion through the claim's Complete, and answers a claim that was
// not acquired as its own claim would have been answered.
func TestDoWithClaimed(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	defer st.Close()
	l := idem.New(st, idem.WithPolicy(idem.AtMostOnce))
	key := idem.Key("receipt", 1)

	cl := claimFor(t, l, key, idem.WithCorrelationID("m-1"))
	if !cl.Result.Acquired || cl.Request.Policy != idem.AtMostOnce || cl.Request.Correlation != "m-1" {
		t.Fatalf("claim = %+v, request %+v; want acquired under the ledger's policy and the call's correlation id", cl.Result, cl.Request)
	}
	var completed []store.FinishRequest
	cl.Complete = func(ctx context.Context, req store.FinishRequest) error {
		completed = append(completed, req)
		return st.Finish(ctx, req)
	}
	ran := 0
	res, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { ran++; return []byte("sent"), nil }, idem.WithClaimed(cl))
	if err != nil || ran != 1 || string(res.Value) != "sent" || res.Fence != cl.Result.Record.Fence {
		t.Fatalf("Do = %+v, %v after %d runs; want sent under the claim's fence %d", res, err, ran, cl.Result.Record.Fence)
	}
	if len(completed) != 1 || completed[0].AttemptID != cl.Request.AttemptID || completed[0].Outcome != store.OutcomeCompleted {
		t.Fatalf("Complete got %+v, want one completion of attempt %s", completed, cl.Request.AttemptID)
	}
	rec, err := st.Get(ctx, key.String())
	if err != nil || rec.Status != store.StatusCompleted || string(rec.Result) != "sent" {
		t.Fatalf("record = %+v, %v; want completed with the result", rec, err)
	}

	// A second delivery's claim finds the key done: a replay, fn not run.
	dup := claimFor(t, l, key)
	res, err = l.Do(ctx, key, func(context.Context) ([]byte, error) { ran++; return nil, nil }, idem.WithClaimed(dup))
	if err != nil || !res.Replayed || ran != 1 {
		t.Fatalf("duplicate: %+v, %v after %d runs; want a replay without running fn", res, err, ran)
	}

	// A claim for another key is refused, not run.
	if _, err := l.Do(ctx, idem.Key("receipt", 2), func(context.Context) ([]byte, error) { ran++; return nil, nil }, idem.WithClaimed(dup)); err == nil || ran != 1 {
		t.Fatalf("claim of another key: %v after %d runs; want an error and no run", err, ran)
	}
}

// A claim whose caller's context ended before fn could start is undone:
// fn does not run and the key is free at once, even under AtMostOnce.
func TestDoWithClaimedContextDone(t *testing.T) {
	st := memstore.New()
	defer st.Close()
	l := idem.New(st, idem.WithPolicy(idem.AtMostOnce))
	key := idem.Key("receipt", 3)
	cl := claimFor(t, l, key)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { t.Fatal("fn ran"); return nil, nil }, idem.WithClaimed(cl))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Do = %v, want the context's error", err)
	}
	rec, err := st.Get(context.Background(), key.String())
	if err != nil || rec.Status != store.StatusReleased {
		t.Fatalf("record = %+v, %v; want released", rec, err)
	}
}

// A claim that waited most of its lease before Do got it (a message held
// in a consumer's batch) is undone, not run: its lease could lapse, and
// another delivery take the key, before fn's first heartbeat.
func TestDoWithClaimedWaitedOutItsLease(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	defer st.Close()
	l := idem.New(st, idem.WithLease(90*time.Millisecond))
	key := idem.Key("receipt", 4)
	cl := claimFor(t, l, key)
	time.Sleep(70 * time.Millisecond) // more than two thirds of the lease
	_, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { t.Fatal("fn ran"); return nil, nil }, idem.WithClaimed(cl))
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Do = %v, want ErrLeaseLost", err)
	}
	if rec, err := st.Get(ctx, key.String()); err != nil || rec.Status != store.StatusReleased {
		t.Fatalf("record = %+v, %v; want released at once", rec, err)
	}
	// A fresh claim runs.
	if res, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { return []byte("ok"), nil }, idem.WithClaimed(claimFor(t, l, key))); err != nil || string(res.Value) != "ok" {
		t.Fatalf("fresh claim: %+v, %v", res, err)
	}
}
