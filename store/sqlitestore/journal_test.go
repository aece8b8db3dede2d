package sqlitestore

import (
	"context"
	"database/sql/driver"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// TestImplicitJournal runs random histories of a key through the state
// machine and writes each record it reaches into a real table and reads it
// back: what comes back equals what was written, whether the journal was
// stored implicitly (an empty column) or in full. A record one journal
// field away from its implicit entry is written in full. The common
// history, a first claim and its outcome, must stay implicit: that is the
// row the hot path writes.
func TestImplicitJournal(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	rng := rand.New(rand.NewPCG(3, 4))
	// Times at the store's precision, as its clock gives them (Store.now).
	base := time.Date(2026, 11, 30, 12, 0, 0, 123456000, time.UTC)
	owners := []string{"", "w1", "host:42"}
	corrs := []string{"", "msg-1", "corr-" + strings.Repeat("x", 40)}
	reasons := []string{"", "boom", "card declined"}

	// roundTrip writes r as WithImplicitJournal(on) would and reads it
	// back; it reports whether the journal was stored implicitly.
	roundTrip := func(name string, r *store.Record, on bool) (implicit bool) {
		t.Helper()
		args, err := encodeRecord(r, on)
		if err != nil {
			t.Fatal(err)
		}
		err = s.w.do(ctx, false, func(w rw, _ time.Time) error {
			if _, err := w.remove(r.Key, 0); err != nil {
				return err
			}
			// The remove raised the fence floor to the row's fence, and
			// r may have that fence or a lower one (histories start at
			// random times): lower the floor again, so the insert is
			// not refused.
			if _, err := w.(*driverRW).conn.(driver.ExecerContext).ExecContext(ctx, `UPDATE idem_fence_floor SET floor = 0`, nil); err != nil {
				return err
			}
			ok, err := w.insert(args, 1)
			if err == nil && !ok {
				err = fmt.Errorf("%s: the insert wrote nothing", name)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		var journal string
		if err := s.DB().QueryRow(`SELECT journal FROM idem_records WHERE key = ?`, r.Key).Scan(&journal); err != nil {
			t.Fatal(err)
		}
		got, _, err := s.read(ctx, r.Key)
		if err != nil {
			t.Fatalf("%s: read: %v", name, err)
		}
		want := *r
		want.Journal = slices.Clone(r.Journal)
		normalize(&want)
		if !reflect.DeepEqual(*got, want) {
			t.Fatalf("%s: journal column %q\nwrote %+v\n read %+v", name, journal, want, *got)
		}
		if journal == "" && !on {
			t.Fatalf("%s: stored implicitly WithImplicitJournal(false)", name)
		}
		return journal == ""
	}

	// Each history is a synced write or more: 2000 take about 20 s on a
	// loaded machine; -short checks 400.
	histories := 2000
	if testing.Short() {
		histories = 400
	}
	var implicit, explicit, nearMisses int
	for i := range histories {
		var rec *store.Record
		now := base.Add(time.Duration(rng.Int64N(int64(time.Hour))).Truncate(time.Microsecond))
		var fence int64
		var attempt string
		for step := range 1 + rng.IntN(5) {
			now = now.Add(time.Duration(rng.Int64N(int64(2 * time.Minute))).Truncate(time.Microsecond))
			var next *store.Record
			switch op := rng.IntN(6); {
			case op <= 1 || rec == nil:
				policy := store.AtLeastOnce
				if rng.IntN(3) == 0 {
					policy = store.AtMostOnce
				}
				var res store.ClaimResult
				next, res = store.ApplyClaim(rec, store.ClaimRequest{AttemptID: store.NewAttemptID(),
					Key: "k" + strconv.Itoa(i), Owner: owners[rng.IntN(len(owners))],
					Correlation: corrs[rng.IntN(len(corrs))], Policy: policy, TakeLapsed: rng.IntN(2) == 0,
					Lease: time.Duration(1+rng.IntN(90)) * time.Second, Retention: time.Duration(1+rng.IntN(10)) * time.Minute,
				}, now, 0)
				if res.Acquired {
					fence, attempt = res.Record.Fence, res.Record.AttemptID
				}
			case op == 2:
				next, _ = store.ApplyExtend(rec, store.ExtendRequest{Key: rec.Key, Fence: fence, AttemptID: attempt, Lease: 30 * time.Second}, now)
			case op == 3 || op == 4:
				outcome := []store.Outcome{store.OutcomeCompleted, store.OutcomeFailed, store.OutcomeReleased, store.OutcomeAbandoned}[rng.IntN(4)]
				next, _ = store.ApplyFinish(rec, store.FinishRequest{
					Key: rec.Key, Fence: fence - int64(rng.IntN(2)), AttemptID: attempt,
					Outcome: outcome, Result: []byte(`{"id":"` + strconv.Itoa(step) + `"}`),
					Reason: reasons[rng.IntN(len(reasons))], Retention: time.Hour,
				}, now)
			default:
				next, _ = store.ApplyResolve(rec, store.ResolveRequest{Key: rec.Key, Done: rng.IntN(2) == 0, Result: []byte("r"), Reason: "operator", By: "ops", Retention: time.Hour}, now)
			}
			if next != nil {
				rec = next
			}
		}
		name := fmt.Sprintf("history %d", i)
		roundTrip(name+", implicit journals off", rec, false)
		if roundTrip(name, rec, true) {
			implicit++
			// One field of the entry changed: no longer what the row says
			// (the correlation id has a column of its own).
			r := *rec
			r.Journal = slices.Clone(rec.Journal)
			e := reflect.ValueOf(&r.Journal[0]).Elem()
			field := e.Type().Field(rng.IntN(e.NumField())).Name
			if field == "Correlation" {
				field = "Owner"
			}
			f := e.FieldByName(field)
			switch v := f.Interface().(type) {
			case time.Time:
				f.Set(reflect.ValueOf(v.Add(time.Microsecond)))
			default:
				switch f.Kind() { // Outcome is a string type
				case reflect.String:
					f.SetString(f.String() + "x")
				case reflect.Int, reflect.Int64:
					f.SetInt(f.Int() + 1)
				case reflect.Bool:
					f.SetBool(!f.Bool())
				default:
					t.Fatalf("field %s of kind %s: the test does not change it", field, f.Kind())
				}
			}
			if roundTrip(name+", one field changed", &r, true) {
				t.Fatalf("%s: entry %+v changed in %s was still written implicitly", name, r.Journal[0], field)
			}
			nearMisses++
		} else {
			explicit++
		}
	}
	t.Logf("%d implicit (%d near misses), %d explicit", implicit, nearMisses, explicit)
	if implicit < histories/20 || explicit < histories/20 {
		t.Fatalf("histories: %d implicit, %d explicit: the test no longer covers both", implicit, explicit)
	}

	// The hot path: a first claim and its completion, through a Ledger with
	// a correlation id, leave the journal implicit.
	l := idem.New(s)
	if _, err := l.Do(ctx, idem.Key("booking", "b-1"), func(context.Context) ([]byte, error) { return []byte("ok"), nil }, idem.WithCorrelationID("msg-77")); err != nil {
		t.Fatal(err)
	}
	var journal, corr string
	if err := s.DB().QueryRow(`SELECT journal, correlation FROM idem_records WHERE key = ?`, idem.Key("booking", "b-1").String()).Scan(&journal, &corr); err != nil {
		t.Fatal(err)
	}
	if journal != "" || corr != "msg-77" {
		t.Fatalf("a first attempt's row has journal %q, correlation %q; want the implicit journal and msg-77", journal, corr)
	}
}

// TestMigrationToImplicitJournal opens a file written before migration 002
// (journals in full, no correlation column): its records read back as
// they were, and new first attempts are stored implicitly.
func TestMigrationToImplicitJournal(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	l := idem.New(s)
	key := idem.Key("booking", "old")
	if _, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { return []byte("ok"), nil }, idem.WithCorrelationID("msg-1")); err != nil {
		t.Fatal(err)
	}
	before, err := s.Get(ctx, key.String())
	if err != nil {
		t.Fatal(err)
	}
	// A build from before migration 003 kept no attempt ids.
	before.AttemptID = ""
	for i := range before.Journal {
		before.Journal[i].AttemptID = ""
	}
	j, err := store.MarshalJournal(before.Journal)
	if err != nil {
		t.Fatal(err)
	}
	// Back to the schema of migration 001, as the previous build wrote
	// it: no attempt ids either.
	if _, err := s.DB().Exec(`UPDATE idem_records SET journal = ?`, string(j)); err != nil {
		t.Fatal(err)
	}
	downgrade(t, s.DB(), 1)
	s.Close()

	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	after, err := s.Get(ctx, key.String())
	if err != nil || !reflect.DeepEqual(after, before) {
		t.Fatalf("after migration 002:\n got %+v %v\nwant %+v", after, err, before)
	}
	var journal string
	if err := s.DB().QueryRow(`SELECT journal FROM idem_records WHERE key = ?`, key.String()).Scan(&journal); err != nil || journal != string(j) {
		t.Fatalf("the old row's journal is %q %v; want it as it was", journal, err)
	}
	l = idem.New(s)
	if _, err := l.Do(ctx, idem.Key("booking", "new"), func(context.Context) ([]byte, error) { return []byte("ok"), nil }, idem.WithCorrelationID("msg-2")); err != nil {
		t.Fatal(err)
	}
	if err := s.DB().QueryRow(`SELECT journal FROM idem_records WHERE key = ?`, idem.Key("booking", "new").String()).Scan(&journal); err != nil || journal != "" {
		t.Fatalf("a new first attempt's journal is %q %v; want it implicit", journal, err)
	}
}

// TestImplicitJournalOff: a store WithImplicitJournal(false) on the same
// file as one with implicit journals writes every journal it stores out in
// full, and both read the same records.
func TestImplicitJournalOff(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	on, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer on.Close()
	off, err := Open(ctx, path, WithImplicitJournal(false))
	if err != nil {
		t.Fatal(err)
	}
	defer off.Close()
	ok := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
	for _, k := range []string{"a", "b"} {
		if _, err := idem.New(off).Do(ctx, idem.Key(k), ok, idem.WithCorrelationID("msg-"+k)); err != nil {
			t.Fatal(err)
		}
	}
	// A claim by the implicit store, completed by the other.
	cr, err := on.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "c", Owner: "w", Correlation: "msg-c", Policy: store.AtLeastOnce, Lease: time.Minute, Retention: time.Hour})
	if err != nil || !cr.Acquired {
		t.Fatalf("claim: %+v %v", cr, err)
	}
	if err := off.Finish(ctx, store.FinishRequest{Key: "c", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("ok"), Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b", "c"} {
		var journal string
		if err := on.DB().QueryRow(`SELECT journal FROM idem_records WHERE key = ?`, idem.Key(k).String()).Scan(&journal); err != nil {
			t.Fatal(err)
		}
		if journal == "" {
			t.Fatalf("%s: WithImplicitJournal(false) left the journal implicit", k)
		}
		a, errA := on.Get(ctx, idem.Key(k).String())
		b, errB := off.Get(ctx, idem.Key(k).String())
		if errA != nil || errB != nil || !reflect.DeepEqual(a, b) || len(a.Journal) != 1 || a.Journal[0].Correlation != "msg-"+k {
			t.Fatalf("%s reads differently or wrong:\n%+v %v\n%+v %v", k, a, errA, b, errB)
		}
	}
}
