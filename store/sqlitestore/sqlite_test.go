package sqlitestore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	embedded "github.com/idemkit/idem/internal/migrations"
	"github.com/idemkit/idem/store"

	"github.com/idemkit/idem"
)

// writerQuery runs q on the writer's own connection and returns the first
// column of its first row.
func writerQuery(t *testing.T, s *Store, q string) any {
	t.Helper()
	var v any
	err := s.w.do(context.Background(), false, func(w rw, _ time.Time) error {
		rows, err := w.(*driverRW).conn.(driver.QueryerContext).QueryContext(context.Background(), q, nil)
		if err != nil {
			return err
		}
		defer rows.Close()
		dest := make([]driver.Value, len(rows.Columns()))
		if err := rows.Next(dest); err != nil {
			return err
		}
		v = dest[0]
		return nil
	})
	if err != nil {
		t.Fatalf("%s on the writer: %v", q, err)
	}
	return v
}

func TestDurabilitySettings(t *testing.T) {
	for _, tc := range []struct {
		opts []Option
		sync int64
	}{
		{nil, 2}, // FULL
		{[]Option{WithSynchronous(SyncNormal)}, 1},
	} {
		s, _ := openTest(t, append(tc.opts, WithBusyTimeout(234*time.Millisecond))...)
		var mode string
		if err := s.DB().QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
			t.Fatalf("journal_mode on DB() = %q, %v; want wal", mode, err)
		}
		var sync, busy int64
		if err := s.DB().QueryRow(`PRAGMA synchronous`).Scan(&sync); err != nil || sync != tc.sync {
			t.Fatalf("synchronous on DB() = %d, %v; want %d", sync, err, tc.sync)
		}
		if err := s.DB().QueryRow(`PRAGMA busy_timeout`).Scan(&busy); err != nil || busy != 234 {
			t.Fatalf("busy_timeout on DB() = %d, %v; want 234", busy, err)
		}
		if got := writerQuery(t, s, "PRAGMA synchronous"); got != tc.sync {
			t.Fatalf("synchronous on the writer = %v, want %d", got, tc.sync)
		}
		if got := writerQuery(t, s, "PRAGMA journal_mode"); got != "wal" {
			t.Fatalf("journal_mode on the writer = %v, want wal", got)
		}
		if got := writerQuery(t, s, "PRAGMA busy_timeout"); got != int64(234) {
			t.Fatalf("busy_timeout on the writer = %v, want 234", got)
		}
		mustClaim(t, s, req("synced"))
		if st := s.Stats(); (st.Syncs > 0) != (tc.sync == 2) || st.Commits != 1 {
			t.Fatalf("stats after one claim: %+v", st)
		}
		// DB()'s transactions take the write lock at BEGIN.
		tx, err := s.DB().Begin()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Claim(context.Background(), req("k")); err == nil {
			t.Fatal("a claim committed while a DB() transaction held the write lock")
		}
		tx.Rollback()
	}
	if _, err := Open(context.Background(), filepath.Join(t.TempDir(), "x.db"), WithSynchronous("OFF")); err == nil {
		t.Fatal("Open accepted synchronous=OFF")
	}
	for _, p := range []string{"", ":memory:", "file:x.db", "a?b.db"} {
		if _, err := Open(context.Background(), p); err == nil {
			t.Fatalf("Open(%q) succeeded", p)
		}
	}
	if _, err := Open(context.Background(), filepath.Join(t.TempDir(), "missing", "dir", "x.db")); err == nil {
		t.Fatal("Open in a missing directory succeeded")
	}
}

func TestGroupCommit(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	const callers, per = 64, 8
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for g := range callers {
		wg.Go(func() {
			for i := range per {
				key := fmt.Sprintf("g%d:%d", g, i)
				res, err := s.Claim(ctx, req(key))
				if err == nil && !res.Acquired {
					err = fmt.Errorf("claim %s not acquired", key)
				}
				if err == nil {
					err = s.Finish(ctx, store.FinishRequest{Key: key, Fence: res.Record.Fence, AttemptID: res.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte(key), Retention: time.Hour})
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := s.Stats()
	t.Logf("%+v: %.1f ops per batch, %.3f syncs per op", st, float64(st.BatchedOps)/float64(st.Batches), float64(st.Syncs)/float64(st.Ops))
	if st.Ops != 2*callers*per {
		t.Fatalf("Ops = %d, want %d", st.Ops, 2*callers*per)
	}
	if st.Syncs >= st.Ops/4 {
		t.Fatalf("Syncs = %d for %d ops: the writer did not group the syncs", st.Syncs, st.Ops)
	}
	if st.Commits != st.Syncs || st.Batches < st.Commits {
		t.Fatalf("stats %+v: every commit of the writer syncs once under SyncFull", st)
	}
	for g := range callers {
		for i := range per {
			key := fmt.Sprintf("g%d:%d", g, i)
			rec, err := s.Get(ctx, key)
			if err != nil || rec.Status != store.StatusCompleted || string(rec.Result) != key {
				t.Fatalf("%s: %+v %v", key, rec, err)
			}
		}
	}
}

// holdWriter queues an operation that blocks the writer until the returned
// release is called, so that the operations queued meanwhile run in one
// batch.
func holdWriter(t *testing.T, s *Store) (release func()) {
	t.Helper()
	started, proceed := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.w.do(context.Background(), false, func(rw, time.Time) error {
			close(started)
			<-proceed
			return nil
		})
	}()
	<-started
	return func() {
		close(proceed)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// waitQueued waits until n operations wait in the writer's queue.
func waitQueued(t *testing.T, s *Store, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(s.w.queue) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d operations queued, want %d", len(s.w.queue), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestBatchIsolation(t *testing.T) {
	ctx := context.Background()
	s, clk := openTest(t)
	// A statement that fails inside the batch: the trigger refuses key boom.
	if _, err := s.DB().Exec(`CREATE TRIGGER refuse_boom BEFORE INSERT ON idem_records
		WHEN NEW.key = 'boom' BEGIN SELECT RAISE(ABORT, 'boom refused'); END`); err != nil {
		t.Fatal(err)
	}
	// A stale holder whose completion is refused (and annotated) inside the
	// batch.
	first := mustClaim(t, s, req("stale"))
	clk.Advance(time.Minute)
	second := mustClaim(t, s, req("stale"))
	if !second.Takeover {
		t.Fatalf("no takeover: %+v", second)
	}
	// A key to complete in the batch.
	c := mustClaim(t, s, req("c"))

	release := holdWriter(t, s)
	var wg sync.WaitGroup
	results := map[string]error{}
	var mu sync.Mutex
	run := func(name string, f func() error) {
		wg.Go(func() {
			err := f()
			mu.Lock()
			results[name] = err
			mu.Unlock()
		})
	}
	run("boom", func() error { _, err := s.Claim(ctx, req("boom")); return err })
	run("new", func() error { _, err := s.Claim(ctx, req("new")); return err })
	run("stale", func() error {
		return s.Finish(ctx, store.FinishRequest{Key: "stale", Fence: first.Record.Fence, AttemptID: first.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: nil, Retention: time.Hour})
	})
	run("c", func() error {
		return s.Finish(ctx, store.FinishRequest{Key: "c", Fence: c.Record.Fence, AttemptID: c.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("done"), Retention: time.Hour})
	})
	waitQueued(t, s, 4)
	before := s.Stats()
	release()
	wg.Wait()
	st := s.Stats()

	if err := results["boom"]; err == nil || errors.Is(err, store.ErrCorrupt) || errors.Is(err, store.ErrClosed) {
		t.Fatalf("claim of boom: %v, want the statement's error", err)
	}
	if err := results["new"]; err != nil {
		t.Fatalf("claim of new: %v", err)
	}
	if err := results["stale"]; !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("stale complete: %v, want ErrLeaseLost", err)
	}
	if err := results["c"]; err != nil {
		t.Fatalf("complete of c: %v", err)
	}
	if st.Rollbacks-before.Rollbacks != 1 || st.Batches-before.Batches != 2 {
		t.Fatalf("stats before %+v after %+v: want one rolled back and one committed batch after the held one", before, st)
	}
	if rec, err := s.Get(ctx, "new"); err != nil || rec.Status != store.StatusInProgress {
		t.Fatalf("new: %+v %v", rec, err)
	}
	if rec, err := s.Get(ctx, "c"); err != nil || rec.Status != store.StatusCompleted || string(rec.Result) != "done" {
		t.Fatalf("c: %+v %v", rec, err)
	}
	if _, err := s.Get(ctx, "boom"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("boom: %v", err)
	}
	rec, _ := s.Get(ctx, "stale")
	if rec.Fence != second.Record.Fence || rec.AttemptID != second.Record.AttemptID || rec.Status != store.StatusInProgress ||
		rec.Journal[0].LateFinish.IsZero() || rec.Journal[0].AttemptID != first.Record.AttemptID {
		t.Fatalf("stale: %+v, want the takeover's record with the late finish noted", rec)
	}
}

func TestClaimBatch(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	done := mustClaim(t, s, req("done"))
	if err := s.Finish(ctx, store.FinishRequest{Key: "done", Fence: done.Record.Fence, AttemptID: done.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	res, err := s.ClaimBatch(ctx, []store.ClaimRequest{req("a"), req("done"), req("a"), req("b")})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 4 || !res[0].Acquired || res[1].Acquired || res[1].Record.Status != store.StatusCompleted ||
		res[2].Acquired || res[2].Record.Fence != res[0].Record.Fence || res[2].Record.AttemptID != res[0].Record.AttemptID ||
		res[2].Record.Status != store.StatusInProgress || !res[3].Acquired {
		t.Fatalf("ClaimBatch: %+v", res)
	}
	if st := s.Stats(); st.Ops != 2+4 {
		t.Fatalf("Ops = %d, want 6", st.Ops)
	}
	if res, err := s.ClaimBatch(ctx, nil); err != nil || len(res) != 0 {
		t.Fatalf("empty ClaimBatch: %v %v", res, err)
	}

	// A corrupt record fails its own key; the batch's other keys are
	// claimed, and nothing is written for the corrupt one.
	if _, err := s.DB().Exec(`UPDATE idem_records SET journal = '{' WHERE key = 'b'`); err != nil {
		t.Fatal(err)
	}
	res, err = s.ClaimBatch(ctx, []store.ClaimRequest{req("c"), req("b")})
	if err != nil || !res[0].Acquired || res[0].Err != nil || !errors.Is(res[1].Err, store.ErrCorrupt) {
		t.Fatalf("ClaimBatch over a corrupt record: %+v, %v; want c acquired, b ErrCorrupt", res, err)
	}
	if _, err := s.Get(ctx, "b"); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("b after the batch: %v, want it still corrupt", err)
	}
}

func TestCorrupt(t *testing.T) {
	ctx := context.Background()
	for _, damage := range []string{
		`status = 'garbled'`,
		`policy = 'sometimes'`,
		`journal = '{not json'`,
		`fence = 'x'`,
		`expires_at = 'soon'`,
		`result = 7`,
	} {
		t.Run(damage, func(t *testing.T) {
			s, _ := openTest(t)
			c := mustClaim(t, s, req("k"))
			if _, err := s.DB().Exec(`UPDATE idem_records SET ` + damage + ` WHERE key = 'k'`); err != nil {
				t.Fatal(err)
			}
			check := func(what string, err error) {
				t.Helper()
				var ce *store.CorruptError
				if !errors.As(err, &ce) || ce.Key != "k" || !errors.Is(err, store.ErrCorrupt) {
					t.Fatalf("%s: %v, want a *store.CorruptError for k", what, err)
				}
			}
			_, err := s.Get(ctx, "k")
			check("Get", err)
			_, err = s.Claim(ctx, req("k"))
			check("Claim", err)
			check("Complete", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: c.Record.Fence, AttemptID: c.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: nil, Retention: time.Hour}))
			_, err = s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: c.Record.Fence, AttemptID: c.Record.AttemptID, Lease: time.Minute})
			check("Extend", err)
			_, err = s.Resolve(ctx, store.ResolveRequest{Key: "k", Done: true})
			check("Resolve", err)
			_, err = s.List(ctx, store.ListQuery{})
			check("List", err)
			_, _, err = s.InTx(ctx, req("k"), time.Hour, func(context.Context, *sql.Tx) ([]byte, error) {
				t.Fatal("fn ran over a corrupt record")
				return nil, nil
			})
			check("InTx", err)
			// An operator can still delete it.
			if err := s.Delete(ctx, "k"); err != nil {
				t.Fatalf("Delete: %v", err)
			}
		})
	}
}

func TestClosed(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	mustClaim(t, s, req("k"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, store.ErrClosed) {
			t.Fatalf("%s after Close: %v, want ErrClosed", what, err)
		}
	}
	_, err := s.Claim(ctx, req("k"))
	check("Claim", err)
	_, err = s.ClaimBatch(ctx, []store.ClaimRequest{req("k")})
	check("ClaimBatch", err)
	_, err = s.ClaimBatch(ctx, nil)
	check("empty ClaimBatch", err)
	check("Complete", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: 1, AttemptID: "a", Outcome: store.OutcomeCompleted, Result: nil, Retention: time.Hour}))
	check("Fail", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: 1, AttemptID: "a", Outcome: store.OutcomeFailed, Reason: "x", Retention: time.Hour}))
	check("Release", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: 1, AttemptID: "a", Outcome: store.OutcomeReleased, Reason: "x"}))
	check("Abandon", s.Finish(ctx, store.FinishRequest{Key: "k", Fence: 1, AttemptID: "a", Outcome: store.OutcomeAbandoned, Reason: "x"}))
	_, err = s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: 1, AttemptID: "a", Lease: time.Minute})
	check("Extend", err)
	_, err = s.Get(ctx, "k")
	check("Get", err)
	_, err = s.List(ctx, store.ListQuery{})
	check("List", err)
	_, err = s.Resolve(ctx, store.ResolveRequest{Key: "k"})
	check("Resolve", err)
	check("Delete", s.Delete(ctx, "k"))
	_, err = s.Sweep(ctx, 10)
	check("Sweep", err)
	_, err = s.Sweep(ctx, 0)
	check("Sweep(0)", err)
	_, err = s.Now(ctx)
	check("Now", err)
	_, _, err = s.InTx(ctx, req("k"), time.Hour, func(context.Context, *sql.Tx) ([]byte, error) { return nil, nil })
	check("InTx", err)
}

// TestCloseWhileBusy closes the store while callers are queued: each gets
// an answer (done or ErrClosed), none hangs.
func TestCloseWhileBusy(t *testing.T) {
	s, _ := openTest(t)
	release := holdWriter(t, s)
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for i := range errs {
		wg.Go(func() { _, errs[i] = s.Claim(context.Background(), req("k"+strconv.Itoa(i))) })
	}
	waitQueued(t, s, len(errs))
	closed := make(chan error)
	go func() { closed <- s.Close() }()
	time.Sleep(10 * time.Millisecond)
	release()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil && !errors.Is(err, store.ErrClosed) {
			t.Fatalf("claim %d: %v", i, err)
		}
	}
}

func TestMigrations(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	// Several stores (each with its own connections, as processes would)
	// open the fresh file at once.
	var wg sync.WaitGroup
	stores := make([]*Store, 4)
	errs := make([]error, len(stores))
	for i := range stores {
		wg.Go(func() { stores[i], errs[i] = Open(ctx, path) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
	}
	k := mustClaim(t, stores[0], req("k"))
	for _, s := range stores {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	ms, err := embedded.Load(migrationFiles, "migrations", component)
	if err != nil || len(ms) == 0 {
		t.Fatalf("migrations: %v %v", ms, err)
	}
	for range 2 { // reopening changes nothing
		s, err := Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		var n, v int
		if err := s.DB().QueryRow(`SELECT count(*), max(version) FROM idem_migrations WHERE component = ?`, component).Scan(&n, &v); err != nil {
			t.Fatal(err)
		}
		if n != len(ms) || v != len(ms) {
			t.Fatalf("idem_migrations: %d rows, version %d; want %d", n, v, len(ms))
		}
		if rec, err := s.Get(ctx, "k"); err != nil || rec.Fence != k.Record.Fence || rec.AttemptID != k.Record.AttemptID {
			t.Fatalf("k after reopening: %+v %v", rec, err)
		}
		s.Close()
	}
	// A file migrated by a newer build is refused.
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO idem_migrations VALUES (?, 999, '999_future.sql', 0)`, component); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := Open(ctx, path); err == nil {
		t.Fatal("Open accepted a schema newer than the build")
	}
}

// TestHeldRecordStale: a completion that relies on the record this process
// remembers from its claim is still refused when another process took the
// key over meanwhile.
func TestHeldRecordStale(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	path := filepath.Join(t.TempDir(), "idem.db")
	a, err := Open(ctx, path, WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(ctx, path, WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ca := mustClaim(t, a, req("k"))
	clk.Advance(time.Minute)
	cb := mustClaim(t, b, req("k"))
	if !cb.Takeover || cb.Record.Fence != ca.Record.Fence+1 {
		t.Fatalf("takeover by b: %+v", cb)
	}
	if _, err := a.Extend(ctx, store.ExtendRequest{Key: "k", Fence: ca.Record.Fence, AttemptID: ca.Record.AttemptID, Lease: time.Minute}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("stale extend by a: %v", err)
	}
	if err := a.Finish(ctx, store.FinishRequest{Key: "k", Fence: ca.Record.Fence, AttemptID: ca.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("a"), Retention: time.Hour}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("stale complete by a: %v", err)
	}
	if err := b.Finish(ctx, store.FinishRequest{Key: "k", Fence: cb.Record.Fence, AttemptID: cb.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("b"), Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	rec, err := a.Get(ctx, "k")
	if err != nil || string(rec.Result) != "b" || rec.Fence != cb.Record.Fence || rec.AttemptID != cb.Record.AttemptID ||
		rec.Journal[0].LateFinish.IsZero() {
		t.Fatalf("after both: %+v %v", rec, err)
	}
}

func TestInTx(t *testing.T) {
	ctx := context.Background()
	s, clk := openTest(t)
	if _, err := s.DB().Exec(`CREATE TABLE counter (n INTEGER NOT NULL); INSERT INTO counter VALUES (0)`); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		var n int
		if err := s.DB().QueryRow(`SELECT n FROM counter`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	incr := func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		if _, err := tx.ExecContext(ctx, `UPDATE counter SET n = n + 1`); err != nil {
			return nil, err
		}
		return []byte("counted"), nil
	}

	// An error in fn leaves both the counter and the key untouched.
	errFn := errors.New("fn failed")
	_, _, err := s.InTx(ctx, req("inc"), time.Hour, func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		if _, err := incr(ctx, tx); err != nil {
			return nil, err
		}
		return nil, errFn
	})
	if err != errFn {
		t.Fatalf("InTx with a failing fn: %v, want fn's error unchanged", err)
	}
	if n := count(); n != 0 {
		t.Fatalf("counter after the rolled back fn: %d", n)
	}
	if _, err := s.Get(ctx, "inc"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("key after the rolled back fn: %v, want ErrNotFound", err)
	}

	// Two goroutines at once, then repeated calls: exactly one increment.
	var wg sync.WaitGroup
	var mu sync.Mutex
	acquired := 0
	for range 2 {
		wg.Go(func() {
			res, val, err := s.InTx(ctx, req("inc"), time.Hour, incr)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if res.Acquired {
				acquired++
				if string(val) != "counted" || res.Record.Fence != clk.Now().UnixMicro() || res.Record.Attempt != 1 {
					t.Errorf("acquired InTx: %+v %q", res, val)
				}
			} else if res.Record.Status != store.StatusCompleted || string(res.Record.Result) != "counted" {
				t.Errorf("second InTx: %+v", res)
			}
		})
	}
	wg.Wait()
	for range 3 {
		res, _, err := s.InTx(ctx, req("inc"), time.Hour, func(context.Context, *sql.Tx) ([]byte, error) {
			t.Fatal("fn ran for a completed key")
			return nil, nil
		})
		if err != nil || res.Acquired || res.Record.Status != store.StatusCompleted {
			t.Fatalf("repeated InTx: %+v %v", res, err)
		}
	}
	if acquired != 1 || count() != 1 {
		t.Fatalf("acquired %d times, counter %d; want 1 and 1", acquired, count())
	}
	rec, err := s.Get(ctx, "inc")
	if err != nil || rec.Status != store.StatusCompleted || string(rec.Result) != "counted" || rec.Journal[0].Outcome != store.OutcomeCompleted {
		t.Fatalf("record after InTx: %+v %v", rec, err)
	}

	// Through the Ledger.
	l := idem.New(s, idem.WithLogger(slog.New(slog.DiscardHandler)))
	for range 2 {
		res, err := idem.DoTx(ctx, l, idem.Key("ledger", 1), incr)
		if err != nil || string(res.Value) != "counted" {
			t.Fatalf("DoTx: %+v %v", res, err)
		}
	}
	if n := count(); n != 2 {
		t.Fatalf("counter after DoTx twice: %d, want 2", n)
	}

	// A busy key: fn is not called and nothing is written.
	mustClaim(t, s, req("busy"))
	res, _, err := s.InTx(ctx, req("busy"), time.Hour, func(context.Context, *sql.Tx) ([]byte, error) {
		t.Fatal("fn ran for a busy key")
		return nil, nil
	})
	if err != nil || res.Acquired || res.Record.Status != store.StatusInProgress {
		t.Fatalf("InTx on a busy key: %+v %v", res, err)
	}
}

// TestInTxTakeoverAndLeaseLost: InTx decides the claim and the completion
// in memory and writes the record once, so a takeover must still close
// the lapsed attempt in the journal, and a claim whose record expired while
// fn ran must leave nothing behind.
func TestInTxTakeoverAndLeaseLost(t *testing.T) {
	ctx := context.Background()
	s, clk := openTest(t)
	first := mustClaim(t, s, req("t"))
	clk.Advance(31 * time.Second) // the first attempt's lease (30 s) passed
	res, val, err := s.InTx(ctx, req("t"), time.Hour, func(context.Context, *sql.Tx) ([]byte, error) {
		return []byte("second"), nil
	})
	if err != nil || !res.Acquired || !res.Takeover || res.Record.Fence != first.Record.Fence+1 || string(val) != "second" {
		t.Fatalf("InTx over a lapsed attempt: %+v %q %v", res, val, err)
	}
	rec, err := s.Get(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != store.StatusCompleted || rec.Fence != first.Record.Fence+1 || rec.Attempt != 2 || string(rec.Result) != "second" ||
		rec.AttemptID != res.Record.AttemptID || rec.Journal[1].AttemptID != res.Record.AttemptID ||
		len(rec.Journal) != 2 || rec.Journal[0].Outcome != store.OutcomeLapsed ||
		!rec.Journal[1].Takeover || rec.Journal[1].Outcome != store.OutcomeCompleted {
		t.Fatalf("record after the takeover: %+v", rec)
	}

	r := req("late")
	r.Lease, r.Retention = time.Second, time.Second
	_, _, err = s.InTx(ctx, r, time.Hour, func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		clk.Advance(2 * time.Second) // fn outlives its claim's record
		return []byte("late"), nil
	})
	if !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("InTx whose fn outlived its claim's expiry: %v, want ErrLeaseLost", err)
	}
	if _, err := s.Get(ctx, "late"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("key after the lease was lost: %v, want ErrNotFound (the unit rolled back)", err)
	}
}

// TestInTxAndWriter runs InTx calls and group-committed claims at once:
// they share the write lock without errors or long waits.
func TestInTxAndWriter(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	start := time.Now()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 25 {
				key := fmt.Sprintf("tx:%d:%d", g, i)
				if _, _, err := s.InTx(ctx, req(key), time.Hour, func(context.Context, *sql.Tx) ([]byte, error) { return nil, nil }); err != nil {
					t.Error(err)
					return
				}
				if _, err := s.Claim(ctx, req("w:"+key)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("200 mixed writes took %v", d)
	}
	recs, err := s.List(ctx, store.ListQuery{Limit: 1000})
	if err != nil || len(recs) != 200 {
		t.Fatalf("List: %d %v", len(recs), err)
	}
}

// TestContextCanceled: a caller that gives up is answered at once, and an
// operation whose context ended before it ran is not run.
func TestContextCanceled(t *testing.T) {
	s, _ := openTest(t)
	release := holdWriter(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := s.Claim(ctx, req("k")); errc <- err }()
	waitQueued(t, s, 1)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled claim: %v", err)
	}
	release()
	if _, err := s.Get(context.Background(), "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the canceled claim ran: %v", err)
	}
}

// TestQueryPlans: the queries behind Get, List and Sweep use an index, so
// they stay cheap on a large table.
func TestQueryPlans(t *testing.T) {
	s, _ := openTest(t)
	plan := func(q string, args ...any) string {
		t.Helper()
		rows, err := s.DB().Query("EXPLAIN QUERY PLAN "+q, args...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			out = append(out, detail)
		}
		return strings.Join(out, "; ")
	}
	for _, tc := range []struct {
		q    string
		args []any
		want string
	}{
		{sqlLoad, []any{"k"}, "USING PRIMARY KEY (key=?)"},
		{sqlSweep, []any{0, 10}, "INDEX idem_records_expires_at (expires_at<?)"},
		{sqlDelete, []any{"k", 0}, "USING PRIMARY KEY (key=?)"},
		{`SELECT key FROM idem_records WHERE key > ? AND expires_at > ? AND status = 'in_progress' AND lease_until <= ? ORDER BY key LIMIT 10`,
			[]any{"", 0, 0}, "USING INDEX idem_records_in_progress (key>?)"},
		{`SELECT key FROM idem_records WHERE key > ? AND expires_at > ? AND status = 'failed' ORDER BY key LIMIT 10`,
			[]any{"", 0}, "USING INDEX idem_records_failed (key>?)"},
		{`SELECT key FROM idem_records WHERE key > ? AND expires_at > ? AND status = 'released' ORDER BY key LIMIT 10`,
			[]any{"", 0}, "USING INDEX idem_records_released (key>?)"},
		{`SELECT key FROM idem_records WHERE key > ? AND expires_at > ? ORDER BY key LIMIT 10`,
			[]any{"", 0}, "USING PRIMARY KEY (key>?)"},
	} {
		if got := plan(tc.q, tc.args...); !strings.Contains(got, tc.want) {
			t.Errorf("plan of %s:\n%s\nwant it to contain %q", tc.q, got, tc.want)
		}
	}
	// List's own statements: a prefix is a key range of the index the
	// query reads, and nothing is sorted after the read. (The plan shows
	// key>=? as key>?: that the range starts at the prefix, not at the
	// cursor, is BenchmarkServeList's prefix case in cmd/idem.)
	for _, tc := range []struct {
		q    store.ListQuery
		want string
	}{
		{store.ListQuery{}, "USING PRIMARY KEY (key>?)"},
		{store.ListQuery{Prefix: "order:"}, "USING PRIMARY KEY (key>? AND key<?)"},
		{store.ListQuery{Prefix: "order:", After: "order:9"}, "USING PRIMARY KEY (key>? AND key<?)"},
		{store.ListQuery{Status: store.StatusFailed}, "USING INDEX idem_records_failed (key>?)"},
		{store.ListQuery{Status: store.StatusFailed, Prefix: "order:"}, "USING INDEX idem_records_failed (key>? AND key<?)"},
		{store.ListQuery{Indeterminate: true}, "USING INDEX idem_records_in_progress (key>?)"},
		{store.ListQuery{Stuck: true, Prefix: "order:"}, "USING INDEX idem_records_in_progress (key>? AND key<?)"},
		{store.ListQuery{UpdatedAfter: time.Unix(1, 0)}, "USING PRIMARY KEY (key>?)"},
	} {
		q, args := listSQL(tc.q, 0)
		got := plan(q, args...)
		if !strings.Contains(got, tc.want) || strings.Contains(got, "TEMP B-TREE") {
			t.Errorf("plan of List(%+v):\n%s\nwant it to contain %q, and no sort", tc.q, got, tc.want)
		}
	}
}

// TestClaimStart: claims of new keys go straight to the writer (no read);
// during a flood of duplicates, claims read first and answer from the read,
// without the writer.
func TestClaimStart(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	for i := range 20 {
		c := mustClaim(t, s, req(fmt.Sprint("k", i)))
		if err := s.Finish(ctx, store.FinishRequest{Key: c.Record.Key, Fence: c.Record.Fence, AttemptID: c.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	if s.dupes.Often() {
		t.Fatal("new keys made claims read first")
	}
	before := s.Stats()
	for i := range 200 {
		res := mustClaim(t, s, req(fmt.Sprint("k", i%20)))
		if res.Acquired || res.Record.Status != store.StatusCompleted || string(res.Record.Result) != "r" {
			t.Fatalf("duplicate claim: %+v", res)
		}
	}
	if !s.dupes.Often() {
		t.Fatal("a flood of duplicates did not make claims read first")
	}
	if n := s.Stats().BatchedOps - before.BatchedOps; n > 20 {
		t.Fatalf("%d of 200 duplicate claims went through the writer", n)
	}
	// Back to new keys: claims go back to the writer first, and stay right.
	for i := range 40 {
		if res := mustClaim(t, s, req(fmt.Sprint("new", i))); !res.Acquired {
			t.Fatalf("new key not acquired: %+v", res)
		}
	}
	if s.dupes.Often() {
		t.Fatal("claims still read first after 40 new keys")
	}
}

// TestClaimRetriedBatch: when the writer rolls back a transaction (another
// operation's statement failed) and runs the operations again, a claim
// whose record changed in between answers what its second run wrote. Here
// another owner's record for the key is there on the first run (stands for
// another process, which can write between the rollback and the retry)
// and gone on the second, so the claim's ready-made INSERT misses on the
// first run (decided in the writer: busy) and succeeds on the second.
func TestClaimRetriedBatch(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			ctx := context.Background()
			s, _ := openTest(t)
			release := holdWriter(t, s)
			other := req("k")
			other.Owner = "other"
			runs := 0
			go s.w.do(ctx, false, func(w rw, now time.Time) error {
				runs++
				if runs == 1 {
					var r store.ClaimResult
					rec, ver, err := w.load("k")
					if err == nil {
						_, _, err = decideIn(w, "k", rec, ver, claimM(other, &r), now)
					}
					return err
				}
				return nil
			})
			waitQueued(t, s, 1)
			type answer struct {
				res store.ClaimResult
				err error
			}
			got := make(chan answer, 1)
			go func() {
				if batch {
					res, err := s.ClaimBatch(ctx, []store.ClaimRequest{req("k")})
					if err == nil {
						err = res[0].Err
						got <- answer{res[0], err}
						return
					}
					got <- answer{err: err}
					return
				}
				res, err := s.Claim(ctx, req("k"))
				got <- answer{res, err}
			}()
			waitQueued(t, s, 2)
			failed := make(chan error, 1)
			go func() {
				failed <- s.w.do(ctx, false, func(rw, time.Time) error {
					return &stmtError{"test", errors.New("injected statement failure")}
				})
			}()
			waitQueued(t, s, 3)
			release()
			if err := <-failed; err == nil {
				t.Fatal("the injected failure was not answered")
			}
			a := <-got
			if a.err != nil {
				t.Fatal(a.err)
			}
			rec, err := s.Get(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			if runs != 2 {
				t.Fatalf("the first operation ran %d times, want 2 (one rollback)", runs)
			}
			if rec.Owner != "w1" || rec.Status != store.StatusInProgress {
				t.Fatalf("record: %+v, want w1's claim", rec)
			}
			if !a.res.Acquired || a.res.Record.Owner != "w1" || a.res.Record.Fence != rec.Fence {
				t.Fatalf("claim answered %+v, but the record written is %+v", a.res, rec)
			}
		})
	}
}

// TestClaimBatchStart: ClaimBatch starts as Claim does and keeps the
// estimate it starts from up to date, also while it reads first: a flood
// of duplicate batches makes batches read first, and batches of new keys
// bring them back to inserting without a read.
func TestClaimBatchStart(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	batch := func(prefix string, n int) []store.ClaimResult {
		t.Helper()
		reqs := make([]store.ClaimRequest, n)
		for i := range reqs {
			reqs[i] = req(fmt.Sprint(prefix, i))
		}
		res, err := s.ClaimBatch(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	batch("dup", 10)
	for range 10 {
		for _, r := range batch("dup", 10) {
			if r.Acquired {
				t.Fatalf("duplicate acquired: %+v", r)
			}
		}
	}
	if !s.dupes.Often() {
		t.Fatal("a flood of duplicate batches did not make claims read first")
	}
	for i := range 10 {
		for _, r := range batch(fmt.Sprint("new", i, "-"), 10) {
			if !r.Acquired {
				t.Fatalf("new key not acquired: %+v", r)
			}
		}
	}
	if s.dupes.Often() {
		t.Fatal("claims still read first after 100 new keys in batches")
	}
}
