package sqlitestore

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/idemkit/idem/store"
)

// The record table's columns, in the order every statement binds and scans
// them. The key comes last, so that an UPDATE binds the same values with
// plain positional parameters (SET ... = ? WHERE key = ?).
const columns = `status, policy, fence, attempt_id, attempt, owner, fingerprint, result, reason, ` +
	`lease_until, expires_at, created_at, updated_at, journal, correlation, key`

const numColumns = 16

// fenceColumn is the index of fence in columns.
const fenceColumn = 2

const (
	// sqlInsert writes a record, with the version given after the
	// columns, if its key is absent and its fence (given again after the
	// version) is above the fence floor (migration 004); it changes
	// nothing otherwise. The floor is read in the insert's own write
	// transaction, so it is exact across processes, at the cost of a
	// lookup in a one-row table. (Numbered parameters would name the fence
	// once, but the driver allocates each one's name on every bind.) OR
	// FAIL, as for sqlUpdate: SQLite takes an INSERT ... SELECT for one
	// that may write several rows and would copy the pages it changes to
	// a statement journal.
	sqlInsert = `INSERT OR FAIL INTO idem_records (` + columns + `, version) ` +
		`SELECT ?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,? ` +
		`WHERE ? > ` + sqlFloorExpr + ` ON CONFLICT (key) DO NOTHING`
	// sqlFloorExpr is the fence floor: the highest fence of a deleted
	// record (0 if the row is missing).
	sqlFloorExpr = `COALESCE((SELECT floor FROM idem_fence_floor WHERE id = 1), 0)`
	sqlFloor     = `SELECT ` + sqlFloorExpr
	// sqlUpdate overwrites a record if it still has the version given
	// after the columns. OR FAIL: the version trigger makes SQLite treat a
	// plain (OR ABORT) UPDATE as one that may write several rows, so it
	// copies every page the statement changes to a statement journal,
	// about a fifth of the statement's cost, to undo it alone if it fails.
	// This UPDATE changes one row, after its constraints are checked, and
	// the writer rolls back its whole transaction when any statement fails
	// (writer.runBatch), so that journal is never used.
	sqlUpdate = `UPDATE OR FAIL idem_records SET status = ?, policy = ?, fence = ?, attempt_id = ?, attempt = ?, owner = ?, ` +
		`fingerprint = ?, result = ?, reason = ?, lease_until = ?, expires_at = ?, created_at = ?, ` +
		`updated_at = ?, journal = ?, correlation = ?, version = version + 1 WHERE key = ? AND version = ?`
	sqlLoad   = `SELECT ` + columns + `, version FROM idem_records WHERE key = ?`
	sqlDelete = `DELETE FROM idem_records WHERE key = ? AND expires_at > ?`
	sqlSweep  = `DELETE FROM idem_records WHERE key IN ` +
		`(SELECT key FROM idem_records WHERE expires_at <= ? ORDER BY expires_at LIMIT ?)`
)

// micros converts a time to the stored form: unix microseconds, or nil for
// the zero time.
func micros(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMicro()
}

// fromMicros is the inverse of micros.
func fromMicros(v int64) time.Time { return time.UnixMicro(v).UTC() }

// truncate gives t the precision the store keeps (microseconds, UTC), so a
// record returned by a call equals the record read back later.
func truncate(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return time.UnixMicro(t.UnixMicro()).UTC()
}

// normalize truncates every time in r to the stored precision.
func normalize(r *store.Record) {
	r.LeaseUntil = truncate(r.LeaseUntil)
	r.ExpiresAt = truncate(r.ExpiresAt)
	r.CreatedAt = truncate(r.CreatedAt)
	r.UpdatedAt = truncate(r.UpdatedAt)
	for i := range r.Journal {
		e := &r.Journal[i]
		e.Started = truncate(e.Started)
		e.LeaseUntil = truncate(e.LeaseUntil)
		e.Ended = truncate(e.Ended)
		e.LateFinish = truncate(e.LateFinish)
	}
}

// encodeRecord returns r's column values in the order of columns, with
// room for two more arguments (the version, and an insert's fence again). With
// implicit (WithImplicitJournal), a journal that the columns say is
// stored as an empty column.
func encodeRecord(r *store.Record, implicit bool) ([]any, error) {
	journal, correlation := "[]", ""
	for i := len(r.Journal) - 1; i >= 0; i-- {
		if !r.Journal[i].Decision { // the latest attempt's, not a resolution's
			correlation = r.Journal[i].Correlation
			break
		}
	}
	// The journal implicit (store.IsImplicit): an empty column, no
	// JSON written or read, and a row less than half the size (129 bytes
	// against 304 for a Ledger.Do's completed key), so a commit writes
	// fewer pages to the log.
	if implicit && store.IsImplicit(r) {
		journal = ""
	} else if len(r.Journal) > 0 {
		b, err := store.MarshalJournal(r.Journal)
		if err != nil {
			return nil, fmt.Errorf("sqlitestore: encoding the journal of %q: %w", r.Key, err)
		}
		journal = unsafe.String(unsafe.SliceData(b), len(b)) // b is not used again
	}
	var result any
	if r.Result != nil {
		result = r.Result
	}
	return append(make([]any, 0, numColumns+2),
		string(r.Status),
		r.Policy.String(),
		r.Fence,
		r.AttemptID,
		int64(r.Attempt),
		r.Owner,
		r.Fingerprint,
		result,
		r.Reason,
		micros(r.LeaseUntil),
		micros(r.ExpiresAt),
		micros(r.CreatedAt),
		micros(r.UpdatedAt),
		journal,
		correlation,
		r.Key,
	), nil
}

// decodeVersioned decodes the columns of sqlLoad: a record and its version.
func decodeVersioned(v []any) (*store.Record, int64, error) {
	r, err := decodeRecord(v[:numColumns])
	if err != nil {
		return nil, 0, err
	}
	ver, ok := v[numColumns].(int64)
	if !ok {
		return nil, 0, &store.CorruptError{Key: r.Key, Detail: fmt.Sprintf("version is %T, not an integer", v[numColumns])}
	}
	return r, ver, nil
}

// decodeRecord builds a record from the column values of one row (driver
// values: int64, string, []byte or nil). A value it cannot read makes a
// *store.CorruptError: a damaged row is never read as absent.
func decodeRecord(v []any) (*store.Record, error) {
	var r store.Record
	key, ok := text(v[15])
	if !ok {
		return nil, &store.CorruptError{Key: fmt.Sprint(v[15]), Detail: "key is not text"}
	}
	r.Key = key
	corrupt := func(format string, args ...any) error {
		return &store.CorruptError{Key: key, Detail: fmt.Sprintf(format, args...)}
	}

	s, ok := text(v[0])
	if !ok {
		return nil, corrupt("status is %T, not text", v[0])
	}
	st, err := store.ParseStatus(s)
	if err != nil {
		return nil, corrupt("unknown status %q", s)
	}
	r.Status = st

	s, ok = text(v[1])
	if !ok {
		return nil, corrupt("policy is %T, not text", v[1])
	}
	p, err := store.ParsePolicy(s)
	if err != nil {
		return nil, corrupt("unknown policy %q", s)
	}
	r.Policy = p

	fence, ok := v[2].(int64)
	if !ok {
		return nil, corrupt("fence is %T, not an integer", v[2])
	}
	r.Fence = fence
	if r.AttemptID, ok = optText(v[3]); !ok {
		return nil, corrupt("attempt_id is %T, not text", v[3])
	}
	attempt, ok := v[4].(int64)
	if !ok {
		return nil, corrupt("attempt is %T, not an integer", v[4])
	}
	r.Attempt = int(attempt)

	if r.Owner, ok = optText(v[5]); !ok {
		return nil, corrupt("owner is %T, not text", v[5])
	}
	if r.Fingerprint, ok = optText(v[6]); !ok {
		return nil, corrupt("fingerprint is %T, not text", v[6])
	}
	switch x := v[7].(type) {
	case nil:
	case []byte:
		r.Result = x
	case string:
		r.Result = []byte(x)
	default:
		return nil, corrupt("result is %T, not a blob", v[7])
	}
	if r.Reason, ok = optText(v[8]); !ok {
		return nil, corrupt("reason is %T, not text", v[8])
	}

	for i, dst := range [...]*time.Time{&r.LeaseUntil, &r.ExpiresAt, &r.CreatedAt, &r.UpdatedAt} {
		switch x := v[9+i].(type) {
		case nil:
		case int64:
			*dst = fromMicros(x)
		default:
			return nil, corrupt("time column %d is %T, not an integer", 9+i, v[9+i])
		}
	}

	correlation, ok := optText(v[14])
	if !ok {
		return nil, corrupt("correlation is %T, not text", v[14])
	}
	var j []byte
	switch x := v[13].(type) {
	case string:
		j = []byte(x)
	case []byte:
		j = x
	default:
		return nil, corrupt("journal is %T, not JSON text", v[13])
	}
	if len(j) == 0 {
		r.Journal = []store.JournalEntry{store.ImplicitEntry(&r, correlation)}
		return &r, nil
	}
	if r.Journal, err = store.UnmarshalJournal(j); err != nil {
		return nil, corrupt("%v", err)
	}
	if len(r.Journal) == 0 {
		r.Journal = nil
	}
	return &r, nil
}

func text(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case []byte:
		return string(x), true
	}
	return "", false
}

func optText(v any) (string, bool) {
	if v == nil {
		return "", true
	}
	return text(v)
}
