package store

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// deep returns r with its own copies of the result and the journal.
func deep(r Record) Record {
	r.Result = append([]byte(nil), r.Result...)
	r.Journal = append([]JournalEntry(nil), r.Journal...)
	return r
}

// handed is a record handed to a caller and what it was when handed out.
type handed struct {
	what      string
	got, want Record
}

// TestSlotMatchesCopyOnWrite runs random sequences of calls on a few keys
// through the copy-on-write functions and through Slots side by side, and
// checks that (1) both give the same results and keep the same records, (2)
// the copy-on-write functions never modify the record passed in, and (3) no
// record a Slot handed out (a claim's, Copy's) changes afterwards, whatever
// later calls do to the key: Slots change records in place, and dropped
// slots are reused for new keys.
func TestSlotMatchesCopyOnWrite(t *testing.T) {
	for seed := range uint64(64) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runDifferential(t, seed, 300) })
	}
}

func runDifferential(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 1))
	keys := []string{"a", "b"}
	cow := map[string]*Record{}
	slots := map[string]*Slot{}
	var spare []*Slot // dropped slots Reset let us reuse, as memstore keeps them
	var out []handed
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	dur := func(max int) time.Duration { return time.Duration(rng.IntN(max+1)) * time.Second }
	// attempt names an attempt for a write: usually the record's, else a
	// stale or unknown one (an earlier fence, another attempt id).
	ids := []string{"id-a", "id-b", "id-c", ""}
	attempt := func(rec *Record) (int64, string) {
		switch {
		case rec == nil || rng.IntN(4) == 0:
			return rec.fenceOr(int64(rng.IntN(4))), ids[rng.IntN(len(ids))]
		case rng.IntN(3) == 0:
			return rec.Fence - 1, rec.AttemptID
		case rng.IntN(3) == 0:
			return rec.Fence, ids[rng.IntN(len(ids))]
		}
		return rec.Fence, rec.AttemptID
	}
	var floor int64 // the highest fence of a dropped record
	cowCall := func(rec *Record, f func() (*Record, error)) (*Record, error) {
		var before Record
		if rec != nil {
			before = deep(*rec)
		}
		next, err := f()
		if rec != nil && !reflect.DeepEqual(*rec, before) {
			t.Fatalf("a copy-on-write call modified the record passed in:\n got %+v\nwant %+v", *rec, before)
		}
		return next, err
	}
	for step := range steps {
		key := keys[rng.IntN(len(keys))]
		rec, slot := cow[key], slots[key]
		var what string
		switch op := rng.IntN(11); op {
		case 0: // time passes
			now = now.Add(dur(4))
			what = "advance"
		case 1, 2: // claim
			req := ClaimRequest{
				Key: key, AttemptID: fmt.Sprint("id-", step), Owner: fmt.Sprint("w", rng.IntN(3)), Correlation: fmt.Sprint("c", step),
				Policy: Policy(rng.IntN(2)), Lease: dur(3) + time.Second, Retention: dur(8),
				Fingerprint: fmt.Sprint(rng.IntN(2)), TakeLapsed: rng.IntN(4) == 0,
			}
			what = fmt.Sprintf("claim %+v", req)
			var next *Record
			var want ClaimResult
			cowCall(rec, func() (*Record, error) { next, want = ApplyClaim(rec, req, now, floor); return next, nil })
			var got ClaimResult
			if slot == nil && len(spare) > 0 {
				slot, spare = spare[len(spare)-1], spare[:len(spare)-1]
				got = slot.ClaimNew(req, now, floor)
				slots[key] = slot
			} else if slot == nil {
				slot, got = NewSlot(req, now, floor)
				slots[key] = slot
			} else {
				got = slot.Claim(req, now)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("step %d %s:\nslot %+v\n cow %+v", step, what, got, want)
			}
			if got.Acquired && (got.Record.Result != nil || got.Record.Status != StatusInProgress || got.Record.AttemptID != req.AttemptID) {
				t.Fatalf("step %d %s: acquired a record with status %s, result %q and attempt %q, want in_progress, none and %q",
					step, what, got.Record.Status, got.Record.Result, got.Record.AttemptID, req.AttemptID)
			}
			if got.Acquired && rec == nil && got.Record.Fence <= floor {
				t.Fatalf("step %d %s: a new record's fence %d is not above %d, the fence of a dropped record", step, what, got.Record.Fence, floor)
			}
			if next != nil {
				cow[key] = next
			}
			out = append(out, handed{what, got.Record, deep(got.Record)})
		case 3, 4, 5: // an attempt ends
			f, id := attempt(rec)
			reason := fmt.Sprint("why", step)
			if rng.IntN(4) == 0 {
				reason = NotRunReason(reason)
			}
			end := FinishRequest{Key: key, Fence: f, AttemptID: id,
				Outcome: []Outcome{OutcomeCompleted, OutcomeFailed, OutcomeReleased, OutcomeAbandoned}[rng.IntN(4)],
				Result:  []byte(fmt.Sprint("r", step)), Reason: reason, Retention: dur(8)}
			what = fmt.Sprintf("finish %+v", end)
			next, werr := cowCall(rec, func() (*Record, error) { return ApplyFinish(rec, end, now) })
			gerr := slot.Finish(end, now)
			if !errors.Is(gerr, werr) || !errors.Is(werr, gerr) {
				t.Fatalf("step %d %s: slot %v, cow %v", step, what, gerr, werr)
			}
			if next != nil {
				cow[key] = next
			}
		case 6, 7: // heartbeat
			f, id := attempt(rec)
			req := ExtendRequest{Key: key, Fence: f, AttemptID: id, Lease: dur(3) + time.Second}
			what = fmt.Sprintf("extend %+v", req)
			next, werr := cowCall(rec, func() (*Record, error) { return ApplyExtend(rec, req, now) })
			until, gerr := slot.Extend(req, now)
			if !errors.Is(gerr, werr) || !errors.Is(werr, gerr) {
				t.Fatalf("step %d %s: slot %v, cow %v", step, what, gerr, werr)
			}
			if werr == nil && !until.Equal(next.LeaseUntil) {
				t.Fatalf("step %d %s: slot until %v, cow %v", step, what, until, next.LeaseUntil)
			}
			if next != nil {
				cow[key] = next
			}
		case 8: // an operator decides
			f, id := attempt(rec)
			if rng.IntN(2) == 0 {
				f = 0
			}
			if rng.IntN(2) == 0 {
				id = ""
			}
			r := ResolveRequest{Key: key, Fence: f, AttemptID: id, Done: rng.IntN(2) == 0, Result: []byte("resolved"), Reason: "op",
				Retention: dur(8), By: "alice", InProgress: rng.IntN(2) == 0, Lapsed: rng.IntN(3) == 0}
			what = fmt.Sprintf("resolve %+v", r)
			next, werr := cowCall(rec, func() (*Record, error) { return ApplyResolve(rec, r, now) })
			gerr := slot.Resolve(r, now)
			if !errors.Is(gerr, werr) || !errors.Is(werr, gerr) {
				t.Fatalf("step %d %s: slot %v, cow %v", step, what, gerr, werr)
			}
			if next != nil {
				cow[key] = next
			}
		case 10: // the store drops the key (Delete, Sweep)
			what = "drop"
			if slot != nil {
				floor = max(floor, slot.Peek().Fence)
				delete(cow, key)
				delete(slots, key)
				if slot.Reset() { // a later claim of a new key reuses it
					spare = append(spare, slot)
				}
			}
		case 9: // a reader
			what = "copy"
			if slot != nil {
				c := slot.Copy()
				out = append(out, handed{what, c, deep(c)})
			}
		}
		for _, k := range keys {
			if (cow[k] == nil) != (slots[k] == nil) {
				t.Fatalf("step %d %s: key %s: cow record %v, slot %v", step, what, k, cow[k], slots[k])
			}
			if cow[k] != nil && !reflect.DeepEqual(*slots[k].Peek(), *cow[k]) {
				t.Fatalf("step %d %s: key %s:\nslot %+v\n cow %+v", step, what, k, *slots[k].Peek(), *cow[k])
			}
		}
		if step%16 != 15 && step != steps-1 {
			continue
		}
		for _, h := range out {
			if !reflect.DeepEqual(h.got, h.want) {
				t.Fatalf("step %d %s: a record handed out by %q changed:\n got %+v\nwant %+v", step, what, h.what, h.got, h.want)
			}
		}
	}
}

// fenceOr returns r's fence, or f when r is nil.
func (r *Record) fenceOr(f int64) int64 {
	if r == nil {
		return f
	}
	return r.Fence
}
