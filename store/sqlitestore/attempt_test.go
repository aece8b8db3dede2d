package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemkit/idem/store"
)

// floorOf reads the fence floor of s's file.
func floorOf(t *testing.T, s *Store) int64 {
	t.Helper()
	var f int64
	if err := s.DB().QueryRow(`SELECT floor FROM idem_fence_floor`).Scan(&f); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestFenceFloor: a key deleted (by the store, by another Store on the
// file, by a DELETE from outside) or swept and claimed again gets a fence
// above every fence it had, even when the clock has not moved since, or
// went back; through Claim, ClaimBatch and InTx alike.
func TestFenceFloor(t *testing.T) {
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
	if f := floorOf(t, a); f != 0 {
		t.Fatalf("floor of a new file: %d, want 0", f)
	}

	last := int64(0)
	claim := func(how string, s *Store) store.ClaimResult {
		t.Helper()
		var res store.ClaimResult
		switch how {
		case "claim":
			res = mustClaim(t, s, req("k"))
		case "batch":
			out, err := s.ClaimBatch(ctx, []store.ClaimRequest{req("k")})
			if err != nil {
				t.Fatal(err)
			}
			res = out[0]
		case "intx":
			res, _, err = s.InTx(ctx, req("k"), time.Hour, func(context.Context, *sql.Tx) ([]byte, error) { return nil, nil })
			if err != nil {
				t.Fatal(err)
			}
		}
		if !res.Acquired || res.Record.Fence <= last || res.Record.Journal[len(res.Record.Journal)-1].Fence != res.Record.Fence {
			t.Fatalf("%s after a delete: %+v, want acquired with a fence above %d", how, res, last)
		}
		if got, err := s.Get(ctx, "k"); err != nil || got.Fence != res.Record.Fence {
			t.Fatalf("%s: stored %+v %v, returned fence %d", how, got, err, res.Record.Fence)
		}
		last = res.Record.Fence
		return res
	}
	del := func(s *Store) {
		t.Helper()
		if err := s.Delete(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if f := floorOf(t, a); f != last {
			t.Fatalf("floor after deleting fence %d: %d", last, f)
		}
	}

	// The clock stands still: every new record's fence would be the same
	// microsecond but for the floor.
	first := claim("claim", a)
	if first.Record.Fence != clk.Now().UnixMicro() {
		t.Fatalf("first fence %d, want the clock's microseconds %d", first.Record.Fence, clk.Now().UnixMicro())
	}
	for _, how := range []string{"claim", "batch", "intx"} {
		del(a)
		claim(how, a) // a knows the floor it raised
		del(b)
		claim(how, a) // a learns b's floor in its own transaction
		del(a)
		claim(how, b)
	}

	// A DELETE from outside the store raises the floor too.
	if _, err := a.DB().Exec(`DELETE FROM idem_records WHERE key = 'k'`); err != nil {
		t.Fatal(err)
	}
	claim("claim", b)

	// The clock goes back an hour, after the record expired and was swept.
	r := req("k")
	r.Key = "swept"
	s1 := mustClaim(t, a, r)
	clk.Advance(2 * time.Hour)
	if n, err := a.Sweep(ctx, 10); err != nil || n != 2 {
		t.Fatalf("Sweep: %d %v, want 2", n, err)
	}
	if f := floorOf(t, a); f != max(s1.Record.Fence, last) {
		t.Fatalf("floor after the sweep: %d, want %d", f, max(s1.Record.Fence, last))
	}
	clk.Advance(-3 * time.Hour)
	s2 := mustClaim(t, b, r)
	if !s2.Acquired || s2.Record.Fence <= s1.Record.Fence || s2.Record.Fence <= last {
		t.Fatalf("claim after the sweep with the clock back: fence %d, want above %d and %d", s2.Record.Fence, s1.Record.Fence, last)
	}
}

// TestAttemptIDColumn: the attempt id is the row's own column (the
// implicit journal reads it back from there), the record this process
// holds is refused to another attempt id with the right fence, and an
// abandon clears the column while the journal keeps the id.
func TestAttemptIDColumn(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	r := req("k")
	c := mustClaim(t, s, r)
	column := func() (id, journal string) {
		t.Helper()
		if err := s.DB().QueryRow(`SELECT attempt_id, journal FROM idem_records WHERE key = 'k'`).Scan(&id, &journal); err != nil {
			t.Fatal(err)
		}
		return id, journal
	}
	if id, j := column(); id != r.AttemptID || j != "" || c.Record.AttemptID != r.AttemptID {
		t.Fatalf("after the claim: column %q, journal %q, record %q; want %q with an implicit journal", id, j, c.Record.AttemptID, r.AttemptID)
	}
	if got, err := s.Get(ctx, "k"); err != nil || got.Journal[0].AttemptID != r.AttemptID {
		t.Fatalf("Get: %+v %v", got, err)
	}

	// Another attempt id with the holder's fence, decided on the record
	// this process remembers (no read): refused, nothing written.
	before, _ := s.Get(ctx, "k")
	for _, o := range []store.Outcome{store.OutcomeCompleted, store.OutcomeAbandoned} {
		if err := s.Finish(ctx, store.FinishRequest{Key: "k", Fence: c.Record.Fence, AttemptID: "other", Outcome: o, Retention: time.Hour}); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("Finish(%s) by another attempt id: %v", o, err)
		}
	}
	if _, err := s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: c.Record.Fence, AttemptID: "other", Lease: time.Hour}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Extend by another attempt id: %v", err)
	}
	if after, _ := s.Get(ctx, "k"); !recordsEqual(after, before) {
		t.Fatalf("a refused attempt changed the record:\n%+v\n%+v", after, before)
	}

	abandon := store.FinishRequest{Key: "k", Fence: c.Record.Fence, AttemptID: r.AttemptID, Outcome: store.OutcomeAbandoned, Reason: "panic"}
	if err := s.Finish(ctx, abandon); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, abandon); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("a second abandon: %v, want ErrLeaseLost", err)
	}
	id, j := column()
	got, err := s.Get(ctx, "k")
	if err != nil || id != "" || got.AttemptID != "" || j == "" || got.Journal[0].AttemptID != r.AttemptID ||
		got.Journal[0].Outcome != store.OutcomeAbandoned {
		t.Fatalf("after the abandon: column %q, journal %q, record %+v %v; want no attempt id, the journal keeping it", id, j, got, err)
	}
}

// TestMigrationToAttemptIDs: rows written before migration 003 have no
// attempt id. They read back as they were; no attempt of this build can
// finish an in_progress one (it lapses and is taken over as usual); the
// fence floor starts at 0 and rises with the old rows' deletes.
func TestMigrationToAttemptIDs(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	path := filepath.Join(t.TempDir(), "idem.db")
	s, err := Open(ctx, path, WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	held := mustClaim(t, s, req("held"))
	done := mustClaim(t, s, req("done"))
	if err := s.Finish(ctx, store.FinishRequest{Key: "done", Fence: done.Record.Fence, AttemptID: done.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("ok"), Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	downgrade(t, s.DB(), 2)
	s.Close()

	s, err = Open(ctx, path, WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d, err := s.Get(ctx, "done")
	if err != nil || d.AttemptID != "" || len(d.Journal) != 1 || d.Journal[0].AttemptID != "" ||
		d.Journal[0].Outcome != store.OutcomeCompleted || string(d.Result) != "ok" {
		t.Fatalf("an old completed row: %+v %v", d, err)
	}
	h, err := s.Get(ctx, "held")
	if err != nil || h.AttemptID != "" || h.Status != store.StatusInProgress {
		t.Fatalf("an old in_progress row: %+v %v", h, err)
	}
	// Its attempt's id is gone with the old build: no finish names it.
	if err := s.Finish(ctx, store.FinishRequest{Key: "held", Fence: h.Fence, AttemptID: held.Record.AttemptID, Outcome: store.OutcomeCompleted, Retention: time.Hour}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("finishing an old row: %v, want ErrLeaseLost", err)
	}
	clk.Advance(time.Minute)
	to := mustClaim(t, s, req("held"))
	if !to.Takeover || to.Record.Fence != h.Fence+1 || to.Record.AttemptID == "" {
		t.Fatalf("takeover of the old row: %+v", to)
	}
	if f := floorOf(t, s); f != 0 {
		t.Fatalf("floor after the migration: %d, want 0", f)
	}
	if err := s.Delete(ctx, "done"); err != nil {
		t.Fatal(err)
	}
	if f := floorOf(t, s); f != d.Fence {
		t.Fatalf("floor after deleting an old row: %d, want its fence %d", f, d.Fence)
	}
}
