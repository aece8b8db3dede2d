package memstore_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

func deepCopy(r store.Record) store.Record {
	r.Result = append([]byte(nil), r.Result...)
	r.Journal = append([]store.JournalEntry(nil), r.Journal...)
	return r
}

// TestRecordsHandedOutDoNotChange: memstore changes its records in place, so
// every record it hands out (a claim's, acquired or not, Get's, List's,
// Resolve's) must be a snapshot that later calls on the same key leave alone,
// and slices the caller passes in or gets back must not be the store's.
func TestRecordsHandedOutDoNotChange(t *testing.T) {
	ctx := context.Background()
	clock := idemtest.NewClock(idemtest.ClockStart)
	s := memstore.New(memstore.WithClock(clock.Now))
	var kept []store.Record
	var want []store.Record
	keep := func(r store.Record) {
		kept = append(kept, r)
		want = append(want, deepCopy(r))
	}
	claim := func(owner string) store.ClaimResult {
		t.Helper()
		res, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: owner, Lease: time.Second, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		keep(res.Record)
		return res
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	first := claim("a") // acquired
	dup := claim("b")   // not acquired: borrows the journal
	if !first.Acquired || dup.Acquired {
		t.Fatalf("claims: %+v, %+v", first, dup)
	}
	_, err := s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: first.Record.Fence, AttemptID: first.Record.AttemptID, Lease: 2 * time.Second}) // writes the journal entry both hold
	must(err)
	got, err := s.Get(ctx, "k")
	must(err)
	keep(got)
	clock.Advance(3 * time.Second)
	taken := claim("c") // takes over: marks the first attempt's entry lapsed
	if !taken.Acquired || !taken.Takeover {
		t.Fatalf("takeover: %+v", taken)
	}
	if _, err := s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: first.Record.Fence, AttemptID: first.Record.AttemptID, Lease: time.Second}); err != store.ErrLeaseLost { // late: LateFinish on the first attempt
		t.Fatalf("stale Extend: %v", err)
	}
	result := []byte("result")
	must(s.Finish(ctx, store.FinishRequest{Key: "k", Fence: taken.Record.Fence, AttemptID: taken.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: result, Retention: time.Hour}))
	result[0] = 'X' // the caller's slice is not the store's
	replay := claim("d")
	if string(replay.Record.Result) != "result" {
		t.Fatalf("replayed result %q, want %q", replay.Record.Result, "result")
	}
	replay.Record.Result[0] = 'Y' // nor is the one handed back
	got, err = s.Get(ctx, "k")
	must(err)
	if string(got.Result) != "result" {
		t.Fatalf("stored result %q after the caller changed a replayed one, want %q", got.Result, "result")
	}
	replay.Record.Result[0] = 'r'
	list, err := s.List(ctx, store.ListQuery{})
	must(err)
	keep(list[0])
	resolution := store.ResolveRequest{Key: "k", Done: true, Result: []byte("fixed"), By: "op"}
	rec, err := s.Resolve(ctx, resolution)
	must(err)
	keep(rec)
	resolution.Result[0] = 'Z'
	got, err = s.Get(ctx, "k")
	must(err)
	if string(got.Result) != "fixed" {
		t.Fatalf("stored result %q after the caller changed its slice, want %q", got.Result, "fixed")
	}
	got.Journal[0].Owner = "mallory" // a reader's changes stay in its copy
	again, err := s.Get(ctx, "k")
	must(err)
	if again.Journal[0].Owner != "a" {
		t.Fatalf("stored journal owner %q after a reader changed its copy, want a", again.Journal[0].Owner)
	}
	must(s.Delete(ctx, "k"))
	claim("e") // a new record under the same key

	for i := range kept {
		if !reflect.DeepEqual(kept[i], want[i]) {
			t.Errorf("record %d changed after it was handed out:\n got %+v\nwant %+v", i, kept[i], want[i])
		}
	}
}

// TestDroppedRecordsReusedSafely: memstore reuses the memory of deleted and
// swept records for new keys; records handed out before must not see it.
func TestDroppedRecordsReusedSafely(t *testing.T) {
	ctx := context.Background()
	clock := idemtest.NewClock(idemtest.ClockStart)
	s := memstore.New(memstore.WithClock(clock.Now))
	var kept, want []store.Record
	for i := range 200 {
		key := fmt.Sprint("k", i)
		res, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: key, Owner: "w", Lease: time.Second, Retention: time.Second})
		if err != nil || !res.Acquired {
			t.Fatalf("claim %s: %v %+v", key, err, res)
		}
		if err := s.Finish(ctx, store.FinishRequest{Key: key, Fence: res.Record.Fence, AttemptID: res.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte(key), Retention: time.Second}); err != nil {
			t.Fatal(err)
		}
		got, err := s.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		kept = append(kept, res.Record, got)
		want = append(want, deepCopy(res.Record), deepCopy(got))
		switch i % 3 {
		case 0:
			if err := s.Delete(ctx, key); err != nil {
				t.Fatal(err)
			}
		case 1:
			clock.Advance(time.Second)
			if _, err := s.Sweep(ctx, 1000); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range kept {
		if !reflect.DeepEqual(kept[i], want[i]) {
			t.Fatalf("record %d changed after it was handed out:\n got %+v\nwant %+v", i, kept[i], want[i])
		}
	}
}
