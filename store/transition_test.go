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
	var out []handed
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	dur := func(max int) time.Duration { return time.Duration(rng.IntN(max+1)) * time.Second }
	fence := func(rec *Record) int64 {
		switch {
		case rec == nil || rng.IntN(4) == 0:
			return int64(rng.IntN(4))
		case rng.IntN(3) == 0:
			return rec.Fence - 1
		}
		return rec.Fence
	}
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
				Key: key, Owner: fmt.Sprint("w", rng.IntN(3)), Correlation: fmt.Sprint("c", step),
				Policy: Policy(rng.IntN(2)), Lease: dur(3) + time.Second, Retention: dur(8),
				Fingerprint: fmt.Sprint(rng.IntN(2)), TakeLapsed: rng.IntN(4) == 0,
			}
			what = fmt.Sprintf("claim %+v", req)
			var next *Record
			var want ClaimResult
			cowCall(rec, func() (*Record, error) { next, want = ApplyClaim(rec, req, now); return next, nil })
			var got ClaimResult
			if slot == nil {
				slot, got = NewSlot(req, now)
				slots[key] = slot
			} else {
				got = slot.Claim(req, now)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("step %d %s:\nslot %+v\n cow %+v", step, what, got, want)
			}
			if got.Acquired && (got.Record.Result != nil || got.Record.Status != StatusInProgress) {
				t.Fatalf("step %d %s: acquired a record with status %s and result %q, want in_progress and none", step, what, got.Record.Status, got.Record.Result)
			}
			if next != nil {
				cow[key] = next
			}
			out = append(out, handed{what, got.Record, deep(got.Record)})
		case 3, 4, 5: // an attempt ends
			f := fence(rec)
			end := Ending{Status: []Status{StatusCompleted, StatusFailed, StatusReleased, StatusInProgress}[rng.IntN(4)],
				Result: []byte(fmt.Sprint("r", step)), Reason: fmt.Sprint("why", step), Retention: dur(8)}
			what = fmt.Sprintf("finish fence %d %+v", f, end)
			next, werr := cowCall(rec, func() (*Record, error) { return ApplyFinish(rec, f, end, now) })
			gerr := slot.Finish(f, end, now)
			if !errors.Is(gerr, werr) || !errors.Is(werr, gerr) {
				t.Fatalf("step %d %s: slot %v, cow %v", step, what, gerr, werr)
			}
			if next != nil {
				cow[key] = next
			}
		case 6, 7: // heartbeat
			f, lease := fence(rec), dur(3)+time.Second
			what = fmt.Sprintf("extend fence %d by %v", f, lease)
			next, werr := cowCall(rec, func() (*Record, error) { return ApplyExtend(rec, f, lease, now) })
			until, gerr := slot.Extend(f, lease, now)
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
			f := fence(rec)
			if rng.IntN(2) == 0 {
				f = 0
			}
			r := Resolution{Done: rng.IntN(2) == 0, Result: []byte("resolved"), Reason: "op", Retention: dur(8), By: "alice", InProgress: rng.IntN(2) == 0}
			what = fmt.Sprintf("resolve fence %d %+v", f, r)
			next, werr := cowCall(rec, func() (*Record, error) { return ApplyResolve(rec, f, r, now) })
			gerr := slot.Resolve(f, r, now)
			if !errors.Is(gerr, werr) || !errors.Is(werr, gerr) {
				t.Fatalf("step %d %s: slot %v, cow %v", step, what, gerr, werr)
			}
			if next != nil {
				cow[key] = next
			}
		case 10: // the store drops the key (Delete, Sweep)
			what = "drop"
			if slot != nil {
				delete(cow, key)
				delete(slots, key)
				slot.Free() // a later NewSlot may reuse it
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
