package pgstore

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/idemkit/idem/store"
)

// TestImplicitJournal: the calls on a key's first attempt (a claim, single
// or in a batch started either way, heartbeats, its completion, failure or
// release, alone or in a batch) keep the row's journal NULL, with the
// correlation id in its column; the others (an abandon, a takeover, a
// claim of a released key, a resolution) write it out. Either way every
// call's record is what Get reads back (the model test holds the journals
// themselves to the store package).
func TestImplicitJournal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clocks := new(testClocks)
	s := newTestStore(t, clocks)
	implicit := func(key string) bool {
		t.Helper()
		var isNull bool
		var corr string
		if err := s.Pool().QueryRow(ctx, "SELECT journal IS NULL, correlation FROM "+s.Table()+" WHERE key = $1", key).Scan(&isNull, &corr); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if rec, err := s.Get(ctx, key); err != nil || rec.Journal[len(rec.Journal)-1].Correlation != corr {
			t.Fatalf("%s: correlation column %q, record %+v, %v", key, corr, rec, err)
		}
		return isNull
	}
	claim := func(key string, lease time.Duration) store.ClaimResult {
		t.Helper()
		r := req(key)
		r.Correlation, r.Lease = "msg-"+key, lease
		cr, err := s.Claim(ctx, r)
		if err != nil || !cr.Acquired {
			t.Fatalf("Claim %q: %+v, %v", key, cr, err)
		}
		if got, err := s.Get(ctx, key); err != nil || !reflect.DeepEqual(got, cr.Record) {
			t.Fatalf("Claim %q returned\n%+v\nGet reads\n%+v (%v)", key, cr.Record, got, err)
		}
		return cr
	}
	want := func(key string, isImplicit bool) {
		t.Helper()
		if got := implicit(key); got != isImplicit {
			t.Fatalf("%s: journal implicit %v, want %v", key, got, isImplicit)
		}
	}

	claimed := map[string]store.ClaimResult{}
	for _, k := range []string{"done", "done-why", "failed", "released", "extended", "abandoned", "resolved", "lapsed", "batch-done", "batch-done-2"} {
		claimed[k] = claim(k, time.Minute)
		want(k, true)
	}
	end := func(key string, o store.Outcome, reason string) store.FinishRequest {
		cr := claimed[key]
		return store.FinishRequest{Key: key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: o,
			Result: []byte("ok"), Reason: reason, Retention: time.Hour}
	}
	if err := s.Finish(ctx, end("done", store.OutcomeCompleted, "")); err != nil {
		t.Fatal(err)
	}
	want("done", true)
	// A completion with a reason: the attempt's entry keeps the reason,
	// which the columns do not say.
	if err := s.Finish(ctx, end("done-why", store.OutcomeCompleted, "sent")); err != nil {
		t.Fatal(err)
	}
	want("done-why", false)
	if rec, err := s.Get(ctx, "done-why"); err != nil || rec.Reason != "" || rec.Journal[0].Reason != "sent" || rec.Journal[0].Outcome != store.OutcomeCompleted {
		t.Fatalf("a completion with a reason: %+v, %v", rec, err)
	}
	if err := s.Finish(ctx, end("failed", store.OutcomeFailed, "card declined")); err != nil {
		t.Fatal(err)
	}
	want("failed", true)
	if err := s.Finish(ctx, end("released", store.OutcomeReleased, "try later")); err != nil {
		t.Fatal(err)
	}
	want("released", true)
	if _, err := s.Extend(ctx, store.ExtendRequest{Key: "extended", Fence: claimed["extended"].Record.Fence, AttemptID: claimed["extended"].Record.AttemptID, Lease: time.Hour}); err != nil {
		t.Fatal(err)
	}
	want("extended", true)
	if errs, err := s.FinishBatch(ctx, []store.FinishRequest{end("batch-done", store.OutcomeCompleted, ""), end("batch-done-2", store.OutcomeCompleted, "")}); err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("FinishBatch: %v %v", errs, err)
	}
	want("batch-done", true)
	want("batch-done-2", true)
	if err := s.Finish(ctx, end("abandoned", store.OutcomeAbandoned, "crashed")); err != nil {
		t.Fatal(err)
	}
	want("abandoned", false)
	if rec, err := s.Get(ctx, "abandoned"); err != nil || rec.AttemptID != "" || rec.Journal[0].AttemptID != claimed["abandoned"].Record.AttemptID {
		t.Fatalf("abandoned: %+v, %v; want no attempt id in the record, the attempt's in its entry", rec, err)
	}
	if _, err := s.Resolve(ctx, store.ResolveRequest{Key: "resolved", Fence: claimed["resolved"].Record.Fence, Done: true, Result: []byte("r"), Reason: "checked", By: "ops"}); err != nil {
		t.Fatal(err)
	}
	want("resolved", false)
	for _, start := range batchStarts {
		start.prime(s)
		reqs := []store.ClaimRequest{req("batch-a-" + start.name), req("batch-b-" + start.name)}
		res, err := s.ClaimBatch(ctx, reqs)
		if err != nil || !res[0].Acquired || !res[1].Acquired {
			t.Fatalf("ClaimBatch (%s): %+v, %v", start.name, res, err)
		}
		for i, r := range reqs {
			want(r.Key, true)
			if got, err := s.Get(ctx, r.Key); err != nil || !reflect.DeepEqual(got, res[i].Record) {
				t.Fatalf("ClaimBatch (%s) returned\n%+v\nGet reads\n%+v (%v)", start.name, res[i].Record, got, err)
			}
		}
	}

	// A second attempt writes the journal out: over a released key, and
	// over a lapsed one (a takeover).
	cr := claim("released", time.Minute)
	want("released", false)
	if len(cr.Record.Journal) != 2 || cr.Record.Journal[0].Outcome != store.OutcomeReleased || cr.Record.Journal[0].Reason != "try later" {
		t.Fatalf("the released key's journal after a second claim: %+v", cr.Record.Journal)
	}
	clocks.advance(t, 2*time.Minute)
	cr = claim("lapsed", time.Minute)
	want("lapsed", false)
	if !cr.Takeover || len(cr.Record.Journal) != 2 || cr.Record.Journal[0].Outcome != store.OutcomeLapsed || cr.Record.Journal[0].Correlation != "msg-lapsed" {
		t.Fatalf("the lapsed key's journal after a takeover: %+v", cr.Record.Journal)
	}
}

// TestImplicitJournalOff: two stores on one table, one with implicit
// journals and one WithImplicitJournal(false) (a rolling upgrade's
// setting), take turns on the same keys. The second writes every journal
// it touches out in full, the first keeps what it finds written out, and
// both read the same records.
func TestImplicitJournalOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clocks := new(testClocks)
	on := newTestStore(t, clocks)
	off, err := New(ctx, testPool(t), WithSchema(on.names.schema), withClockTable(clocks.get(t, on.names.schema)), WithImplicitJournal(false))
	if err != nil {
		t.Fatal(err)
	}
	defer off.Close()
	journalNull := func(key string) bool {
		t.Helper()
		var isNull bool
		if err := on.Pool().QueryRow(ctx, "SELECT journal IS NULL FROM "+on.Table()+" WHERE key = $1", key).Scan(&isNull); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		return isNull
	}
	same := func(key string) store.Record {
		t.Helper()
		a, errA := on.Get(ctx, key)
		b, errB := off.Get(ctx, key)
		if errA != nil || errB != nil || !reflect.DeepEqual(a, b) {
			t.Fatalf("%s reads differently:\n%+v %v\n%+v %v", key, a, errA, b, errB)
		}
		return a
	}
	claimed := map[string]store.ClaimResult{}
	end := func(key string, o store.Outcome, reason string) store.FinishRequest {
		cr := claimed[key]
		return store.FinishRequest{Key: key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: o,
			Result: []byte("ok"), Reason: reason, Retention: time.Hour}
	}
	// Written implicitly, ended by the store that writes journals out.
	if claimed["a"], err = on.Claim(ctx, req("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := off.Extend(ctx, store.ExtendRequest{Key: "a", Fence: claimed["a"].Record.Fence, AttemptID: claimed["a"].Record.AttemptID, Lease: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if journalNull("a") {
		t.Fatal("a heartbeat WithImplicitJournal(false) left the journal implicit")
	}
	if err := on.Finish(ctx, end("a", store.OutcomeCompleted, "")); err != nil {
		t.Fatal(err)
	}
	if journalNull("a") {
		t.Fatal("the completion of a written-out journal made it implicit")
	}
	if r := same("a"); len(r.Journal) != 1 || r.Journal[0].Outcome != store.OutcomeCompleted || r.Journal[0].Correlation != "c" {
		t.Fatalf("a's journal: %+v", r.Journal)
	}
	// Claimed and ended by the store that writes journals out, alone and
	// in batches.
	if claimed["b"], err = off.Claim(ctx, req("b")); err != nil {
		t.Fatal(err)
	}
	res, err := off.ClaimBatch(ctx, []store.ClaimRequest{req("c"), req("d"), req("e")})
	if err != nil || !res[0].Acquired || !res[1].Acquired || !res[2].Acquired {
		t.Fatalf("ClaimBatch: %+v %v", res, err)
	}
	claimed["c"], claimed["d"] = res[0], res[1]
	if err := off.Finish(ctx, end("b", store.OutcomeFailed, "declined")); err != nil {
		t.Fatal(err)
	}
	if errs, err := off.FinishBatch(ctx, []store.FinishRequest{end("c", store.OutcomeCompleted, ""), end("d", store.OutcomeCompleted, "")}); err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("FinishBatch: %v %v", errs, err)
	}
	for _, k := range []string{"b", "c", "d", "e"} {
		if journalNull(k) {
			t.Fatalf("%s: WithImplicitJournal(false) wrote an implicit journal", k)
		}
		same(k)
	}
}
