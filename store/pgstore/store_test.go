package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/store"
	"github.com/jackc/pgx/v5/pgxpool"
)

func req(key string) store.ClaimRequest {
	return store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: key, Owner: "o", Correlation: "c", Policy: store.AtLeastOnce, Lease: time.Minute, Retention: time.Hour}
}

// TestCorruptRows: a row whose status, policy or journal cannot be decoded
// is reported as corrupt by every read, and a claim never overwrites it
// until it expires.
func TestCorruptRows(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, set string }{
		{"status", "status = 'done'"},
		{"policy", "policy = 'exactly_once'"},
		{"journal_object", `journal = '{"` + store.WireAttempt + `": 1}'`},
		{"journal_elements", `journal = '[1, "x"]'`},
		{"journal_types", `journal = '[{"` + store.WireAttempt + `": "one", "` + store.WireFence + `": 1}]'`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clocks := new(testClocks)
			s := newTestStore(t, clocks)
			ctx := context.Background()
			fences := map[string]int64{}
			for _, key := range []string{"k", "lapsed"} {
				cr := claimNew(t, s, key)
				fences[key] = cr.Record.Fence
				if key == "k" {
					if err := s.Finish(ctx, store.FinishRequest{Key: key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: time.Hour}); err != nil {
						t.Fatal(err)
					}
				}
			}
			if _, err := s.Pool().Exec(ctx, "UPDATE "+s.Table()+" SET "+tc.set); err != nil {
				t.Fatal(err)
			}
			clocks.advance(t, 2*time.Minute) // "lapsed" is lapsed, still not expired
			var ce *store.CorruptError
			for _, key := range []string{"k", "lapsed"} {
				_, err := s.Get(ctx, key)
				if !errors.As(err, &ce) || ce.Key != key {
					t.Fatalf("Get(%q) of a corrupt row: %v, want a *CorruptError for it", key, err)
				}
				_, err = s.Claim(ctx, req(key))
				if !errors.Is(err, store.ErrCorrupt) {
					t.Fatalf("Claim(%q) of a corrupt row: %v, want ErrCorrupt", key, err)
				}
				res, err := s.ClaimBatch(ctx, []store.ClaimRequest{req(key), req("other-" + key)})
				if err != nil || len(res) != 2 || !errors.Is(res[0].Err, store.ErrCorrupt) || res[1].Err != nil || !res[1].Acquired {
					t.Fatalf("ClaimBatch with a corrupt row: %+v, %v; want ErrCorrupt for %q alone, the other key acquired", res, err, key)
				}
			}
			if _, err := s.List(ctx, store.ListQuery{}); !errors.Is(err, store.ErrCorrupt) {
				t.Fatalf("List over a corrupt row: %v, want ErrCorrupt", err)
			}
			var n int
			s.Pool().QueryRow(ctx, "SELECT count(*) FROM "+s.Table()+" WHERE (key = 'k' AND fence <> $1) OR (key = 'lapsed' AND fence <> $2)",
				fences["k"], fences["lapsed"]).Scan(&n)
			if n != 0 && tc.name != "journal_types" {
				t.Fatal("a claim overwrote a corrupt row")
			}
			if tc.name == "journal_elements" || tc.name == "journal_types" {
				return // an expired row keeps its journal: still corrupt
			}
			clocks.advance(t, 2*time.Hour) // expired: absent, claimable
			cr := claimNew(t, s, "k")
			if !cr.Acquired || cr.Record.Fence != fences["k"]+1 || !cr.Record.Journal[len(cr.Record.Journal)-1].AfterExpiry {
				t.Fatalf("claim of an expired corrupt row: %+v", cr)
			}
		})
	}
}

// TestClaimRace: goroutines claiming the same new keys at once; each key
// is acquired exactly once, and every other claim finds the winner's
// record (never nothing, even when its snapshot predates the winner's
// commit).
func TestClaimRace(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, new(testClocks))
	const goroutines, keys = 16, 200
	var (
		mu       sync.Mutex
		acquired = map[string]int{}
		fences   = map[string][]int64{} // every fence each key's claims found or made
		wg       sync.WaitGroup
		start    = make(chan struct{})
	)
	for g := range goroutines {
		wg.Go(func() {
			<-start
			for _, i := range rand.Perm(keys) {
				r := req(fmt.Sprintf("race-%d", i))
				r.Owner = fmt.Sprint(g)
				cr, err := s.Claim(context.Background(), r)
				if err != nil {
					t.Errorf("Claim: %v", err)
					return
				}
				if !cr.Acquired && (cr.Record.Key != r.Key || cr.Record.Status != store.StatusInProgress || cr.Record.Attempt != 1) {
					t.Errorf("Claim not acquired found %+v, want the winner's in_progress record", cr.Record)
				}
				mu.Lock()
				if cr.Acquired {
					acquired[r.Key]++
				}
				fences[r.Key] = append(fences[r.Key], cr.Record.Fence)
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	t.Logf("%d claims ran again because their key changed under them", s.reruns.Load())
	for i := range keys {
		k := fmt.Sprintf("race-%d", i)
		if n := acquired[k]; n != 1 {
			t.Fatalf("key %d acquired %d times", i, n)
		}
		if f := fences[k]; slices.Min(f) != slices.Max(f) {
			t.Fatalf("key %d: claims found fences %v, want the winner's alone", i, f)
		}
	}
}

// TestTakeoverRace: claims racing for one lapsed attempt; exactly one
// takes it over, and the journal says so once.
func TestTakeoverRace(t *testing.T) {
	t.Parallel()
	for _, p := range []store.Policy{store.AtLeastOnce, store.AtMostOnce} {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			clocks := new(testClocks)
			s := newTestStore(t, clocks)
			ctx := context.Background()
			r := req("k")
			r.Policy = p
			first := claimNew(t, s, "k")
			if p == store.AtMostOnce {
				if _, err := s.Pool().Exec(ctx, "UPDATE "+s.Table()+" SET policy = 'at_most_once'"); err != nil {
					t.Fatal(err)
				}
				r.TakeLapsed = true
			}
			clocks.advance(t, 2*time.Minute)
			var (
				wg      sync.WaitGroup
				mu      sync.Mutex
				winners int
			)
			for range 16 {
				wg.Go(func() {
					cr, err := s.Claim(ctx, r)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					defer mu.Unlock()
					if cr.Acquired {
						winners++
						if !cr.Takeover || cr.Record.Fence != first.Record.Fence+1 {
							t.Errorf("winner: takeover %v fence %d, want %d", cr.Takeover, cr.Record.Fence, first.Record.Fence+1)
						}
					} else if cr.Record.Fence != first.Record.Fence+1 {
						t.Errorf("loser found fence %d, want the winner's %d", cr.Record.Fence, first.Record.Fence+1)
					}
				})
			}
			wg.Wait()
			if winners != 1 {
				t.Fatalf("%d claims took the lapsed attempt over, want 1", winners)
			}
			rec, err := s.Get(ctx, "k")
			if err != nil || len(rec.Journal) != 2 || rec.Journal[0].Outcome != store.OutcomeLapsed || !rec.Journal[1].Takeover {
				t.Fatalf("journal after the race: %+v, %v", rec.Journal, err)
			}
		})
	}
}

// TestClaimBatchRace: batches of the same keys in different orders, at
// once: no deadlock, each key acquired once.
func TestClaimBatchRace(t *testing.T) {
	t.Parallel()
	for _, start := range batchStarts {
		t.Run(start.name, func(t *testing.T) {
			t.Parallel()
			claimBatchRace(t, start.prime)
		})
	}
}

// claimBatchRace: batches of the same keys in different orders, racing
// from goroutines whose store starts its batches as prime puts it; each
// key is acquired exactly once.
func claimBatchRace(t *testing.T, prime func(*Store)) {
	s := newTestStore(t, new(testClocks))
	prime(s)
	const goroutines, keys = 8, 50
	var (
		mu       sync.Mutex
		acquired = map[string]int{}
		wg       sync.WaitGroup
	)
	for range goroutines {
		wg.Go(func() {
			var reqs []store.ClaimRequest
			for _, i := range rand.Perm(keys) {
				reqs = append(reqs, req(fmt.Sprintf("batch-%d", i)))
			}
			res, err := s.ClaimBatch(context.Background(), reqs)
			if err != nil {
				t.Errorf("ClaimBatch: %v", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for i, r := range res {
				if r.Record.Key != reqs[i].Key {
					t.Errorf("result %d is for %q, want %q", i, r.Record.Key, reqs[i].Key)
				}
				if r.Acquired {
					acquired[r.Record.Key]++
				} else if r.Record.Status != store.StatusInProgress {
					t.Errorf("not acquired, found %s", r.Record.Status)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d batch rounds ran again because keys changed under them", s.reruns.Load())
	for i := range keys {
		if n := acquired[fmt.Sprintf("batch-%d", i)]; n != 1 {
			t.Fatalf("key %d acquired %d times", i, n)
		}
	}
}

// TestFinishBatch: per-key outcomes, stale attempts annotated, keys given
// twice, completions batched with other outcomes.
func TestFinishBatch(t *testing.T) {
	t.Parallel()
	clocks := new(testClocks)
	s := newTestStore(t, clocks)
	ctx := context.Background()
	a, b, rel := claimNew(t, s, "a"), claimNew(t, s, "b"), claimNew(t, s, "rel")
	r := req("stale")
	r.Lease = time.Second
	stale, err := s.Claim(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	clocks.advance(t, 2*time.Second)
	taken := claimNew(t, s, "stale") // takes over
	done := func(cr store.ClaimResult, result string, retention time.Duration) store.FinishRequest {
		return store.FinishRequest{Key: cr.Record.Key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID,
			Outcome: store.OutcomeCompleted, Result: []byte(result), Retention: retention}
	}
	errs, err := s.FinishBatch(ctx, []store.FinishRequest{
		done(a, "ra", time.Hour),
		done(stale, "late", time.Hour),
		{Key: "absent", Fence: 1, AttemptID: "none", Outcome: store.OutcomeCompleted, Retention: time.Hour},
		done(b, "rb", 2*time.Hour),
		done(a, "again", time.Hour),
		{Key: "rel", Fence: rel.Record.Fence, AttemptID: rel.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: "later"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []error{nil, store.ErrLeaseLost, store.ErrLeaseLost, nil, store.ErrLeaseLost, nil}
	for i := range want {
		if !errors.Is(errs[i], want[i]) || (want[i] == nil) != (errs[i] == nil) {
			t.Fatalf("errs[%d] = %v, want %v", i, errs[i], want[i])
		}
	}
	now, _ := s.Now(ctx)
	for key, res := range map[string]string{"a": "ra", "b": "rb"} {
		rec, err := s.Get(ctx, key)
		if err != nil || rec.Status != store.StatusCompleted || string(rec.Result) != res || rec.Journal[0].Outcome != store.OutcomeCompleted {
			t.Fatalf("%q after FinishBatch: %+v, %v", key, rec, err)
		}
		if key == "b" && rec.ExpiresAt.Sub(now) < 119*time.Minute {
			t.Fatalf("b expires at %v, want 2h from %v", rec.ExpiresAt, now)
		}
	}
	if rec, err := s.Get(ctx, "rel"); err != nil || rec.Status != store.StatusReleased || rec.Reason != "later" {
		t.Fatalf("rel after FinishBatch: %+v, %v", rec, err)
	}
	rec, _ := s.Get(ctx, "stale")
	if rec.Status != store.StatusInProgress || rec.Fence != taken.Record.Fence || rec.Journal[0].LateFinish.IsZero() || !rec.Journal[1].LateFinish.IsZero() {
		t.Fatalf("stale key after FinishBatch: %+v", rec)
	}
	// The holder of the takeover completes in a batch: its entry (the
	// journal's second, written out) ends, the lapsed one is kept.
	errs, err = s.FinishBatch(ctx, []store.FinishRequest{done(b, "twice", time.Hour), done(taken, "taken", time.Hour)})
	if err != nil || errs[0] == nil || errs[1] != nil {
		t.Fatalf("second FinishBatch = %v, %v; want lease lost for b only", errs, err)
	}
	rec, _ = s.Get(ctx, "stale")
	if rec.Status != store.StatusCompleted || string(rec.Result) != "taken" || len(rec.Journal) != 2 ||
		rec.Journal[0].Outcome != store.OutcomeLapsed || rec.Journal[1].Outcome != store.OutcomeCompleted {
		t.Fatalf("taken-over key after FinishBatch: %+v", rec)
	}
	// The same attempt id with another fence, and the same fence with
	// another attempt id, do not hold the key.
	c := claimNew(t, s, "c")
	wrongFence, wrongID := done(c, "x", time.Hour), done(c, "x", time.Hour)
	wrongFence.Fence++
	wrongID.AttemptID = store.NewAttemptID()
	if errs, err := s.FinishBatch(ctx, []store.FinishRequest{wrongFence, wrongID, done(a, "x", time.Hour)}); err != nil ||
		!errors.Is(errs[0], store.ErrLeaseLost) || !errors.Is(errs[1], store.ErrLeaseLost) {
		t.Fatalf("FinishBatch of another fence, another attempt id: %v, %v; want ErrLeaseLost for both", errs, err)
	}
	if rec, err := s.Get(ctx, "c"); err != nil || rec.Status != store.StatusInProgress {
		t.Fatalf("c after refused completions: %+v, %v", rec, err)
	}
	if errs, err := s.FinishBatch(ctx, nil); err != nil || len(errs) != 0 {
		t.Fatalf("FinishBatch(nil) = %v, %v", errs, err)
	}
	if _, err := s.FinishBatch(ctx, []store.FinishRequest{done(c, "x", time.Hour), {Key: "c", Fence: 1, Outcome: store.OutcomeCompleted}}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("FinishBatch with a request without an attempt id: %v, want ErrInvalid", err)
	}
	if rec, err := s.Get(ctx, "c"); err != nil || rec.Status != store.StatusInProgress {
		t.Fatalf("c after a refused batch: %+v, %v; want nothing sent", rec, err)
	}
}

// TestFinishBatchKeyOrder: each key gets its own result and retention
// whatever the keys' order in the call, with keys whose byte order is not
// their linguistic order (the statement looks each key's inputs up in the
// keys sorted by byte).
func TestFinishBatchKeyOrder(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, new(testClocks))
	ctx := context.Background()
	keys := []string{"é", "B", "a", "Z", "a b", "ä", "aa", "`", "日本", "b"}
	var cs []store.FinishRequest
	for i, k := range keys {
		cr := claimNew(t, s, k)
		cs = append(cs, store.FinishRequest{Key: k, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted,
			Result: []byte("result of " + k), Retention: time.Duration(i+1) * time.Hour})
	}
	errs, err := s.FinishBatch(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	now, _ := s.Now(ctx)
	for i, k := range keys {
		rec, err := s.Get(ctx, k)
		if errs[i] != nil || err != nil || rec.Status != store.StatusCompleted || string(rec.Result) != "result of "+k {
			t.Fatalf("%q: batch error %v; after it %+v, %v", k, errs[i], rec, err)
		}
		if d := rec.ExpiresAt.Sub(now); d < time.Duration(i+1)*time.Hour-time.Minute || d > time.Duration(i+1)*time.Hour {
			t.Fatalf("%q expires in %v, want %v", k, d, time.Duration(i+1)*time.Hour)
		}
	}
}

// TestFinishBatchEncoding: in a database whose encoding orders some
// keys otherwise than their UTF-8 bytes do (WIN1252: "ÿ" is 0xFF, "€"
// 0x80), FinishBatch still finds each key's inputs.
func TestFinishBatchEncoding(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := testPool(t)
	db := fmt.Sprintf("idem_win1252_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+db+" ENCODING 'WIN1252' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)") })
	cfg, err := pgxpool.ParseConfig(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Database = db
	cfg.ConnConfig.RuntimeParams["client_encoding"] = "UTF8"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := New(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	keys := []string{"ÿ", "€", "a"} // UTF-8: 61 < C3 BF < E2 82 AC; WIN1252: 80 < 61 < FF
	var cs []store.FinishRequest
	for _, k := range keys {
		cr, err := s.Claim(ctx, req(k))
		if err != nil || !cr.Acquired {
			t.Fatalf("Claim %q: %+v, %v", k, cr, err)
		}
		cs = append(cs, store.FinishRequest{Key: k, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted,
			Result: []byte("result of " + k), Retention: time.Hour})
	}
	errs, err := s.FinishBatch(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		rec, err := s.Get(ctx, k)
		if errs[i] != nil || err != nil || rec.Status != store.StatusCompleted || string(rec.Result) != "result of "+k {
			t.Fatalf("%q: batch error %v; after it %+v, %v", k, errs[i], rec, err)
		}
	}
}

// TestJournalTrim: the journal keeps the newest store.MaxJournal attempts.
func TestJournalTrim(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, new(testClocks))
	ctx := context.Background()
	const attempts = store.MaxJournal + 5
	for i := 1; i <= attempts; i++ {
		cr := claimNew(t, s, "k")
		if !cr.Acquired || cr.Record.Attempt != i {
			t.Fatalf("claim %d: %+v", i, cr)
		}
		if err := s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: fmt.Sprint("try ", i)}); err != nil {
			t.Fatal(err)
		}
	}
	rec, err := s.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Journal) != store.MaxJournal || rec.Journal[0].Attempt != attempts-store.MaxJournal+1 || rec.Journal[store.MaxJournal-1].Attempt != attempts {
		t.Fatalf("journal of %d entries from attempt %d to %d, want the newest %d", len(rec.Journal),
			rec.Journal[0].Attempt, rec.Journal[len(rec.Journal)-1].Attempt, store.MaxJournal)
	}
	for _, e := range rec.Journal {
		if e.Outcome != store.OutcomeReleased || e.Reason != fmt.Sprint("try ", e.Attempt) || e.Policy != "at_least_once" {
			t.Fatalf("entry %+v", e)
		}
	}
}

// TestTextSanitized: owners, correlation ids and reasons that PostgreSQL
// text cannot hold (NUL, bytes that are not UTF-8) are stored with U+FFFD
// instead of failing the call.
func TestTextSanitized(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, new(testClocks))
	ctx := context.Background()
	r := req("k")
	r.Owner, r.Correlation = "own\x00er", "corr\xff"
	cr, err := s.Claim(ctx, r)
	if err != nil || !cr.Acquired {
		t.Fatalf("Claim: %+v, %v", cr, err)
	}
	if err := s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: "bad \xfe\x00 reason"}); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, "k")
	if err != nil || rec.Owner != "own\uFFFDer" || rec.Reason != "bad \uFFFD\uFFFD reason" || rec.Journal[0].Correlation != "corr\uFFFD" {
		t.Fatalf("record %+v, %v", rec, err)
	}
	// Keys are never changed: a key PostgreSQL cannot hold is an error.
	if _, err := s.Claim(ctx, req("k\x00")); err == nil {
		t.Fatal("Claim of a key with a NUL byte: no error")
	}
}

// TestResolveDefaultRetention: Resolve(done) without a retention keeps the
// record for idem.DefaultRetention.
func TestResolveDefaultRetention(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, new(testClocks))
	ctx := context.Background()
	first := claimNew(t, s, "k")
	rec, err := s.Resolve(ctx, store.ResolveRequest{Key: "k", Done: true, Result: []byte("r"), Reason: "checked", By: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	now, _ := s.Now(ctx)
	if d := rec.ExpiresAt.Sub(now); d < store.DefaultRetention-time.Minute || d > store.DefaultRetention {
		t.Fatalf("ExpiresAt in %v, want %v", d, store.DefaultRetention)
	}
	if j := rec.Journal[0]; j.Outcome != store.OutcomeResolvedDone || j.ResolvedBy != "alice" || j.Reason != "checked" {
		t.Fatalf("journal %+v", rec.Journal)
	}
	// A second decision gets an entry of its own.
	rec, err = s.Resolve(ctx, store.ResolveRequest{Key: "k", Done: false, Reason: "undo", By: "bob"})
	if err != nil || len(rec.Journal) != 2 || !rec.Journal[1].Decision || rec.Journal[1].ResolvedBy != "bob" || rec.Journal[1].Fence != first.Record.Fence+2 {
		t.Fatalf("second Resolve: %+v, %v", rec.Journal, err)
	}
}

// TestServerClock: the store's clock is the server's.
func TestServerClock(t *testing.T) {
	t.Parallel()
	s, err := Open(context.Background(), testURL(t), WithSchema(newSchema(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	before := time.Now()
	now, err := s.Now(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Between this machine's clock before and after the call, give or
	// take a second: a loaded machine can take that long to answer.
	if lo, hi := before.Add(-time.Second), time.Now().Add(time.Second); now.Before(lo) || now.After(hi) {
		t.Fatalf("Now() is %v, not within a second of this machine's clock during the call (%v to %v; the server runs here)", now, before, hi.Add(-time.Second))
	}
	if now.Location() != time.UTC {
		t.Fatalf("Now() in %v, want UTC", now.Location())
	}
}

// TestForeverRetention: the longest durations (time.Duration(math.MaxInt64),
// the usual "keep it forever") keep the record that long, as
// the store package does, instead of overflowing into an expiry in the
// past that makes a completed key run again.
func TestForeverRetention(t *testing.T) {
	s := newTestStore(t, new(testClocks))
	ctx := context.Background()
	forever := time.Duration(math.MaxInt64)
	cr, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Lease: forever, Retention: forever})
	if err != nil {
		t.Fatal(err)
	}
	if want := cr.Now.Add(forever); cr.Record.ExpiresAt.Before(want.Add(-time.Second)) || cr.Record.LeaseUntil.Before(want.Add(-time.Second)) {
		t.Fatalf("claimed with lease and retention %v: LeaseUntil %v, ExpiresAt %v, want about %v", forever, cr.Record.LeaseUntil, cr.Record.ExpiresAt, want)
	}
	if err := s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("v"), Retention: forever}); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, "k")
	if err != nil || rec.Status != store.StatusCompleted {
		t.Fatalf("Get after Complete with retention %v = %v, %v; want completed", forever, rec.Status, err)
	}
	again, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Lease: time.Minute, Retention: time.Hour})
	if err != nil || again.Acquired {
		t.Fatalf("claim of a key completed with retention %v: acquired %v, %v; want a duplicate", forever, again.Acquired, err)
	}
}
