package redisstore

import (
	"fmt"
	"strconv"
	"time"

	"github.com/idemkit/idem/store"
)

// decode reads the flat HGETALL answer of key's hash. A hash it cannot read
// is an *store.CorruptError: never absent, never an outcome.
func decode(key string, flat []any) (store.Record, error) {
	corrupt := func(format string, args ...any) (store.Record, error) {
		return store.Record{}, &store.CorruptError{Key: key, Detail: fmt.Sprintf(format, args...)}
	}
	if len(flat)%2 != 0 {
		return corrupt("odd hash reply")
	}
	rec := store.Record{Key: key}
	var (
		have                   int
		st, po, js, cr, jx, ji string
	)
	const (
		hSt = 1 << iota
		hPo
		hF
		hA
		hLu
		hEx
		hC
		hU
		hJ
		hAll = hSt | hPo | hF | hA | hLu | hEx | hC | hU
	)
	num := func(field, v string, bit int) (int64, error) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s %q is not a number", field, v)
		}
		have |= bit
		return n, nil
	}
	for i := 0; i < len(flat); i += 2 {
		f, _ := flat[i].(string)
		v, ok := flat[i+1].(string)
		if !ok {
			return corrupt("field %q is not a string", f)
		}
		var (
			n   int64
			err error
		)
		switch f {
		case "st":
			st, have = v, have|hSt
		case "po":
			po, have = v, have|hPo
		case "f":
			n, err = num("fence", v, hF)
			rec.Fence = n
		case "a":
			n, err = num("attempt", v, hA)
			rec.Attempt = int(n)
		case "i":
			rec.AttemptID = v
		case "o":
			rec.Owner = v
		case "fp":
			rec.Fingerprint = v
		case "r":
			if v != "" {
				rec.Result = []byte(v)
			}
		case "rs":
			rec.Reason = v
		case "lu":
			n, err = num("lease", v, hLu)
			rec.LeaseUntil = fromMicros(n)
		case "ex":
			n, err = num("expiry", v, hEx)
			rec.ExpiresAt = fromMicros(n)
		case "c":
			n, err = num("creation time", v, hC)
			rec.CreatedAt = fromMicros(n)
		case "u":
			n, err = num("update time", v, hU)
			rec.UpdatedAt = fromMicros(n)
		case "j":
			js, have = v, have|hJ
		case "cr":
			cr = v
		case "jx":
			jx = v
		case "ji":
			ji = v
		}
		if err != nil {
			return corrupt("%v", err)
		}
	}
	if have&hAll != hAll {
		return corrupt("fields missing from the hash (%d fields)", len(flat)/2)
	}
	var err error
	if rec.Status, err = store.ParseStatus(st); err != nil {
		return corrupt("status %q is not one of in_progress, completed, failed, released", st)
	}
	if rec.Policy, err = store.ParsePolicy(po); err != nil {
		return corrupt("policy %q is not at_least_once or at_most_once", po)
	}
	if have&hJ == 0 {
		rec.Journal = []store.JournalEntry{implicitEntry(&rec, po, cr, jx, ji)}
		return rec, nil
	}
	if rec.Journal, err = store.UnmarshalJournal([]byte(js)); err != nil {
		return corrupt("%v", err)
	}
	return rec, nil
}

// implicitEntry is the one journal entry of a record whose hash has no
// journal field: the entry its other fields say (see scripts.go). Its
// outcome is the jx field, or else the status unless in_progress; its
// attempt id is the ji field (an abandoned attempt's), or else the
// record's.
func implicitEntry(rec *store.Record, policy, corr, outcome, attemptID string) store.JournalEntry {
	if attemptID == "" {
		attemptID = rec.AttemptID
	}
	e := store.JournalEntry{
		Attempt: rec.Attempt, Fence: rec.Fence, AttemptID: attemptID, Owner: rec.Owner, Correlation: corr,
		Started: rec.CreatedAt, LeaseUntil: rec.LeaseUntil, Policy: policy,
	}
	if outcome == "" && rec.Status != store.StatusInProgress {
		outcome = string(rec.Status)
	}
	if outcome != "" {
		e.Outcome, e.Ended = store.Outcome(outcome), rec.UpdatedAt
		if e.Outcome != store.OutcomeCompleted {
			e.Reason = rec.Reason
		}
	}
	return e
}

// fromMicros is the UTC time of unix microseconds.
func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

// reply reads a script's answer: an array whose first element is a code.
func reply(v any) ([]any, int64, error) {
	a, ok := v.([]any)
	if !ok || len(a) == 0 {
		return nil, 0, fmt.Errorf("redisstore: unexpected script reply %v", v)
	}
	code, ok := a[0].(int64)
	if !ok {
		return nil, 0, fmt.Errorf("redisstore: unexpected script reply %v", v)
	}
	return a, code, nil
}

// replyTime reads the time (unix microseconds, an integer) at a[i].
func replyTime(a []any, i int) (time.Time, error) {
	if i >= len(a) {
		return time.Time{}, fmt.Errorf("redisstore: script reply too short: %v", a)
	}
	switch v := a[i].(type) {
	case int64:
		return fromMicros(v), nil
	case string:
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return fromMicros(n), nil
		}
	}
	return time.Time{}, fmt.Errorf("redisstore: bad time %v in a script reply", a[i])
}

// replyHash reads the hash (a flat HGETALL array) at a[i].
func replyHash(a []any, i int) ([]any, error) {
	if i >= len(a) {
		return nil, fmt.Errorf("redisstore: script reply too short: %v", a)
	}
	h, ok := a[i].([]any)
	if !ok {
		return nil, fmt.Errorf("redisstore: bad hash %v in a script reply", a[i])
	}
	return h, nil
}

// replyCorrupt is the error of a script that found key's record unreadable
// ({-1, now, why}).
func replyCorrupt(key string, a []any) error {
	why := "unreadable record"
	if len(a) > 2 {
		if s, ok := a[2].(string); ok {
			why = s
		}
	}
	return &store.CorruptError{Key: key, Detail: why}
}
