package store

import (
	"time"
)

// A record's journal is implicit when it is the one entry that the
// record's own fields say: a key's first attempt and, once it ended, its
// outcome, which is what nearly every key ever has. Stores that keep a
// record in columns (sqlitestore, pgstore) then store no journal for it,
// only the attempt's correlation id, and build the entry when they read
// the record. Any other journal (a takeover, a second attempt, an
// abandon, a late finish, a resolution) is stored in full.

// ImplicitEntry is the journal entry that r's fields say, with the
// correlation id the store kept: attempt, fence, attempt id and owner are
// r's, it
// started when r was created with r's policy, its lease is r's, and once r
// is no longer in progress its outcome is r's status, ended at r's last
// update, with r's reason unless it completed. The transitions keep those
// equalities for a first attempt: Claim of a new key, Extend, and Finish
// with completed, failed or released.
func ImplicitEntry(r *Record, correlation string) JournalEntry {
	e := JournalEntry{
		Attempt: r.Attempt, Fence: r.Fence, AttemptID: r.AttemptID, Owner: r.Owner, Correlation: correlation,
		Started: r.CreatedAt, LeaseUntil: r.LeaseUntil, Policy: r.Policy.String(),
	}
	if r.Status != StatusInProgress {
		e.Outcome, e.Ended = Outcome(r.Status), r.UpdatedAt
		if r.Status != StatusCompleted {
			e.Reason = r.Reason
		}
	}
	return e
}

// IsImplicit reports whether r's journal is exactly ImplicitEntry's (its
// correlation id aside) to the microsecond, the precision stores keep, so
// that a store can keep it implicit and read it back unchanged. It compares
// field by field, without building the entry: stores call it on every
// write.
func IsImplicit(r *Record) bool {
	if len(r.Journal) != 1 {
		return false
	}
	e := &r.Journal[0]
	if e.Attempt != r.Attempt || e.Fence != r.Fence || e.AttemptID != r.AttemptID || e.Owner != r.Owner ||
		e.Takeover || e.AfterExpiry || e.Decision || e.ResolvedBy != "" || !e.LateFinish.IsZero() ||
		e.Policy != r.Policy.String() || !sameMicro(e.Started, r.CreatedAt) || !sameMicro(e.LeaseUntil, r.LeaseUntil) {
		return false
	}
	switch r.Status {
	case StatusInProgress:
		return e.Outcome == "" && e.Ended.IsZero() && e.Reason == ""
	case StatusCompleted:
		return e.Outcome == OutcomeCompleted && sameMicro(e.Ended, r.UpdatedAt) && e.Reason == ""
	default:
		return e.Outcome == Outcome(r.Status) && sameMicro(e.Ended, r.UpdatedAt) && e.Reason == r.Reason
	}
}

// sameMicro reports whether a and b are the same time to the microsecond
// (both zero, or the same microsecond).
func sameMicro(a, b time.Time) bool {
	return a.IsZero() == b.IsZero() && a.UnixMicro() == b.UnixMicro()
}
