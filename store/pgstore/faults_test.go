package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// faultStore is a store on a pool of its own with one connection, named
// by a unique application_name, so that a test can find its backend in
// pg_stat_activity and terminate it.
type faultStore struct {
	*Store
	app    string
	clocks *testClocks
}

func newFaultStore(t *testing.T) *faultStore {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	rand.Read(b[:])
	app := "idemtest-fault-" + hex.EncodeToString(b[:])
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	clocks := new(testClocks)
	schema := newSchema(t)
	s, err := New(context.Background(), pool, WithSchema(schema), withClockTable(clocks.get(t, schema)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &faultStore{Store: s, app: app, clocks: clocks}
}

// lock begins a transaction on another connection that locks key's row
// (FOR UPDATE), so that the store's next write of the key waits for it.
// It returns a function that rolls the transaction back.
func (f *faultStore) lock(t *testing.T, key string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := testPool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var k string
	if err := tx.QueryRow(ctx, "SELECT key FROM "+f.Table()+" WHERE key = $1 FOR UPDATE", key).Scan(&k); err != nil {
		tx.Rollback(ctx)
		t.Fatalf("locking %q: %v", key, err)
	}
	done := false
	release = func() {
		if !done {
			done = true
			tx.Rollback(ctx)
		}
	}
	t.Cleanup(release)
	return release
}

// killWaiting waits until the store's backend waits for a lock, and
// terminates it with pg_terminate_backend, as an operator or a failover
// would.
func (f *faultStore) killWaiting(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var pid int32
		err := testPool(t).QueryRow(ctx, `SELECT pid FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock' AND state = 'active'`, f.app).Scan(&pid)
		if err == nil {
			var ok bool
			if err := testPool(t).QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
				t.Fatalf("pg_terminate_backend(%d): %v %v", pid, ok, err)
			}
			return
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the store's statement never waited for the lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func faultLedger(s store.Store, p store.Policy) *idem.Ledger {
	return idem.New(s, idem.WithLogger(slog.New(slog.DiscardHandler)), idem.WithOwner("fault"),
		idem.WithPolicy(p), idem.WithLease(30*time.Second))
}

// wantStoreError fails unless err is a store error that no caller can read
// as an outcome.
func wantStoreError(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want a store error", what)
	}
	for _, outcome := range []error{idem.ErrInProgress, idem.ErrIndeterminate, idem.ErrMismatch, idem.ErrFailed,
		store.ErrLeaseLost, store.ErrNotFound, store.ErrCorrupt} {
		if errors.Is(err, outcome) {
			t.Fatalf("%s: err = %v reads as the outcome %v, want a store error", what, err, outcome)
		}
	}
	var se *idem.StoreError
	if !errors.As(err, &se) {
		t.Fatalf("%s: err = %v (%T), want a *idem.StoreError", what, err, err)
	}
}

// TestKillMidClaim terminates the store's connection while its claim waits
// for the row (a lapsed attempt that the claim would take over: under
// AtLeastOnce, or under AtMostOnce with a Reconcile hook): the caller gets
// a store error and neither the hook nor fn runs; the record is as it was,
// and the next claim behaves by the policy.
func TestKillMidClaim(t *testing.T) {
	for _, p := range []store.Policy{store.AtLeastOnce, store.AtMostOnce} {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			f := newFaultStore(t)
			ctx := context.Background()
			l := faultLedger(f, p)
			key := idem.Key("kill", "claim")

			// An attempt that never finished, lapsed.
			first, err := f.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: key.String(), Owner: "crashed", Policy: p, Lease: time.Second, Retention: time.Hour})
			if err != nil || !first.Acquired {
				t.Fatalf("first claim: %+v, %v", first, err)
			}
			f.clocks.advance(t, 2*time.Second)

			release := f.lock(t, key.String())
			var ran atomic.Int64
			done := make(chan error, 1)
			// Under AtMostOnce only a caller with a Reconcile hook takes a
			// lapsed attempt over (a claim with TakeLapsed); a claim that
			// cannot take the key writes nothing and waits for nothing.
			var opts []idem.CallOption
			if p == store.AtMostOnce {
				opts = append(opts, idem.WithReconcile(func(context.Context, idem.Lapsed) ([]byte, bool, error) {
					return nil, false, nil
				}))
			}
			go func() {
				_, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { ran.Add(1); return []byte("x"), nil }, opts...)
				done <- err
			}()
			f.killWaiting(t)
			err = <-done
			wantStoreError(t, "Do whose claim's connection was terminated", err)
			if n := ran.Load(); n != 0 {
				t.Fatalf("fn ran %d times after a failed claim", n)
			}
			release()

			rec, err := f.Get(ctx, key.String())
			if err != nil {
				t.Fatalf("Get after the kill: %v", err)
			}
			if rec.Status != store.StatusInProgress || rec.Fence != first.Record.Fence || rec.AttemptID != first.Record.AttemptID ||
				rec.Owner != "crashed" || len(rec.Journal) != 1 {
				t.Fatalf("after the kill: {%s, fence %d, attempt id %q, owner %q, %d entries}, want the lapsed attempt untouched (fence %d, attempt id %q)",
					rec.Status, rec.Fence, rec.AttemptID, rec.Owner, len(rec.Journal), first.Record.Fence, first.Record.AttemptID)
			}
			res, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { ran.Add(1); return []byte("second"), nil })
			switch p {
			case store.AtLeastOnce:
				if err != nil || !res.Takeover || res.Fence != first.Record.Fence+1 || ran.Load() != 1 {
					t.Fatalf("Do after the kill: %+v, %v (fn ran %d); want a takeover at fence %d", res, err, ran.Load(), first.Record.Fence+1)
				}
			case store.AtMostOnce:
				if !errors.Is(err, idem.ErrIndeterminate) || ran.Load() != 0 {
					t.Fatalf("Do after the kill: %v (fn ran %d); want ErrIndeterminate", err, ran.Load())
				}
			}
		})
	}
}

// TestKillMidComplete terminates the store's connection while the
// completion waits for the row. The completion names its attempt, so the
// Ledger sends it again: once the row is free the key is completed with
// fn's result, fn ran once, and Do succeeds.
func TestKillMidComplete(t *testing.T) {
	for _, p := range []store.Policy{store.AtLeastOnce, store.AtMostOnce} {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			f := newFaultStore(t)
			ctx := context.Background()
			l := faultLedger(f, p)
			key := idem.Key("kill", "complete")

			var (
				ran  atomic.Int64
				held store.Record // the record while fn runs
			)
			inside := make(chan struct{})
			proceed := make(chan struct{})
			type answer struct {
				res idem.Result
				err error
			}
			done := make(chan answer, 1)
			go func() {
				res, err := l.Do(ctx, key, func(context.Context) ([]byte, error) {
					ran.Add(1)
					var err error
					if held, err = f.Get(ctx, key.String()); err != nil {
						t.Errorf("Get while fn runs: %v", err)
					}
					close(inside)
					<-proceed
					return []byte("sent"), nil
				})
				done <- answer{res, err}
			}()
			<-inside
			release := f.lock(t, key.String())
			close(proceed)
			f.killWaiting(t)
			// The killed statement did not commit: the row is as fn left it.
			if rec, err := f.Get(ctx, key.String()); err != nil || rec.Status != store.StatusInProgress || rec.Fence != held.Fence {
				t.Fatalf("after the kill: %+v, %v; want in_progress at fence %d", rec, err, held.Fence)
			}
			release()
			a := <-done
			if a.err != nil || a.res.Replayed || string(a.res.Value) != "sent" || ran.Load() != 1 {
				t.Fatalf("Do whose completion's connection was terminated: %+v, %v (fn ran %d); want its result, fn run once", a.res, a.err, ran.Load())
			}
			rec, err := f.Get(ctx, key.String())
			if err != nil || rec.Status != store.StatusCompleted || rec.Fence != held.Fence || rec.AttemptID != held.AttemptID || string(rec.Result) != "sent" {
				t.Fatalf("after the completion was sent again: %+v, %v; want completed by the attempt at fence %d", rec, err, held.Fence)
			}
			res, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { ran.Add(1); return nil, nil })
			if err != nil || !res.Replayed || string(res.Value) != "sent" || ran.Load() != 1 {
				t.Fatalf("a duplicate: %+v, %v (fn ran %d); want the result replayed", res, err, ran.Load())
			}
		})
	}
}

// TestCompleteOutOfReach holds the row for longer than the Ledger's
// finish window, so that every try of the completion waits and is
// cancelled: the caller gets a store error (not a success), nothing is
// recorded, and the key is left to its lease, whose policy decides.
func TestCompleteOutOfReach(t *testing.T) {
	for _, p := range []store.Policy{store.AtLeastOnce, store.AtMostOnce} {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			f := newFaultStore(t)
			ctx := context.Background()
			// A 2 s lease: a finish window of 5 s (the Ledger's least).
			l := idem.New(f, idem.WithLogger(slog.New(slog.DiscardHandler)), idem.WithOwner("fault"),
				idem.WithPolicy(p), idem.WithLease(2*time.Second))
			key := idem.Key("out-of-reach", "complete")

			var (
				ran  atomic.Int64
				held store.Record
			)
			inside := make(chan struct{})
			proceed := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				_, err := l.Do(ctx, key, func(context.Context) ([]byte, error) {
					ran.Add(1)
					var err error
					if held, err = f.Get(ctx, key.String()); err != nil {
						t.Errorf("Get while fn runs: %v", err)
					}
					close(inside)
					<-proceed
					return []byte("sent"), nil
				})
				done <- err
			}()
			<-inside
			release := f.lock(t, key.String())
			close(proceed)
			f.killWaiting(t)
			err := <-done
			wantStoreError(t, "Do whose completion could not be recorded", err)
			// The last try was cancelled on the server (pgx sends the
			// cancel as it gives the connection up): until that lands it
			// still waits, and would complete the key once the row is
			// free. An error is never an outcome.
			for deadline := time.Now().Add(10 * time.Second); ; {
				var n int
				testPool(t).QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'", f.app).Scan(&n)
				if n == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the cancelled completion still waits on the server")
				}
				time.Sleep(5 * time.Millisecond)
			}
			release()
			rec, err := f.Get(ctx, key.String())
			if err != nil || rec.Status != store.StatusInProgress || rec.Fence != held.Fence || rec.AttemptID != held.AttemptID || len(rec.Result) != 0 {
				t.Fatalf("after the completion failed: %+v, %v; want in_progress at fence %d, attempt id %q, nothing recorded", rec, err, held.Fence, held.AttemptID)
			}
			f.clocks.advance(t, time.Minute)
			res, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { ran.Add(1); return []byte("again"), nil })
			switch p {
			case store.AtLeastOnce:
				if err != nil || !res.Takeover || res.Attempt != 2 || res.Fence != held.Fence+1 || ran.Load() != 2 {
					t.Fatalf("Do after the lease passed: %+v, %v (fn ran %d); want a takeover, attempt 2, fence %d", res, err, ran.Load(), held.Fence+1)
				}
			case store.AtMostOnce:
				if !errors.Is(err, idem.ErrIndeterminate) || ran.Load() != 1 {
					t.Fatalf("Do after the lease passed: %v (fn ran %d); want ErrIndeterminate", err, ran.Load())
				}
			}
		})
	}
}

// TestContextCancelledMidClaim cancels the context of a claim that waits
// for the row: the claim returns promptly with the context's error, the
// statement is cancelled on the server, and nothing is written.
func TestContextCancelledMidClaim(t *testing.T) {
	t.Parallel()
	f := newFaultStore(t)
	ctx := context.Background()
	r := store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "first", Policy: store.AtLeastOnce, Lease: time.Second, Retention: time.Hour}
	first, err := f.Claim(ctx, r)
	if err != nil || !first.Acquired {
		t.Fatalf("first claim: %+v, %v", first, err)
	}
	if err := f.Finish(ctx, store.FinishRequest{Key: "k", Fence: first.Record.Fence, AttemptID: first.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: "retry"}); err != nil {
		t.Fatal(err)
	}
	r.AttemptID = store.NewAttemptID() // the next attempt
	release := f.lock(t, "k")
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		r.Owner = "second"
		_, err := f.Claim(cctx, r)
		done <- err
	}()
	// Wait until the claim waits for the lock, then cancel it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		testPool(t).QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'", f.app).Scan(&n)
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the claim never waited for the lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Claim with a cancelled context: %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Claim did not return after its context was cancelled")
	}
	t.Logf("Claim returned %v after the cancel", time.Since(start).Round(time.Millisecond))
	// pgx cancels the statement on the server (a CancelRequest, sent as it
	// closes the connection). Until that lands the statement still waits,
	// and would complete if the lock were released: an error is never an
	// outcome. Once it has landed, nothing was written.
	for deadline := time.Now().Add(10 * time.Second); ; {
		var n int
		testPool(t).QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'", f.app).Scan(&n)
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cancelled claim still waits on the server")
		}
		time.Sleep(5 * time.Millisecond)
	}
	release()
	rec, err := f.Get(ctx, "k")
	if err != nil || rec.Status != store.StatusReleased || rec.Fence != first.Record.Fence || rec.AttemptID != first.Record.AttemptID {
		t.Fatalf("after the cancelled claim: %+v, %v; want the released record at fence %d", rec, err, first.Record.Fence)
	}
	// An already cancelled context does not reach the database.
	if _, err := f.Claim(cctx, r); !errors.Is(err, context.Canceled) {
		t.Fatalf("Claim with a cancelled context: %v", err)
	}
	if cr, err := f.Claim(ctx, r); err != nil || !cr.Acquired || cr.Record.Fence != first.Record.Fence+1 {
		t.Fatalf("claim after the cancel: %+v, %v; want acquired at fence %d", cr, err, first.Record.Fence+1)
	}
}

// TestClosed checks that every call of a closed store, including InTx and
// the database/sql adapter's, returns an error wrapping store.ErrClosed.
func TestClosed(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, new(testClocks))
	sq := SQL(s)
	if err := sq.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ctx := context.Background()
	r := store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Policy: store.AtLeastOnce, Lease: time.Second}
	calls := map[string]error{}
	_, calls["Claim"] = s.Claim(ctx, r)
	_, calls["ClaimBatch"] = s.ClaimBatch(ctx, []store.ClaimRequest{r, r})
	end := func(o store.Outcome) store.FinishRequest {
		return store.FinishRequest{Key: "k", Fence: 1, AttemptID: r.AttemptID, Outcome: o, Retention: time.Hour}
	}
	calls["Finish"] = s.Finish(ctx, end(store.OutcomeCompleted))
	_, calls["FinishBatch"] = s.FinishBatch(ctx, []store.FinishRequest{end(store.OutcomeCompleted), end(store.OutcomeFailed)})
	calls["Finish(failed)"] = s.Finish(ctx, end(store.OutcomeFailed))
	calls["Finish(released)"] = s.Finish(ctx, end(store.OutcomeReleased))
	calls["Finish(abandoned)"] = s.Finish(ctx, end(store.OutcomeAbandoned))
	_, calls["Extend"] = s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: 1, AttemptID: r.AttemptID, Lease: time.Hour})
	_, calls["Get"] = s.Get(ctx, "k")
	_, calls["List"] = s.List(ctx, store.ListQuery{})
	_, calls["Resolve"] = s.Resolve(ctx, store.ResolveRequest{Key: "k"})
	calls["Delete"] = s.Delete(ctx, "k")
	_, calls["Sweep"] = s.Sweep(ctx, 10)
	_, calls["Now"] = s.Now(ctx)
	calls["Migrate"] = s.Migrate(ctx)
	_, _, calls["InTx"] = s.InTx(ctx, r, time.Hour, func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil })
	_, _, calls["SQL.InTx"] = sq.InTx(ctx, r, time.Hour, nil)
	for name, err := range calls {
		if !errors.Is(err, store.ErrClosed) {
			t.Errorf("%s on a closed store: %v, want ErrClosed", name, err)
		}
	}
}

// TestDuplicateDoesNotLock: a claim that finds the key not claimable
// (completed, busy) writes nothing and takes no row lock, so it answers at
// once even while another transaction holds the row.
func TestDuplicateDoesNotLock(t *testing.T) {
	t.Parallel()
	f := newFaultStore(t)
	ctx := context.Background()
	done := claimNew(t, f, "done")
	if err := f.Finish(ctx, store.FinishRequest{Key: "done", Fence: done.Record.Fence, AttemptID: done.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	claimNew(t, f, "busy")
	var before string
	testPool(t).QueryRow(ctx, "SELECT string_agg(xmin::text || '/' || xmax::text, ',' ORDER BY key) FROM "+f.Table()).Scan(&before)
	f.lock(t, "done")
	f.lock(t, "busy")
	// A claim that waited for the row would wait until the test ends: 10 s
	// tells it from two answers on a loaded server.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, key := range []string{"done", "busy"} {
		cr, err := f.Claim(cctx, req(key))
		if err != nil || cr.Acquired {
			t.Fatalf("Claim(%q) while another transaction holds the row: %+v, %v; want an answer at once", key, cr, err)
		}
	}
	var after string
	testPool(t).QueryRow(ctx, "SELECT string_agg(xmin::text || '/' || xmax::text, ',' ORDER BY key) FROM "+f.Table()).Scan(&after)
	t.Logf("rows (xmin/xmax) before %s, after %s", before, after)
}
