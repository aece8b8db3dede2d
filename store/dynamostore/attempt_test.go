package dynamostore

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/store"
)

// entryOf returns the journal entry of fence in key's item as stored.
func entryOf(t testing.TB, it map[string]types.AttributeValue, fence int64) map[string]types.AttributeValue {
	t.Helper()
	j, ok := it[attrJournal].(*types.AttributeValueMemberM)
	if !ok {
		t.Fatalf("item without a journal: %v", it)
	}
	e, ok := j.Value[strconv.FormatInt(fence, 10)].(*types.AttributeValueMemberM)
	if !ok {
		t.Fatalf("no journal entry for fence %d: %v", fence, j.Value)
	}
	return e.Value
}

// sOf returns a string attribute of m, "" if absent.
func sOf(m map[string]types.AttributeValue, name string) string {
	if v, ok := m[name].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

// abandon is the request that abandons cr's attempt with reason.
func abandon(cr store.ClaimResult, reason string) store.FinishRequest {
	return store.FinishRequest{Key: cr.Record.Key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID,
		Outcome: store.OutcomeAbandoned, Reason: reason}
}

// TestAttemptItem: a claim stores its attempt id in the item and in its
// journal entry, and its fence is the store's clock in microseconds; a
// write naming the fence with another attempt id is refused without
// touching the holder's entry; an abandon removes the item's attempt id
// (the journal entry keeps it), so a second abandon, or any other write
// of the attempt, is refused.
func TestAttemptItem(t *testing.T) {
	clock := idemtest.NewClock(idemtest.ClockStart)
	s := New(testClient(t), newTable(t), WithClock(clock.Now))
	ctx := context.Background()
	cr, err := s.Claim(ctx, claimReq("k"))
	if err != nil || !cr.Acquired {
		t.Fatalf("Claim: %+v, %v", cr, err)
	}
	f, id := cr.Record.Fence, cr.Record.AttemptID
	if f != clock.Now().UnixMicro() || id == "" {
		t.Fatalf("claim's fence %d attempt %q, want %d (the clock in µs) and the request's attempt id", f, id, clock.Now().UnixMicro())
	}
	it := rawItem(t, s, "k")
	if got := sOf(it, attrAttemptID); got != id {
		t.Fatalf("item's %s = %q, want %q", attrAttemptID, got, id)
	}
	if got := sOf(entryOf(t, it, f), store.WireAttemptID); got != id {
		t.Fatalf("journal entry's %s = %q, want %q", store.WireAttemptID, got, id)
	}

	other := complete(cr, "theirs")
	other.AttemptID = "another-attempt"
	if err := s.Finish(ctx, other); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Finish under the holder's fence with another attempt id = %v, want ErrLeaseLost", err)
	}
	if _, err := s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: f, AttemptID: "another-attempt", Lease: time.Hour}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Extend under the holder's fence with another attempt id = %v, want ErrLeaseLost", err)
	}
	if rec, err := s.Get(ctx, "k"); err != nil || rec.Status != store.StatusInProgress || rec.AttemptID != id || !rec.Journal[0].LateFinish.IsZero() {
		t.Fatalf("after the refused writes: %+v, %v; want the holder's record untouched", rec, err)
	}

	clock.Advance(time.Second)
	if err := s.Finish(ctx, abandon(cr, "panic")); err != nil {
		t.Fatalf("abandon: %v", err)
	}
	it = rawItem(t, s, "k")
	if _, ok := it[attrAttemptID]; ok {
		t.Fatalf("item after an abandon has %s %v, want none", attrAttemptID, it[attrAttemptID])
	}
	if got := sOf(entryOf(t, it, f), store.WireAttemptID); got != id {
		t.Fatalf("journal entry's %s after the abandon = %q, want %q", store.WireAttemptID, got, id)
	}
	rec, err := s.Get(ctx, "k")
	if err != nil || rec.Status != store.StatusInProgress || rec.AttemptID != "" || !rec.Lapsed(clock.Now()) ||
		rec.Journal[0].Outcome != store.OutcomeAbandoned || rec.Journal[0].AttemptID != id {
		t.Fatalf("after the abandon: %+v, %v; want in_progress, lapsed, no attempt id, the entry abandoned with its id", rec, err)
	}
	if err := s.Finish(ctx, abandon(cr, "again")); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("second abandon = %v, want ErrLeaseLost", err)
	}
	if err := s.Finish(ctx, complete(cr, "r")); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Complete after the abandon = %v, want ErrLeaseLost", err)
	}
	if _, err := s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: f, AttemptID: id, Lease: time.Minute}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Extend after the abandon = %v, want ErrLeaseLost", err)
	}
	if after, err := s.Get(ctx, "k"); err != nil || after.Reason != "panic" || !after.Journal[0].LateFinish.IsZero() {
		t.Fatalf("after the refused writes: %+v, %v; want the abandon's record, no late finish (the attempt had ended)", after, err)
	}
}

// TestLostAbandonAnswer: an abandon whose answer was lost is retried by
// the client; the retry finds the item without the attempt id, written by
// its own call, and succeeds. A second abandon is refused.
func TestLostAbandonAnswer(t *testing.T) {
	p := newProxy(t)
	clock := idemtest.NewClock(idemtest.ClockStart)
	s := New(newClient(p.URL()), newTable(t), WithClock(clock.Now))
	ctx := context.Background()
	cr, err := s.Claim(ctx, claimReq("k"))
	if err != nil {
		t.Fatal(err)
	}
	p.Drop("UpdateItem", 1)
	if err := s.Finish(ctx, abandon(cr, "crash")); err != nil {
		t.Fatalf("abandon whose answer was lost: %v", err)
	}
	if p.Calls("UpdateItem") < 2 {
		t.Fatalf("UpdateItem sent %d times, want a retry", p.Calls("UpdateItem"))
	}
	if err := s.Finish(ctx, abandon(cr, "crash")); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("second abandon = %v, want ErrLeaseLost", err)
	}
	rec, err := s.Get(ctx, "k")
	if err != nil || rec.AttemptID != "" || rec.Journal[0].Outcome != store.OutcomeAbandoned || rec.Journal[0].AttemptID != cr.Record.AttemptID {
		t.Fatalf("after: %+v, %v", rec, err)
	}
}

// TestItemWithoutAttemptID: an item written before attempt ids (no
// attempt_id, journal entries without one) reads as attempt id "", no
// attempt can finish or extend it (nor mark its entry), and once its
// lease passes it is taken over as usual, continuing its fence.
func TestItemWithoutAttemptID(t *testing.T) {
	clock := idemtest.NewClock(idemtest.ClockStart)
	s := New(testClient(t), newTable(t), WithClock(clock.Now))
	ctx := context.Background()
	cr, err := s.Claim(ctx, claimReq("old"))
	if err != nil {
		t.Fatal(err)
	}
	f := cr.Record.Fence
	_, err = s.Client().UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                aws.String(s.Table()),
		Key:                      s.keyOf("old"),
		UpdateExpression:         aws.String("REMOVE #a, #j.#f.#i"),
		ExpressionAttributeNames: map[string]string{"#a": attrAttemptID, "#j": attrJournal, "#f": strconv.FormatInt(f, 10), "#i": store.WireAttemptID},
	})
	if err != nil {
		t.Fatalf("making an item of before attempt ids: %v", err)
	}
	rec, err := s.Get(ctx, "old")
	if err != nil || rec.AttemptID != "" || rec.Journal[0].AttemptID != "" || rec.Fence != f {
		t.Fatalf("an item without attempt ids reads as %+v, %v; want attempt id \"\"", rec, err)
	}
	if err := s.Finish(ctx, complete(cr, "r")); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Complete of an item without attempt id = %v, want ErrLeaseLost", err)
	}
	if _, err := s.Extend(ctx, store.ExtendRequest{Key: "old", Fence: f, AttemptID: cr.Record.AttemptID, Lease: time.Minute}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Extend of an item without attempt id = %v, want ErrLeaseLost", err)
	}
	if rec, err := s.Get(ctx, "old"); err != nil || rec.Status != store.StatusInProgress || !rec.Journal[0].LateFinish.IsZero() {
		t.Fatalf("after the refused writes: %+v, %v; want in_progress, unmarked", rec, err)
	}
	clock.Advance(2 * time.Minute)
	tk, err := s.Claim(ctx, claimReq("old"))
	if err != nil || !tk.Acquired || !tk.Takeover || tk.Record.Fence != f+1 || tk.Record.Journal[0].Outcome != store.OutcomeLapsed {
		t.Fatalf("claim after the lease passed: %+v, %v; want a takeover at fence %d, the old entry lapsed", tk, err, f+1)
	}
	if err := s.Finish(ctx, complete(tk, "r")); err != nil {
		t.Fatalf("the new attempt's Complete: %v", err)
	}
}

// TestFenceAfterDelete: a deleted key's new item starts from the clock
// again: above every fence of the deleted item once the clock has moved
// past its last claim, and (the limit the package doc states) at the same
// fence on a clock that has not; the deleted item's holder is refused
// either way, by its attempt id.
func TestFenceAfterDelete(t *testing.T) {
	clock := idemtest.NewClock(idemtest.ClockStart)
	s := New(testClient(t), newTable(t), WithClock(clock.Now))
	ctx := context.Background()
	held, err := s.Claim(ctx, claimReq("k"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Millisecond)
	again, err := s.Claim(ctx, claimReq("k"))
	if err != nil || !again.Acquired || again.Record.Fence <= held.Record.Fence || again.Record.Fence != first(clock.Now()) {
		t.Fatalf("claim a millisecond after the Delete: %+v, %v; want fence %d, above %d", again, err, first(clock.Now()), held.Record.Fence)
	}

	if err := s.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	repeat, err := s.Claim(ctx, claimReq("k"))
	if err != nil || !repeat.Acquired || repeat.Record.Fence != again.Record.Fence {
		t.Fatalf("claim on a clock that has not moved since the Delete: %+v, %v; want fence %d again", repeat, err, again.Record.Fence)
	}
	if err := s.Finish(ctx, complete(again, "stale")); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("the deleted item's holder, at the repeated fence = %v, want ErrLeaseLost", err)
	}
	if rec, err := s.Get(ctx, "k"); err != nil || rec.Status != store.StatusInProgress || rec.AttemptID != repeat.Record.AttemptID || !rec.Journal[0].LateFinish.IsZero() {
		t.Fatalf("after the stale write: %+v, %v; want the new holder's record untouched", rec, err)
	}
}
