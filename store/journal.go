package store

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"time"
)

// The journal's wire names: the JSON member of each [JournalEntry] field
// (its json tag says the same; a test holds them equal). Stores that build
// or patch entries in their backend (pgstore's SQL, redisstore's Lua)
// write them from these constants, so the names are spelled once.
const (
	WireAttempt     = "a"
	WireFence       = "f"
	WireAttemptID   = "i"
	WireOwner       = "o"
	WireCorrelation = "c"
	WireStarted     = "s"
	WireLeaseUntil  = "l"
	WireEnded       = "e"
	WireOutcome     = "x"
	WireReason      = "r"
	WireTakeover    = "t"
	WireAfterExpiry = "ae"
	WirePolicy      = "p"
	WireLateFinish  = "lf"
	WireResolvedBy  = "rb"
	WireDecision    = "d"
)

// journalFields are the fields of JournalEntry that appendEntry writes,
// with their JSON tags, in order. If the type has changed (a field added,
// renamed or retagged), fastJournal is false and MarshalJournal uses
// encoding/json, so the change costs speed, never data.
var journalFields = []struct{ name, tag string }{
	{"Attempt", WireAttempt}, {"Fence", WireFence}, {"AttemptID", WireAttemptID + ",omitempty"},
	{"Owner", WireOwner + ",omitempty"}, {"Correlation", WireCorrelation + ",omitempty"},
	{"Started", WireStarted}, {"LeaseUntil", WireLeaseUntil}, {"Ended", WireEnded + ",omitzero"},
	{"Outcome", WireOutcome + ",omitempty"}, {"Reason", WireReason + ",omitempty"},
	{"Takeover", WireTakeover + ",omitempty"}, {"AfterExpiry", WireAfterExpiry + ",omitempty"},
	{"Policy", WirePolicy + ",omitempty"}, {"LateFinish", WireLateFinish + ",omitzero"},
	{"ResolvedBy", WireResolvedBy + ",omitempty"}, {"Decision", WireDecision + ",omitempty"},
}

var fastJournal = func() bool {
	t := reflect.TypeFor[JournalEntry]()
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

// MarshalJournal returns the JSON of j: the bytes json.Marshal makes of it
// (the tests hold the two equal), made without reflection, because a
// record's journal is encoded on every write.
func MarshalJournal(j []JournalEntry) ([]byte, error) {
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

func appendJournal(dst []byte, j []JournalEntry) []byte {
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

func appendEntry(dst []byte, e *JournalEntry) []byte {
	dst = append(dst, `{"`+WireAttempt+`":`...)
	dst = strconv.AppendInt(dst, int64(e.Attempt), 10)
	dst = append(dst, `,"`+WireFence+`":`...)
	dst = strconv.AppendInt(dst, e.Fence, 10)
	if e.AttemptID != "" {
		dst = append(dst, `,"`+WireAttemptID+`":`...)
		dst = appendString(dst, e.AttemptID)
	}
	if e.Owner != "" {
		dst = append(dst, `,"`+WireOwner+`":`...)
		dst = appendString(dst, e.Owner)
	}
	if e.Correlation != "" {
		dst = append(dst, `,"`+WireCorrelation+`":`...)
		dst = appendString(dst, e.Correlation)
	}
	dst = append(dst, `,"`+WireStarted+`":`...)
	dst = appendTime(dst, e.Started)
	dst = append(dst, `,"`+WireLeaseUntil+`":`...)
	dst = appendTime(dst, e.LeaseUntil)
	if !e.Ended.IsZero() {
		dst = append(dst, `,"`+WireEnded+`":`...)
		dst = appendTime(dst, e.Ended)
	}
	if e.Outcome != "" {
		dst = append(dst, `,"`+WireOutcome+`":`...)
		dst = appendString(dst, string(e.Outcome))
	}
	if e.Reason != "" {
		dst = append(dst, `,"`+WireReason+`":`...)
		dst = appendString(dst, e.Reason)
	}
	if e.Takeover {
		dst = append(dst, `,"`+WireTakeover+`":true`...)
	}
	if e.AfterExpiry {
		dst = append(dst, `,"`+WireAfterExpiry+`":true`...)
	}
	if e.Policy != "" {
		dst = append(dst, `,"`+WirePolicy+`":`...)
		dst = appendString(dst, e.Policy)
	}
	if !e.LateFinish.IsZero() {
		dst = append(dst, `,"`+WireLateFinish+`":`...)
		dst = appendTime(dst, e.LateFinish)
	}
	if e.ResolvedBy != "" {
		dst = append(dst, `,"`+WireResolvedBy+`":`...)
		dst = appendString(dst, e.ResolvedBy)
	}
	if e.Decision {
		dst = append(dst, `,"`+WireDecision+`":true`...)
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
// nanoseconds); MarshalJournal has checked the year.
func appendTime(dst []byte, t time.Time) []byte {
	dst = append(dst, '"')
	dst = t.AppendFormat(dst, time.RFC3339Nano)
	return append(dst, '"')
}

// UnmarshalJournal decodes a journal that [MarshalJournal] (or
// encoding/json, or a backend writing the wire names) made: a JSON array
// of entry objects. Its times come back in UTC. An error says the stored
// journal is damaged; a store reports it as a [*CorruptError].
func UnmarshalJournal(b []byte) ([]JournalEntry, error) {
	if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '[' {
		return nil, fmt.Errorf("journal is not a JSON array: %.60s", b)
	}
	var j []JournalEntry
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	for i := range j {
		e := &j[i]
		e.Started, e.LeaseUntil, e.Ended, e.LateFinish = utc(e.Started), utc(e.LeaseUntil), utc(e.Ended), utc(e.LateFinish)
	}
	return j, nil
}

// utc returns t in UTC, leaving the zero time as it is.
func utc(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC()
}
