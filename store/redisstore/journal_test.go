package redisstore

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/idem/store"
	"github.com/redis/go-redis/v9"
)

// fmtScript formats ARGV[3:] (unix microseconds) with the scripts' fmt.
var fmtScript = redis.NewScript(header + helpers + `
local out = {}
for i = 3, #ARGV do out[#out + 1] = fmt(tonumber(ARGV[i])) end
return out
`)

// TestTimeFormat holds the scripts' time formatting to encoding/json's:
// the journal's times must read back as the same instants, and be written
// as Go writes them.
func TestTimeFormat(t *testing.T) {
	s := newTestStore(t, nil)
	ctx := context.Background()
	us := []int64{
		0, 1, 10, 100000, 999999, 1000000, 86399999999, 86400000000,
		time.Date(2000, 2, 29, 23, 59, 59, 999999000, time.UTC).UnixMicro(),
		time.Date(2000, 3, 1, 0, 0, 0, 0, time.UTC).UnixMicro(),
		time.Date(2100, 2, 28, 12, 0, 0, 500000000, time.UTC).UnixMicro(),
		time.Date(2100, 3, 1, 0, 0, 0, 120000, time.UTC).UnixMicro(),
		time.Date(2024, 12, 31, 23, 59, 59, 100000, time.UTC).UnixMicro(),
		time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro(),
		time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).UnixMicro(),
		time.Date(2255, 6, 5, 23, 47, 34, 740992000, time.UTC).UnixMicro(), // 2^53 µs
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		us = append(us, r.Int64N(1<<53))
	}
	for range 1000 { // near now, where records live
		us = append(us, time.Now().UnixMicro()+r.Int64N(400*24*3600*1e6)-200*24*3600*1e6)
	}
	for i := 0; i < len(us); i += 500 {
		batch := us[i:min(i+500, len(us))]
		args := []any{0, 0}
		for _, u := range batch {
			args = append(args, u)
		}
		got, err := fmtScript.Run(ctx, s.client, []string{s.rkey("fmt")}, args...).StringSlice()
		if err != nil {
			t.Fatal(err)
		}
		for j, u := range batch {
			tm := time.UnixMicro(u).UTC()
			want, _ := json.Marshal(tm)
			if strconv.Quote(got[j]) != string(want) {
				t.Fatalf("fmt(%d) = %q, want %s", u, got[j], want)
			}
			var back time.Time
			if err := json.Unmarshal([]byte(strconv.Quote(got[j])), &back); err != nil || !back.Equal(tm) {
				t.Fatalf("fmt(%d) = %q reads back as %v (%v), want %v", u, got[j], back, err, tm)
			}
		}
	}
}

// luaJournal returns the journal the scripts see in key's record (the
// explicit one, or the implicit one they build), as JSON.
var luaJournal = redis.NewScript(header + helpers + `
local h = load()
return encode(journalOf(h))
`)

// checkJournal checks that key's journal reads the same through the store
// (Go builds an implicit journal) and through the scripts, and that an
// explicit journal's JSON is what encoding/json writes for it.
func checkJournal(t *testing.T, s *Store, key string) store.Record {
	t.Helper()
	ctx := context.Background()
	rec, err := s.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	raw, err := luaJournal.Run(ctx, s.client, []string{s.rkey(key)}, s.readArgs()...).Text()
	if err != nil {
		t.Fatalf("journal of %q: %v", key, err)
	}
	var lua []store.JournalEntry
	if err := json.Unmarshal([]byte(raw), &lua); err != nil {
		t.Fatalf("the scripts' journal of %q does not decode: %v\n%s", key, err, raw)
	}
	if !reflect.DeepEqual(lua, rec.Journal) {
		t.Fatalf("journal of %q:\n scripts %+v\n store   %+v", key, lua, rec.Journal)
	}
	// The JSON the scripts write is the JSON Go writes: same names, same
	// time strings, same omitted fields.
	again, _ := json.Marshal(rec.Journal)
	var a, b any
	_ = json.Unmarshal([]byte(raw), &a)
	_ = json.Unmarshal(again, &b)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("journal of %q as the scripts write it:\n %s\nas encoding/json writes it:\n %s", key, raw, again)
	}
	return rec
}

// TestJournalForms walks records through the states whose journal is
// implicit (no j field) and those that make it explicit, and checks both
// forms read the same everywhere.
func TestJournalForms(t *testing.T) {
	clocks := new(testClocks)
	s := newTestStore(t, clocks)
	ctx := context.Background()
	req := func(key string) store.ClaimRequest {
		return store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: key, Owner: "w/1 \"q\" é", Correlation: "msg-1 </>&", Policy: store.AtMostOnce,
			Lease: time.Minute + 123456*time.Microsecond, Retention: time.Hour, Fingerprint: "fp"}
	}
	hasJ := func(key string) bool {
		n, err := s.client.HExists(ctx, s.rkey(key), "j").Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	claim := func(key string) store.ClaimResult {
		cr, err := s.Claim(ctx, req(key))
		if err != nil || !cr.Acquired {
			t.Fatalf("Claim(%q): %v, acquired %v", key, err, cr.Acquired)
		}
		rec := checkJournal(t, s, key)
		if !reflect.DeepEqual(rec.Journal, cr.Record.Journal) {
			t.Fatalf("Claim(%q) returned journal %+v, the store has %+v", key, cr.Record.Journal, rec.Journal)
		}
		return cr
	}
	want := func(key string, explicit bool) {
		t.Helper()
		checkJournal(t, s, key)
		if hasJ(key) != explicit {
			t.Fatalf("%q: journal field present %v, want %v", key, hasJ(key), explicit)
		}
	}

	firsts := map[string]store.Record{} // the first claims' records
	claimFirst := func(key string) store.ClaimResult {
		cr := claim(key)
		firsts[key] = cr.Record
		return cr
	}

	cr := claimFirst("fresh")
	want("fresh", false)
	if _, err := s.Extend(ctx, store.ExtendRequest{Key: "fresh", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Lease: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	want("fresh", false)

	for _, end := range []string{"complete", "fail", "release", "abandon"} {
		key := "end-" + end
		cr := claimFirst(key)
		var err error
		switch end {
		case "complete":
			err = s.Finish(ctx, store.FinishRequest{Key: key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("res"), Retention: time.Hour})
		case "fail":
			err = s.Finish(ctx, store.FinishRequest{Key: key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeFailed, Reason: "card declined", Retention: time.Hour})
		case "release":
			err = s.Finish(ctx, store.FinishRequest{Key: key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: "smtp refused"})
		case "abandon":
			err = s.Finish(ctx, store.FinishRequest{Key: key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeAbandoned, Reason: "reset after send"})
		}
		if err != nil {
			t.Fatalf("%s: %v", end, err)
		}
		want(key, false)
		// A stale write (the same attempt again, another fence or another
		// attempt id) is refused without a trace to leave.
		for _, stale := range []store.FinishRequest{
			{Key: key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID},
			{Key: key, Fence: cr.Record.Fence + 1, AttemptID: cr.Record.AttemptID},
			{Key: key, Fence: cr.Record.Fence, AttemptID: "other"},
		} {
			stale.Outcome, stale.Retention = store.OutcomeCompleted, time.Hour
			if err := s.Finish(ctx, stale); err != store.ErrLeaseLost {
				t.Fatalf("stale Complete %+v: %v", stale, err)
			}
			want(key, false)
		}
		if end == "abandon" {
			// The record gave up the attempt id; its entry keeps it.
			rec := checkJournal(t, s, key)
			if rec.AttemptID != "" || rec.Journal[0].AttemptID != cr.Record.AttemptID || rec.Journal[0].Outcome != store.OutcomeAbandoned {
				t.Fatalf("abandoned: attempt id %q, entry %+v; want none, the entry the attempt's (%q), abandoned", rec.AttemptID, rec.Journal[0], cr.Record.AttemptID)
			}
		}
	}

	// A completion with a reason keeps it in its entry (not in the record):
	// the journal is written.
	cr = claim("complete-reason")
	if err := s.Finish(ctx, store.FinishRequest{Key: "complete-reason", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID,
		Outcome: store.OutcomeCompleted, Result: []byte("r"), Reason: "done, with a note", Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	want("complete-reason", true)
	if rec := checkJournal(t, s, "complete-reason"); rec.Reason != "" || rec.Journal[0].Reason != "done, with a note" || rec.Journal[0].Outcome != store.OutcomeCompleted {
		t.Fatalf("completed with a reason: record reason %q, entry %+v", rec.Reason, rec.Journal[0])
	}

	// Abandoned, then extended by the same attempt: refused (it has
	// ended), nothing written.
	cr = claim("abandon-extend")
	noErr(t, s.Finish(ctx, store.FinishRequest{Key: "abandon-extend", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeAbandoned, Reason: "x"}))
	if _, err := s.Extend(ctx, store.ExtendRequest{Key: "abandon-extend", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Lease: time.Minute}); err != store.ErrLeaseLost {
		t.Fatalf("Extend after Abandon: %v, want ErrLeaseLost", err)
	}
	want("abandon-extend", false)

	// Abandoned, then taken over: the journal is written, the abandoned
	// entry with its attempt id.
	cr = claim("abandon-take")
	noErr(t, s.Finish(ctx, store.FinishRequest{Key: "abandon-take", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeAbandoned, Reason: "x"}))
	take := req("abandon-take")
	take.TakeLapsed = true
	cr2, err := s.Claim(ctx, take)
	if err != nil || !cr2.Takeover || cr2.Record.Fence != cr.Record.Fence+1 || cr2.Record.AttemptID != take.AttemptID {
		t.Fatalf("takeover of an abandoned attempt: %v %+v", err, brief(cr2.Record))
	}
	want("abandon-take", true)
	if rec := checkJournal(t, s, "abandon-take"); len(rec.Journal) != 2 || rec.Journal[0].AttemptID != cr.Record.AttemptID ||
		rec.Journal[0].Outcome != store.OutcomeAbandoned || rec.Journal[1].AttemptID != take.AttemptID {
		t.Fatalf("journal after the takeover of an abandoned attempt: %+v", rec.Journal)
	}

	// Released, claimed again: two entries.
	if _, err := s.Claim(ctx, req("end-release")); err != nil {
		t.Fatal(err)
	}
	want("end-release", true)

	// Lapsed and taken over, with a stale holder marked late.
	cr = claim("takeover")
	clocks.advance(t, 2*time.Minute)
	r := req("takeover")
	r.TakeLapsed = true
	if cr2, err := s.Claim(ctx, r); err != nil || !cr2.Takeover {
		t.Fatalf("takeover: %v %+v", err, cr2)
	}
	want("takeover", true)
	// Not marked late: a stale release of a claim that never ran, and
	// writes that name the stale fence with another attempt id.
	stale := store.FinishRequest{Key: "takeover", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: store.NotRunReason("undone")}
	if err := s.Finish(ctx, stale); err != store.ErrLeaseLost {
		t.Fatalf("stale not-run Release: %v", err)
	}
	other := store.ExtendRequest{Key: "takeover", Fence: cr.Record.Fence, AttemptID: "other", Lease: time.Minute}
	if _, err := s.Extend(ctx, other); err != store.ErrLeaseLost {
		t.Fatalf("Extend of another attempt: %v", err)
	}
	stale.AttemptID, stale.Reason = "other", "late"
	if err := s.Finish(ctx, stale); err != store.ErrLeaseLost {
		t.Fatalf("Release of another attempt: %v", err)
	}
	if rec := checkJournal(t, s, "takeover"); !rec.Journal[0].LateFinish.IsZero() {
		t.Fatalf("stale attempt's entry %+v marked late by writes that were not its own, or never ran", rec.Journal[0])
	}
	if _, err := s.Extend(ctx, store.ExtendRequest{Key: "takeover", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Lease: time.Minute}); err != store.ErrLeaseLost {
		t.Fatalf("stale Extend: %v", err)
	}
	if rec := checkJournal(t, s, "takeover"); rec.Journal[0].LateFinish.IsZero() || rec.Journal[0].Outcome != store.OutcomeLapsed {
		t.Fatalf("stale attempt's entry %+v, want lapsed and late", rec.Journal[0])
	}

	// Resolved from the implicit form.
	cr = claim("resolve")
	if _, err := s.Resolve(ctx, store.ResolveRequest{Key: "resolve", Fence: cr.Record.Fence, Done: true, Result: []byte("r"), Reason: "found", By: "op"}); err != nil {
		t.Fatal(err)
	}
	want("resolve", true)

	// Expired, claimed again.
	clocks.advance(t, 2*time.Hour)
	cr, err = s.Claim(ctx, req("end-complete"))
	if f := firsts["end-complete"].Fence; err != nil || !cr.Acquired || cr.Record.Fence != f+1 {
		t.Fatalf("claim after expiry: %v %+v; want fence %d", err, cr, f+1)
	}
	rec := checkJournal(t, s, "end-complete")
	if len(rec.Journal) != 2 || !rec.Journal[1].AfterExpiry {
		t.Fatalf("journal after expiry %+v", rec.Journal)
	}
}

// TestJournalTrim holds the journal to store.MaxJournal entries.
func TestJournalTrim(t *testing.T) {
	s := newTestStore(t, nil)
	ctx := context.Background()
	r := store.ClaimRequest{Key: "k", Owner: "o", Lease: time.Minute, Retention: time.Hour}
	for i := range store.MaxJournal + 5 {
		r.AttemptID = store.NewAttemptID()
		cr, err := s.Claim(ctx, r)
		if err != nil || !cr.Acquired {
			t.Fatalf("claim %d: %v %v", i, err, cr.Acquired)
		}
		if err := s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: "again " + strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}
	rec := checkJournal(t, s, "k")
	if len(rec.Journal) != store.MaxJournal || rec.Journal[0].Attempt != 6 || rec.Journal[store.MaxJournal-1].Attempt != store.MaxJournal+5 {
		t.Fatalf("journal of %d entries from attempt %d to %d, want %d from 6 to %d",
			len(rec.Journal), rec.Journal[0].Attempt, rec.Journal[len(rec.Journal)-1].Attempt, store.MaxJournal, store.MaxJournal+5)
	}
}
