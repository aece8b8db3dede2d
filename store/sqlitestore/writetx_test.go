package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/store"
)

// unitTable makes the table the units of these tests write.
func unitTable(t *testing.T, s *Store) {
	t.Helper()
	if _, err := s.DB().Exec(`CREATE TABLE units (name TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
}

// unitRows returns the names in the units table.
func unitRows(t *testing.T, s *Store) map[string]bool {
	t.Helper()
	rows, err := s.DB().Query(`SELECT name FROM units`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		out[n] = true
	}
	return out
}

func insertUnit(name string) func(ctx context.Context, tx *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO units (name) VALUES (?)`, name)
		return err
	}
}

// batchResults runs the functions at once while the writer is held, so
// that they share one batch, and returns their errors by name.
func batchResults(t *testing.T, s *Store, fs map[string]func() error) map[string]error {
	t.Helper()
	release := holdWriter(t, s)
	var wg sync.WaitGroup
	var mu sync.Mutex
	results := map[string]error{}
	for name, f := range fs {
		wg.Go(func() {
			err := f()
			mu.Lock()
			results[name] = err
			mu.Unlock()
		})
	}
	waitQueued(t, s, len(fs))
	release()
	wg.Wait()
	return results
}

// TestWriteTxIsolation: units that fail in one batch (by returning an
// error, after a failed statement or a panic) roll back only their own
// writes; the batch's other units and operations commit, in one
// transaction, none of them run twice.
func TestWriteTxIsolation(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	unitTable(t, s)
	mustClaim(t, s, req("done"))
	errFn := errors.New("fn failed")
	var calls sync.Map
	count := func(name string) {
		n, _ := calls.LoadOrStore(name, new(int))
		*n.(*int)++
	}
	var panicked any
	before := s.Stats()
	results := batchResults(t, s, map[string]func() error{
		"a": func() error {
			return s.WriteTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				count("a")
				return insertUnit("a")(ctx, tx)
			})
		},
		"fails": func() error {
			return s.WriteTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				count("fails")
				if err := insertUnit("fails")(ctx, tx); err != nil {
					return err
				}
				return errFn
			})
		},
		"duplicate": func() error {
			return s.WriteTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				count("duplicate")
				if err := insertUnit("dup1")(ctx, tx); err != nil {
					return err
				}
				return insertUnit("dup1")(ctx, tx) // a statement error: UNIQUE
			})
		},
		"panics": func() (err error) {
			defer func() { panicked = recover() }()
			return s.WriteTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				count("panics")
				if err := insertUnit("panics")(ctx, tx); err != nil {
					return err
				}
				panic("unit panicked")
			})
		},
		"claim": func() error { _, err := s.Claim(ctx, req("k")); return err },
		"b": func() error {
			return s.WriteTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				count("b")
				return insertUnit("b")(ctx, tx)
			})
		},
	})
	st := s.Stats()
	for _, name := range []string{"a", "b", "claim"} {
		if results[name] != nil {
			t.Errorf("%s: %v", name, results[name])
		}
	}
	if results["fails"] != errFn {
		t.Errorf("failing unit: %v, want its error unchanged", results["fails"])
	}
	if err := results["duplicate"]; err == nil || !strings.Contains(err.Error(), "UNIQUE") {
		t.Errorf("unit with a failed statement: %v, want the statement's error", err)
	}
	if panicked != "unit panicked" {
		t.Errorf("the caller of the panicking unit recovered %v", panicked)
	}
	if got := unitRows(t, s); len(got) != 2 || !got["a"] || !got["b"] {
		t.Errorf("committed rows %v, want a and b", got)
	}
	calls.Range(func(k, v any) bool {
		if *v.(*int) != 1 {
			t.Errorf("unit %s ran %d times", k, *v.(*int))
		}
		return true
	})
	if rec, err := s.Get(ctx, "k"); err != nil || rec.Status != store.StatusInProgress {
		t.Errorf("claimed key: %+v %v", rec, err)
	}
	if st.Batches-before.Batches != 2 || st.Rollbacks != before.Rollbacks {
		t.Errorf("stats before %+v after %+v: want the held batch and one more, no rollback", before, st)
	}
	// The writer still works.
	if err := s.WriteTx(ctx, insertUnit("after")); err != nil || !unitRows(t, s)["after"] {
		t.Fatalf("a unit after the batch: %v", err)
	}
}

// TestWriteTxLostTransaction: a unit whose failure ended the whole
// transaction (as SQLite does on SQLITE_FULL, SQLITE_IOERR or an
// interrupted write; simulated by a ROLLBACK behind database/sql's back)
// gets its error, and the batch's other operations run again in a new
// transaction and commit.
func TestWriteTxLostTransaction(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	unitTable(t, s)
	errLost := errors.New("lost")
	var aCalls int
	before := s.Stats()
	results := batchResults(t, s, map[string]func() error{
		"a": func() error {
			return s.WriteTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				aCalls++
				return insertUnit("a")(ctx, tx)
			})
		},
		"claim": func() error { _, err := s.Claim(ctx, req("k")); return err },
		"lost": func() error {
			return s.WriteTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				if err := insertUnit("lost")(ctx, tx); err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, `ROLLBACK`); err != nil {
					return err
				}
				return errLost
			})
		},
	})
	st := s.Stats()
	if results["a"] != nil || results["claim"] != nil {
		t.Fatalf("results %v", results)
	}
	if results["lost"] != errLost {
		t.Fatalf("the unit that lost the transaction: %v", results["lost"])
	}
	if got := unitRows(t, s); len(got) != 1 || !got["a"] {
		t.Fatalf("committed rows %v, want a", got)
	}
	if rec, err := s.Get(ctx, "k"); err != nil || rec.Status != store.StatusInProgress {
		t.Fatalf("claimed key: %+v %v", rec, err)
	}
	// The batch order is the goroutines' arrival order, so the lost unit
	// may have run first: then nothing ran again.
	if st.Rollbacks-before.Rollbacks != 1 || aCalls < 1 || aCalls > 2 {
		t.Fatalf("rollbacks %d, a ran %d times", st.Rollbacks-before.Rollbacks, aCalls)
	}
}

// TestWriteTxEndedByUnit: a unit that commits the writer's transaction
// itself makes the outcome of what ran before it unknown: those calls get
// an error, never a success.
func TestWriteTxEndedByUnit(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	unitTable(t, s)
	release := holdWriter(t, s)
	errs := make(chan error, 2)
	go func() { errs <- s.WriteTx(ctx, insertUnit("a")) }()
	waitQueued(t, s, 1)
	go func() {
		errs <- s.WriteTx(ctx, func(ctx context.Context, tx *sql.Tx) error { return tx.Commit() })
	}()
	waitQueued(t, s, 2)
	release()
	for range 2 {
		if err := <-errs; !errors.Is(err, errTxEnded) {
			t.Fatalf("an operation of the ended transaction: %v, want errTxEnded", err)
		}
	}
	if err := s.WriteTx(ctx, insertUnit("b")); err != nil || !unitRows(t, s)["b"] {
		t.Fatalf("a unit after the ended transaction: %v", err)
	}
}

// TestWriteTxCanceled: a unit whose caller gave up while it was queued does
// not run; one that has begun is waited for and answered.
func TestWriteTxCanceled(t *testing.T) {
	s, _ := openTest(t)
	unitTable(t, s)
	release := holdWriter(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.WriteTx(ctx, insertUnit("queued")) }()
	waitQueued(t, s, 1)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled unit: %v", err)
	}
	release()

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	started := make(chan struct{})
	go func() {
		errc <- s.WriteTx(ctx, func(_ context.Context, tx *sql.Tx) error {
			close(started)
			time.Sleep(20 * time.Millisecond) // the caller gives up meanwhile
			return insertUnit("running")(context.Background(), tx)
		})
	}()
	<-started
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("a unit canceled while it ran: %v, want its outcome", err)
	}
	if got := unitRows(t, s); got["queued"] || !got["running"] {
		t.Fatalf("rows %v, want only running", got)
	}
}

// TestWriteTxClose: units queued when the store closes get ErrClosed; the
// one running is answered with its transaction's outcome.
func TestWriteTxClose(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	unitTable(t, s)
	started, proceed := make(chan struct{}), make(chan struct{})
	running := make(chan error, 1)
	go func() {
		running <- s.WriteTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			close(started)
			<-proceed
			return insertUnit("running")(ctx, tx)
		})
	}()
	<-started
	queued := make(chan error, 4)
	for i := range cap(queued) {
		go func() { queued <- s.WriteTx(ctx, insertUnit(fmt.Sprint("never", i))) }()
	}
	waitQueued(t, s, cap(queued))
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	<-s.w.closing
	close(proceed)
	if err := <-running; err != nil {
		t.Fatalf("the running unit: %v", err)
	}
	for range cap(queued) {
		if err := <-queued; !errors.Is(err, store.ErrClosed) {
			t.Fatalf("a queued unit: %v, want ErrClosed", err)
		}
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if err := s.WriteTx(ctx, insertUnit("late")); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("WriteTx after Close: %v", err)
	}
	// Nothing queued was written.
	r, err := Open(ctx, s.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got := unitRows(t, r); len(got) != 1 || !got["running"] {
		t.Fatalf("rows %v, want only running", got)
	}
}

// TestWriteTxStoreCalledFromInside: a store call made from inside a unit,
// with the unit's context, is refused with ErrOnWriter instead of waiting
// forever for the writer that runs the unit.
func TestWriteTxStoreCalledFromInside(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	unitTable(t, s)
	var inner error
	err := s.WriteTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, inner = s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "o", Lease: time.Minute, Retention: time.Hour})
		return insertUnit("a")(ctx, tx)
	})
	if err != nil || !errors.Is(inner, ErrOnWriter) {
		t.Fatalf("WriteTx = %v, inner Claim = %v; want nil and ErrOnWriter", err, inner)
	}
	var nested error
	_, _, err = s.InTx(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "outer", Owner: "o", Lease: time.Minute, Retention: time.Hour}, time.Hour,
		func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
			nested = s.WriteTx(ctx, insertUnit("b"))
			return nil, nil
		})
	if err != nil || !errors.Is(nested, ErrOnWriter) {
		t.Fatalf("InTx = %v, nested WriteTx = %v; want nil and ErrOnWriter", err, nested)
	}
	if rows := unitRows(t, s); !rows["a"] || rows["b"] {
		t.Fatalf("units written: %v, want only a", rows)
	}
}
