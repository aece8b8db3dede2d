package pgstore

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/store"
	"github.com/jackc/pgx/v5"
)

// batchStarts are the two ways a batch claim starts (see claimRound):
// with the insert of the new keys while keys are mostly new, with the full
// claim while they mostly exist. prime puts a store's estimate on one.
var batchStarts = []struct {
	name  string
	prime func(s *Store)
}{
	{"new-keys-first", func(*Store) {}},
	{"full-claim-first", func(s *Store) {
		for range 64 {
			s.dupes.Observe(true)
		}
	}},
}

// TestClaimBatchStarts: a batch of keys in every state gives the same
// outcome whichever way the batch starts, and every acquired result is the
// record the store then holds.
func TestClaimBatchStarts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Fence is the fence's growth over the key's earlier claim (a key
	// claimed anew keeps its numbering), or, for a new key, 0 once it is
	// checked to be the store's first fence at the claim's time.
	type outcome struct {
		Acquired, Takeover bool
		Status             store.Status
		Fence              int64
		Attempt, Journal   int
		Result             string
	}
	var got [2]map[string]outcome
	for n, start := range batchStarts {
		t.Run(start.name, func(t *testing.T) {
			clocks := new(testClocks)
			s := newTestStore(t, clocks)
			fences := map[string]int64{}
			claim := func(key string, lease time.Duration) store.ClaimResult {
				r := req(key)
				r.Lease = lease
				cr, err := s.Claim(ctx, r)
				if err != nil || !cr.Acquired {
					t.Fatalf("Claim %q: acquired %v, %v", key, cr.Acquired, err)
				}
				fences[key] = cr.Record.Fence
				return cr
			}
			end := func(cr store.ClaimResult, o store.Outcome, retention time.Duration) {
				t.Helper()
				err := s.Finish(ctx, store.FinishRequest{Key: cr.Record.Key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID,
					Outcome: o, Result: []byte("r"), Retention: retention})
				if err != nil {
					t.Fatal(err)
				}
			}
			end(claim("completed", time.Minute), store.OutcomeCompleted, time.Hour)
			end(claim("expired", time.Minute), store.OutcomeCompleted, time.Second)
			end(claim("released", time.Minute), store.OutcomeReleased, 0)
			claim("lapsed", time.Second)
			claim("busy", time.Hour)
			clocks.advance(t, 2*time.Second)

			start.prime(s)
			if was := s.dupes.Often(); was != (n == 1) {
				t.Fatalf("the store's estimate says keys often exist: %v, want %v", was, n == 1)
			}
			keys := []string{"new-b", "completed", "lapsed", "new-a", "released", "busy", "expired"}
			reqs := make([]store.ClaimRequest, len(keys))
			for i, k := range keys {
				reqs[i] = req(k)
			}
			res, err := s.ClaimBatch(ctx, reqs)
			if err != nil {
				t.Fatalf("ClaimBatch: %v", err)
			}
			got[n] = map[string]outcome{}
			for i, r := range res {
				if r.Err != nil || r.Record.Key != keys[i] {
					t.Fatalf("result %d: key %q, Err %v; want %q, no error", i, r.Record.Key, r.Err, keys[i])
				}
				fence := r.Record.Fence - fences[keys[i]]
				if _, old := fences[keys[i]]; !old {
					if r.Record.Fence != store.FirstFence(r.Now, 0) {
						t.Errorf("%q: a new key's fence %d, want %d, the claim's time in µs", keys[i], r.Record.Fence, store.FirstFence(r.Now, 0))
					}
					fence = 0
				}
				got[n][keys[i]] = outcome{r.Acquired, r.Takeover, r.Record.Status, fence, r.Record.Attempt, len(r.Record.Journal), string(r.Record.Result)}
				if !r.Acquired {
					continue
				}
				held, err := s.Get(ctx, keys[i])
				if err != nil {
					t.Fatalf("Get %q: %v", keys[i], err)
				}
				if !reflect.DeepEqual(held, r.Record) {
					t.Errorf("%q: the batch claim returned\n%+v\nthe store holds\n%+v", keys[i], r.Record, held)
				}
				if !r.Now.Equal(r.Record.UpdatedAt) {
					t.Errorf("%q: Now %v, want the claim's time %v", keys[i], r.Now, r.Record.UpdatedAt)
				}
			}
			want := map[string]outcome{
				"new-a":     {Acquired: true, Status: store.StatusInProgress, Attempt: 1, Journal: 1},
				"new-b":     {Acquired: true, Status: store.StatusInProgress, Attempt: 1, Journal: 1},
				"completed": {Status: store.StatusCompleted, Attempt: 1, Journal: 1, Result: "r"},
				"busy":      {Status: store.StatusInProgress, Attempt: 1, Journal: 1},
				"released":  {Acquired: true, Status: store.StatusInProgress, Fence: 1, Attempt: 2, Journal: 2},
				"lapsed":    {Acquired: true, Takeover: true, Status: store.StatusInProgress, Fence: 1, Attempt: 2, Journal: 2},
				"expired":   {Acquired: true, Status: store.StatusInProgress, Fence: 1, Attempt: 2, Journal: 2},
			}
			if !reflect.DeepEqual(got[n], want) {
				t.Errorf("outcomes\n%v\nwant\n%v", fmt.Sprint(got[n]), fmt.Sprint(want))
			}
		})
	}
	if got[0] != nil && got[1] != nil && !reflect.DeepEqual(got[0], got[1]) {
		t.Errorf("the two starts differ:\n%v\n%v", got[0], got[1])
	}
}

// countQueries is a querier that counts the queries it runs and, with
// failAfter > 0, fails those after the first failAfter, as a connection
// lost (or a context ended) between a batch claim's statements would.
type countQueries struct {
	querier
	n, failAfter int
}

var errLostBetween = errors.New("connection lost between statements")

func (c *countQueries) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.n++
	if c.failAfter > 0 && c.n > c.failAfter {
		return nil, errLostBetween
	}
	return c.querier.Query(ctx, sql, args...)
}

// TestClaimBatchStartFollowsBatches: batches of ten that each have one key
// with a row take two statements at first (the new keys' insert, then the
// full claim for that key), and after a few such batches one (the full
// claim alone): the estimate counts batches that had such a key, not keys
// (one key in ten would never have turned it), since the second round trip
// is paid per batch.
func TestClaimBatchStartFollowsBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newTestStore(t, new(testClocks))
	var stmts []int
	for b := range 12 {
		// Nine new keys and one with a row: a tenth of the keys, in
		// every batch.
		var reqs []store.ClaimRequest
		for k := range 9 {
			reqs = append(reqs, req(fmt.Sprintf("mixed-%d-%d", b, k)))
		}
		reqs = append(reqs, req("repeat"))
		q := &countQueries{querier: s.pool}
		res, err := s.claimBatch(ctx, q, reqs, true)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if want := i < 9 || b == 0; r.Acquired != want {
				t.Fatalf("batch %d, %q: acquired %v, want %v", b, r.Record.Key, r.Acquired, want)
			}
		}
		stmts = append(stmts, q.n)
	}
	if stmts[0] != 1 || stmts[1] != 2 || stmts[len(stmts)-1] != 1 {
		t.Fatalf("statements per batch %v: want 1 (all new), then 2 (one key with a row), then 1 once that is common", stmts)
	}
}

// TestClaimBatchFailsBetweenStatements: when the full claim fails after
// the insert of the new keys committed, the batch returns the error and
// the new keys it had claimed are released: a retry acquires them at
// once, instead of finding them busy for a lease. Their reason marks them
// as not run (see TestClaimBatchFailsUndoesAsNotRun).
func TestClaimBatchFailsBetweenStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newTestStore(t, new(testClocks))
	done := req("done")
	cr, err := s.Claim(ctx, done)
	if err != nil || !cr.Acquired {
		t.Fatalf("Claim: %v, %v", cr.Acquired, err)
	}
	if err := s.Finish(ctx, store.FinishRequest{Key: "done", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if s.dupes.Often() {
		t.Fatal("a new store starts batches with the full claim")
	}
	reqs := []store.ClaimRequest{req("fresh-1"), req("done"), req("fresh-2")}
	for i := range reqs {
		reqs[i].Policy = store.AtMostOnce
	}
	q := &countQueries{querier: s.pool, failAfter: 1}
	if _, err := s.claimBatch(ctx, q, reqs, true); !errors.Is(err, errLostBetween) {
		t.Fatalf("claimBatch = %v, want the second statement's error", err)
	}
	if q.n != 2 {
		t.Fatalf("the batch ran %d statements, want 2 (the new keys' insert, then the full claim)", q.n)
	}
	for _, k := range []string{"fresh-1", "fresh-2"} {
		rec, err := s.Get(ctx, k)
		if err != nil {
			t.Fatalf("Get %q: %v", k, err)
		}
		if rec.Status != store.StatusReleased {
			t.Fatalf("%q after the failed batch: %s, want released", k, rec.Status)
		}
		r := req(k)
		r.Policy = store.AtMostOnce
		if cr, err := s.Claim(ctx, r); err != nil || !cr.Acquired {
			t.Fatalf("a retry of %q: acquired %v, %v; want acquired", k, cr.Acquired, err)
		}
	}
}

// TestClaimBatchFailsUndoesAsNotRun: when a later round of a batch fails,
// a fresh claim the batch made is released and a takeover it made is
// abandoned (lapsed at once, not busy for a lease), both as not run: the
// next call's Reconcile hook is not asked about the fresh key, and is asked
// about the attempt the takeover took over, not about the takeover.
func TestClaimBatchFailsUndoesAsNotRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clocks := new(testClocks)
	s := newTestStore(t, clocks)
	first := req("t")
	first.Owner, first.Correlation = "first", "c1"
	if cr, err := s.Claim(ctx, first); err != nil || !cr.Acquired {
		t.Fatalf("Claim: %v, %v", cr.Acquired, err)
	}
	clocks.advance(t, 2*time.Minute) // the first attempt crashed: its lease lapses
	if s.dupes.Often() {
		t.Fatal("a new store starts batches with the full claim")
	}
	// Round one: the new key's insert, then the full claim (the takeover);
	// round two (t again) fails.
	reqs := []store.ClaimRequest{req("t"), req("fresh"), req("t")}
	q := &countQueries{querier: s.pool, failAfter: 2}
	if _, err := s.claimBatch(ctx, q, reqs, true); !errors.Is(err, errLostBetween) {
		t.Fatalf("claimBatch = %v, want the third statement's error", err)
	}
	if q.n != 3 {
		t.Fatalf("the batch ran %d statements, want 3", q.n)
	}
	idemtest.CheckUndone(t, s, []string{"fresh"}, "t", first)
}
