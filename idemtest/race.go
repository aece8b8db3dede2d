package idemtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// raceLease is the lease of the race tests, which are not about leases.
const raceLease = 30 * time.Second

// testRace holds concurrency within one process: goroutines racing on the
// same keys through one or several Ledgers, and racing claims on the store.
func testRace(t *testing.T, h Harness) {
	t.Run("do_64_goroutines_1000_keys", func(t *testing.T) {
		t.Parallel()
		const goroutines, keys = 64, 1000
		s := newStore(t, h)
		// Four ledgers, as four processes would have, share the store. The
		// lease is long: 64 goroutines on a loaded machine may not run for
		// longer than a short lease, and this test is not about leases.
		ls := make([]*idem.Ledger, 4)
		for i := range ls {
			ls[i] = ledger(h, s, idem.WithOwner("p"+strconv.Itoa(i)), idem.WithLease(raceLease))
		}
		names := make([]idem.OperationKey, keys)
		for i := range names {
			names[i] = idem.Key("race", i)
		}
		var (
			runs                     [keys]atomic.Int64
			executed, replayed, busy atomic.Int64
			wrongValue, otherErr     atomic.Int64
			firstOther               atomic.Pointer[error]
			start                    = make(chan struct{})
			wg                       sync.WaitGroup
		)
		for g := range goroutines {
			wg.Go(func() {
				l := ls[g%len(ls)]
				order := rand.Perm(keys)
				<-start
				for _, i := range order {
					res, err := l.Do(context.Background(), names[i], func(context.Context) ([]byte, error) {
						runs[i].Add(1)
						return []byte(strconv.Itoa(i)), nil
					})
					switch {
					case err == nil && res.Replayed:
						replayed.Add(1)
					case err == nil:
						executed.Add(1)
					case errors.Is(err, idem.ErrInProgress):
						busy.Add(1)
						continue
					default:
						otherErr.Add(1)
						firstOther.CompareAndSwap(nil, &err)
						continue
					}
					if string(res.Value) != strconv.Itoa(i) {
						wrongValue.Add(1)
					}
				}
			})
		}
		began := time.Now()
		close(start)
		wg.Wait()
		t.Logf("%d calls in %v: %d executed, %d replayed, %d busy", goroutines*keys, time.Since(began).Round(time.Millisecond),
			executed.Load(), replayed.Load(), busy.Load())
		if p := firstOther.Load(); p != nil {
			t.Fatalf("%d calls failed, first: %v", otherErr.Load(), *p)
		}
		for i := range runs {
			if n := runs[i].Load(); n != 1 {
				t.Fatalf("key %d: fn ran %d times, want exactly 1", i, n)
			}
		}
		if executed.Load() != keys {
			t.Fatalf("%d calls executed fn, want %d", executed.Load(), keys)
		}
		if n := executed.Load() + replayed.Load() + busy.Load(); n != goroutines*keys {
			t.Fatalf("%d calls accounted for, want %d", n, goroutines*keys)
		}
		if wrongValue.Load() != 0 {
			t.Fatalf("%d calls returned another key's value", wrongValue.Load())
		}
		for i := range keys {
			if rec := get(t, s, names[i].String()); rec.Status != idem.StatusCompleted || rec.Attempt != 1 || len(rec.Journal) != 1 || rec.Journal[0].Fence != rec.Fence {
				t.Fatalf("key %d after the race: {%s, fence %d, attempt %d, journal %+v}, want {completed, its one attempt's fence, 1} (claimed once)",
					i, rec.Status, rec.Fence, rec.Attempt, rec.Journal)
			}
		}
	})

	t.Run("claim_same_new_key", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		wantOneWinner(t, s, req(h, "k"), false)
	})

	t.Run("claim_same_lapsed_key", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		acquire(t, s, req(h, "k"))
		lapse(t, h, s, "k")
		wantOneWinner(t, s, req(h, "k"), true)
	})

	t.Run("claim_same_released_key", func(t *testing.T) {
		t.Parallel()
		s := newStore(t, h)
		cr := acquire(t, s, req(h, "k"))
		noErr(t, "Release", s.Finish(context.Background(), store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: "retry"}))
		wantOneWinner(t, s, req(h, "k"), false)
	})

	t.Run("finish_races_takeover", func(t *testing.T) {
		// A stale holder's Complete races a takeover: either the completion
		// lands first (the claim then sees completed) or the takeover does
		// (the completion is refused). Never both.
		t.Parallel()
		s := newStore(t, h)
		const n = 50
		olds := make([]store.ClaimResult, n)
		for i := range n {
			olds[i] = acquire(t, s, req(h, "k"+strconv.Itoa(i)))
		}
		lapse(t, h, s, "k"+strconv.Itoa(n-1)) // the last claimed lapses last
		for i, old := range olds {
			key := old.Record.Key
			var (
				cr       store.ClaimResult
				cerr, ce error
				wg       sync.WaitGroup
			)
			wg.Go(func() { cr, cerr = s.Claim(context.Background(), req(h, key)) })
			wg.Go(func() {
				ce = s.Finish(context.Background(), store.FinishRequest{Key: key, Fence: old.Record.Fence, AttemptID: old.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("old"), Retention: time.Hour})
			})
			wg.Wait()
			noErr(t, "Claim", cerr)
			rec := get(t, s, key)
			switch {
			case ce == nil && !cr.Acquired:
				if rec.Status != idem.StatusCompleted || rec.Fence != old.Record.Fence || rec.AttemptID != old.Record.AttemptID {
					t.Fatalf("completion won: record {%s, fence %d, attempt id %q}, want the stale holder's {completed, %d, %q}",
						rec.Status, rec.Fence, rec.AttemptID, old.Record.Fence, old.Record.AttemptID)
				}
			case errors.Is(ce, idem.ErrLeaseLost) && cr.Acquired:
				if rec.Status != idem.StatusInProgress || rec.Fence != old.Record.Fence+1 || rec.AttemptID != cr.Record.AttemptID {
					t.Fatalf("takeover won: record {%s, fence %d, attempt id %q}, want the takeover's {in_progress, %d (the stale holder's + 1), %q}",
						rec.Status, rec.Fence, rec.AttemptID, old.Record.Fence+1, cr.Record.AttemptID)
				}
			default:
				t.Fatalf("race %d: Complete = %v and Claim acquired = %v: both or neither won", i, ce, cr.Acquired)
			}
		}
	})
}

// wantOneWinner races 32 goroutines claiming r, each as an attempt of its
// own, and fails the test unless exactly one acquires it (as a takeover
// when takeover is set), at the next fence of the record the race found
// (a new record's first fence when it found none).
func wantOneWinner(t *testing.T, s store.Store, r store.ClaimRequest, takeover bool) {
	t.Helper()
	const n = 32
	var (
		wg      sync.WaitGroup
		won     atomic.Int64
		winners sync.Map // fence -> the winning request
		start   = make(chan struct{})
		errs    = make(chan error, n)
	)
	found, err := s.Get(context.Background(), r.Key)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get(%q) before the race: %v", r.Key, err)
	}
	before := now(t, s)
	for i := range n {
		wg.Go(func() {
			rr := r
			// The winner's claim must stay held until the last racer has
			// asked: on a loaded machine's real clock the racers spread
			// over more than the suite's 300 ms lease.
			rr.Owner, rr.Lease, rr.AttemptID = "racer-"+strconv.Itoa(i), raceLease, store.NewAttemptID()
			<-start
			cr, err := s.Claim(context.Background(), rr)
			if err != nil {
				errs <- err
				return
			}
			if cr.Acquired {
				won.Add(1)
				winners.Store(cr.Record.Fence, rr)
				if cr.Takeover != takeover {
					errs <- errors.New("winner's Takeover flag is wrong")
				}
				if cr.Record.AttemptID != rr.AttemptID {
					errs <- fmt.Errorf("winner's record has attempt id %q, want its request's %q", cr.Record.AttemptID, rr.AttemptID)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("racing claims: %v", err)
	}
	if won.Load() != 1 {
		t.Fatalf("%d of %d racing claims acquired the key, want exactly 1", won.Load(), n)
	}
	rec := get(t, s, r.Key)
	w, ok := winners.Load(rec.Fence)
	if winner, _ := w.(store.ClaimRequest); !ok || winner.Owner != rec.Owner || winner.AttemptID != rec.AttemptID {
		t.Fatalf("record {fence %d, owner %q, attempt id %q} is not the winner's", rec.Fence, rec.Owner, rec.AttemptID)
	}
	if found.Key == "" {
		wantFirstFence(t, "the winner's claim of a new key", rec.Fence, before)
	} else if rec.Fence != found.Fence+1 {
		t.Fatalf("the winner's claim: fence %d, want %d (one more than the record's %d before the race)", rec.Fence, found.Fence+1, found.Fence)
	}
}
