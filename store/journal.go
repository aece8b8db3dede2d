package store

import (
	"encoding/json"
	"reflect"
	"strconv"
	"time"
)

// journalFields are the fields of JournalEntry that appendEntry
// writes, with their JSON tags, in order. If the type has changed (a field
// added, renamed or retagged), fastJournal is false and MarshalJournal
// uses encoding/json, so the change costs speed, never data.
var journalFields = []struct{ name, tag string }{
	{"Attempt", "a"}, {"Fence", "f"}, {"Owner", "o,omitempty"}, {"Correlation", "c,omitempty"},
	{"Started", "s"}, {"LeaseUntil", "l"}, {"Ended", "e,omitzero"}, {"Outcome", "x,omitempty"},
	{"Reason", "r,omitempty"}, {"Takeover", "t,omitempty"}, {"AfterExpiry", "ae,omitempty"},
	{"Policy", "p,omitempty"}, {"LateFinish", "lf,omitzero"}, {"ResolvedBy", "rb,omitempty"},
	{"Decision", "d,omitempty"},
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
// nanoseconds); MarshalJournal has checked the year.
func appendTime(dst []byte, t time.Time) []byte {
	dst = append(dst, '"')
	dst = t.AppendFormat(dst, time.RFC3339Nano)
	return append(dst, '"')
}
