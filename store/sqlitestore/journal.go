package sqlitestore

import (
	"encoding/json"
	"reflect"
	"strconv"
	"time"

	"github.com/idemkit/idem"
)

// journalFields are the fields of idem.JournalEntry that appendEntry
// writes, with their JSON tags, in order. If the type has changed (a field
// added, renamed or retagged), fastJournal is false and marshalJournal
// uses encoding/json, so the change costs speed, never data.
var journalFields = []struct{ name, tag string }{
	{"Attempt", "a"}, {"Fence", "f"}, {"Owner", "o,omitempty"}, {"Correlation", "c,omitempty"},
	{"Started", "s"}, {"LeaseUntil", "l"}, {"Ended", "e,omitzero"}, {"Outcome", "x,omitempty"},
	{"Reason", "r,omitempty"}, {"Takeover", "t,omitempty"}, {"AfterExpiry", "ae,omitempty"},
	{"Policy", "p,omitempty"}, {"LateFinish", "lf,omitzero"}, {"ResolvedBy", "rb,omitempty"},
	{"Decision", "d,omitempty"},
}

var fastJournal = func() bool {
	t := reflect.TypeFor[idem.JournalEntry]()
	if t.NumField() != len(journalFields) {
		return false
	}
	for i, f := range journalFields {
		sf := t.Field(i)
		if sf.Name != f.name || sf.Tag.Get("json") != f.tag {
			return false
		}
	}
	return true
}()

// marshalJournal returns the JSON of j: the bytes json.Marshal makes of it
// (the tests hold the two equal), made without reflection, because a
// record's journal is encoded on every write.
func marshalJournal(j []idem.JournalEntry) ([]byte, error) {
	if !fastJournal {
		return json.Marshal(j)
	}
	for i := range j {
		e := &j[i]
		if !timeOK(e.Started) || !timeOK(e.LeaseUntil) || !timeOK(e.Ended) || !timeOK(e.LateFinish) {
			return json.Marshal(j) // its error: a year MarshalJSON refuses
		}
	}
	return appendJournal(make([]byte, 0, 256*len(j)+2), j), nil
}

// timeOK reports whether time.Time's MarshalJSON accepts t.
func timeOK(t time.Time) bool {
	y := t.Year()
	return y >= 0 && y <= 9999
}

func appendJournal(dst []byte, j []idem.JournalEntry) []byte {
	if j == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '[')
	for i := range j {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendEntry(dst, &j[i])
	}
	return append(dst, ']')
}

func appendEntry(dst []byte, e *idem.JournalEntry) []byte {
	dst = append(dst, `{"a":`...)
	dst = strconv.AppendInt(dst, int64(e.Attempt), 10)
	dst = append(dst, `,"f":`...)
	dst = strconv.AppendInt(dst, e.Fence, 10)
	if e.Owner != "" {
		dst = append(dst, `,"o":`...)
		dst = appendString(dst, e.Owner)
	}
	if e.Correlation != "" {
		dst = append(dst, `,"c":`...)
		dst = appendString(dst, e.Correlation)
	}
	dst = append(dst, `,"s":`...)
	dst = appendTime(dst, e.Started)
	dst = append(dst, `,"l":`...)
	dst = appendTime(dst, e.LeaseUntil)
	if !e.Ended.IsZero() {
		dst = append(dst, `,"e":`...)
		dst = appendTime(dst, e.Ended)
	}
	if e.Outcome != "" {
		dst = append(dst, `,"x":`...)
		dst = appendString(dst, e.Outcome)
	}
	if e.Reason != "" {
		dst = append(dst, `,"r":`...)
		dst = appendString(dst, e.Reason)
	}
	if e.Takeover {
		dst = append(dst, `,"t":true`...)
	}
	if e.AfterExpiry {
		dst = append(dst, `,"ae":true`...)
	}
	if e.Policy != "" {
		dst = append(dst, `,"p":`...)
		dst = appendString(dst, e.Policy)
	}
	if !e.LateFinish.IsZero() {
		dst = append(dst, `,"lf":`...)
		dst = appendTime(dst, e.LateFinish)
	}
	if e.ResolvedBy != "" {
		dst = append(dst, `,"rb":`...)
		dst = appendString(dst, e.ResolvedBy)
	}
	if e.Decision {
		dst = append(dst, `,"d":true`...)
	}
	return append(dst, '}')
}

// appendString appends s as a JSON string. Strings that need escaping (by
// encoding/json's rules, HTML characters included) go through
// encoding/json.
func appendString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, err := json.Marshal(s)
			if err != nil { // not possible for a string
				return append(dst, `""`...)
			}
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

// appendTime appends t as time.Time's MarshalJSON does (RFC 3339 with
// nanoseconds); marshalJournal has checked the year.
func appendTime(dst []byte, t time.Time) []byte {
	dst = append(dst, '"')
	dst = t.AppendFormat(dst, time.RFC3339Nano)
	return append(dst, '"')
}

// A record's journal is implicit (its column is empty) when it is the one
// entry that the record's own columns say: the first claim of a key and
// that attempt's outcome, which is what nearly every key ever has. The
// store then writes and reads no JSON for it, and the row takes less than
// half the room (129 bytes against 304 for a Ledger.Do's completed key),
// so a commit writes fewer pages to the log. Any other journal (a
// takeover, a second attempt, a late finish, a resolution) is written out
// in full.

// implicitEntry is the journal entry that r's columns say, with the
// correlation id of the row's correlation column: attempt, fence and owner
// are the record's, it started when the record was created with r's
// policy, its lease is r's, and once r is no longer in progress its
// outcome is r's status, ended at r's last update, with r's reason unless
// it completed.
func implicitEntry(r *idem.Record, correlation string) idem.JournalEntry {
	e := idem.JournalEntry{
		Attempt: r.Attempt, Fence: r.Fence, Owner: r.Owner, Correlation: correlation,
		Started: r.CreatedAt, LeaseUntil: r.LeaseUntil, Policy: r.Policy.String(),
	}
	if r.Status != idem.StatusInProgress {
		e.Outcome, e.Ended = string(r.Status), r.UpdatedAt
		if r.Status != idem.StatusCompleted {
			e.Reason = r.Reason
		}
	}
	return e
}

// implicitJournal reports whether r's journal is exactly implicitEntry's
// (its correlation id aside, which has a column), at the precision the
// store keeps, so that the row can store it as an empty column and read it
// back unchanged. It compares field by field, without building the entry:
// it runs on every write.
func implicitJournal(r *idem.Record) bool {
	if len(r.Journal) != 1 {
		return false
	}
	e := &r.Journal[0]
	if e.Attempt != r.Attempt || e.Fence != r.Fence || e.Owner != r.Owner ||
		e.Takeover || e.AfterExpiry || e.Decision || e.ResolvedBy != "" || !e.LateFinish.IsZero() ||
		e.Policy != r.Policy.String() || !sameMicro(e.Started, r.CreatedAt) || !sameMicro(e.LeaseUntil, r.LeaseUntil) {
		return false
	}
	switch r.Status {
	case idem.StatusInProgress:
		return e.Outcome == "" && e.Ended.IsZero() && e.Reason == ""
	case idem.StatusCompleted:
		return e.Outcome == idem.OutcomeCompleted && sameMicro(e.Ended, r.UpdatedAt) && e.Reason == ""
	default:
		return e.Outcome == string(r.Status) && sameMicro(e.Ended, r.UpdatedAt) && e.Reason == r.Reason
	}
}

// sameMicro reports whether a and b are the same time at the store's
// precision (both zero, or the same microsecond).
func sameMicro(a, b time.Time) bool {
	return a.IsZero() == b.IsZero() && a.UnixMicro() == b.UnixMicro()
}
