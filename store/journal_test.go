package store

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// TestMarshalJournalMatchesEncodingJSON holds MarshalJournal to
// json.Marshal on random journals. The fields are filled by reflection, by
// type, so a field added to JournalEntry is covered too.
func TestMarshalJournalMatchesEncodingJSON(t *testing.T) {
	if !fastJournal {
		t.Fatal("JournalEntry changed: update journalFields and appendEntry (meanwhile encoding/json encodes journals)")
	}
	strs := []string{"", "w1", "owner-7", `quo"te`, `back\slash`, "<html>&", "tab\there", "ünïcode", "\u2028", "bad\xffutf8", "nul\x00"}
	times := []time.Time{
		{},
		time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC),
		time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.UTC),
		time.Date(2030, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600)),
		time.UnixMicro(1).UTC(),
	}
	rng := rand.New(rand.NewPCG(1, 2))
	fill := func(e *JournalEntry) {
		v := reflect.ValueOf(e).Elem()
		for i := range v.NumField() {
			f := v.Field(i)
			switch f.Kind() {
			case reflect.String:
				f.SetString(strs[rng.IntN(len(strs))])
			case reflect.Int, reflect.Int64:
				f.SetInt(rng.Int64N(2000) - 1000)
			case reflect.Bool:
				f.SetBool(rng.IntN(2) == 0)
			case reflect.Struct:
				f.Set(reflect.ValueOf(times[rng.IntN(len(times))]))
			default:
				t.Fatalf("JournalEntry.%s has a type the test does not fill", v.Type().Field(i).Name)
			}
		}
	}
	for range 3000 {
		n := rng.IntN(4)
		j := make([]JournalEntry, n)
		for i := range j {
			fill(&j[i])
		}
		if n == 0 && rng.IntN(2) == 0 {
			j = nil
		}
		want, err := json.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		got, err := MarshalJournal(j)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("MarshalJournal(%+v)\n got %s %v\nwant %s", j, got, err, want)
		}
	}
	// A year encoding/json refuses is refused too.
	if _, err := MarshalJournal([]JournalEntry{{Started: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}}); err == nil {
		t.Fatal("MarshalJournal accepted the year 10000")
	}
}

func BenchmarkMarshalJournal(b *testing.B) {
	now := time.Now().UTC()
	j := []JournalEntry{{Attempt: 1, Fence: 1, Owner: "bench", Correlation: "corr-123", Started: now, LeaseUntil: now, Ended: now, Outcome: "completed", Policy: "at_least_once"}}
	b.Run("append", func(b *testing.B) {
		for b.Loop() {
			MarshalJournal(j)
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		for b.Loop() {
			json.Marshal(j)
		}
	})
}

// TestUnmarshalJournal: what MarshalJournal writes reads back equal (times
// in UTC), and a stored journal that is not an array of entries is an
// error, never an empty journal.
func TestUnmarshalJournal(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 6000, time.FixedZone("x", 3600))
	j := []JournalEntry{{Attempt: 1, Fence: 1764567890123456, AttemptID: "a1", Owner: "w", Started: at, LeaseUntil: at,
		Ended: at, Outcome: OutcomeAbandoned, Reason: NotRunReason("x"), Takeover: true, LateFinish: at}}
	b, err := MarshalJournal(j)
	if err != nil {
		t.Fatal(err)
	}
	got, err := UnmarshalJournal(b)
	if err != nil || len(got) != 1 {
		t.Fatalf("UnmarshalJournal(%s) = %+v, %v", b, got, err)
	}
	want := j[0]
	want.Started, want.LeaseUntil, want.Ended, want.LateFinish = at.UTC(), at.UTC(), at.UTC(), at.UTC()
	if got[0] != want || got[0].Started.Location() != time.UTC {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got[0], want)
	}
	for _, bad := range []string{"", "null", "{}", `[1]`, `["x"]`, `[{"a":"one"}]`, "[{"} {
		if j, err := UnmarshalJournal([]byte(bad)); err == nil {
			t.Errorf("UnmarshalJournal(%q) = %+v, nil; want an error", bad, j)
		}
	}
}

// TestFirstFence: a new record's first fence is the clock in microseconds,
// or above the floor when that is higher.
func TestFirstFence(t *testing.T) {
	now := time.UnixMicro(1764567890123456)
	if f := FirstFence(now, 0); f != 1764567890123456 {
		t.Fatalf("FirstFence(now, 0) = %d", f)
	}
	if f := FirstFence(now, 1764567890123456); f != 1764567890123457 {
		t.Fatalf("FirstFence at the floor = %d, want the floor + 1", f)
	}
	if f := FirstFence(time.Time{}, 0); f != 1 {
		t.Fatalf("FirstFence of the zero time = %d, want 1", f)
	}
}
