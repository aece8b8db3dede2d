// Package transition holds the record's state machine (DESIGN.md §2) for
// stores that read a record and write it back inside one atomic step of their
// own (a mutex, a write transaction). Stores that decide in the backend (SQL
// conditions, Lua, DynamoDB expressions) implement the same rules there; the
// conformance suite in idemtest holds both to them.
package transition

import (
	"time"

	"github.com/idemkit/idem"
)

// Claim applies req to rec (nil if absent) at now. When the claim is
// acquired it returns the record to store; otherwise next is nil and nothing
// must be written.
func Claim(rec *idem.Record, req idem.ClaimRequest, now time.Time) (next *idem.Record, res idem.ClaimResult) {
	res.Now = now
	if rec != nil && !rec.Expired(now) {
		switch rec.Status {
		case idem.StatusCompleted, idem.StatusFailed:
			res.Record = *rec
			return nil, res
		case idem.StatusInProgress:
			if !rec.Lapsed(now) || (rec.Policy != idem.AtLeastOnce && !req.TakeLapsed) {
				res.Record = *rec
				return nil, res
			}
			res.Takeover = true
		case idem.StatusReleased:
		default:
			res.Record = *rec
			return nil, res
		}
	}

	var n *idem.Record
	if rec == nil {
		// A new key's record and its first journal entry share one
		// allocation: the common case, on every store's hot path.
		b := new(recordWithEntry)
		n = &b.rec
		n.Journal = b.entry[:0:1]
	} else {
		n = new(idem.Record)
	}
	n.Key, n.CreatedAt = req.Key, now
	afterExpiry := false
	if rec != nil {
		// Keep fence and numbering growing even across expiry, so a holder
		// from before the expiry is still refused.
		n.Fence, n.Attempt, n.Reason, n.CreatedAt = rec.Fence, rec.Attempt, rec.Reason, rec.CreatedAt
		n.Journal = append(n.Journal, rec.Journal...)
		if rec.Expired(now) {
			afterExpiry = true
			n.CreatedAt = now
		}
		if res.Takeover && len(n.Journal) > 0 {
			last := &n.Journal[len(n.Journal)-1]
			if last.Fence == rec.Fence && last.Outcome == "" {
				last.Outcome = idem.OutcomeLapsed
			}
		}
	}
	n.Status = idem.StatusInProgress
	n.Policy = req.Policy
	n.Fence++
	n.Attempt++
	n.Owner = req.Owner
	n.Fingerprint = req.Fingerprint
	n.LeaseUntil = now.Add(req.Lease)
	n.ExpiresAt = now.Add(max(req.Lease, req.Retention))
	n.UpdatedAt = now
	n.Journal = Append(n.Journal, idem.JournalEntry{
		Attempt:     n.Attempt,
		Fence:       n.Fence,
		Owner:       req.Owner,
		Correlation: req.Correlation,
		Started:     now,
		LeaseUntil:  n.LeaseUntil,
		Takeover:    res.Takeover,
		AfterExpiry: afterExpiry,
		Policy:      req.Policy.String(),
	})
	res.Acquired = true
	res.Record = *n
	return n, res
}

// Append adds e to the journal, keeping the newest idem.MaxJournal entries.
func Append(j []idem.JournalEntry, e idem.JournalEntry) []idem.JournalEntry {
	j = append(j, e)
	if over := len(j) - idem.MaxJournal; over > 0 {
		j = append(j[:0:0], j[over:]...)
	}
	return j
}

// Ending is how an attempt ends.
type Ending struct {
	Status    idem.Status // completed, failed, released; in_progress for abandon
	Result    []byte
	Reason    string
	Retention time.Duration // completed and failed
}

// Finish ends the attempt holding fence. On success it returns the record to
// store. On idem.ErrLeaseLost it may still return a record to store: the
// stale attempt's journal entry annotated with its late finish (nil when
// there is nothing to annotate).
func Finish(rec *idem.Record, fence int64, end Ending, now time.Time) (*idem.Record, error) {
	if rec == nil || rec.Expired(now) {
		return nil, idem.ErrLeaseLost
	}
	if rec.Fence != fence || rec.Status != idem.StatusInProgress {
		return annotateLate(rec, fence, now), idem.ErrLeaseLost
	}
	n := clone(rec)
	n.UpdatedAt = now
	n.LeaseUntil = now
	outcome := ""
	switch end.Status {
	case idem.StatusCompleted:
		n.Result = end.Result
		n.ExpiresAt = now.Add(end.Retention)
		outcome = idem.OutcomeCompleted
	case idem.StatusFailed:
		n.Reason = end.Reason
		n.ExpiresAt = now.Add(end.Retention)
		outcome = idem.OutcomeFailed
	case idem.StatusReleased:
		n.Reason = end.Reason
		outcome = idem.OutcomeReleased
	case idem.StatusInProgress:
		n.Reason = end.Reason
		outcome = idem.OutcomeAbandoned
	}
	n.Status = end.Status
	if e := entry(n, fence); e != nil {
		e.Ended = now
		e.LeaseUntil = now
		e.Outcome = outcome
		e.Reason = end.Reason
	}
	return n, nil
}

// Extend renews the lease of the attempt holding fence. Like Finish, on
// idem.ErrLeaseLost it may return the stale attempt's journal entry annotated
// with LateFinish, to store: a refused heartbeat proves the attempt was still
// running.
func Extend(rec *idem.Record, fence int64, lease time.Duration, now time.Time) (*idem.Record, error) {
	if rec == nil || rec.Expired(now) {
		return nil, idem.ErrLeaseLost
	}
	if rec.Fence != fence || rec.Status != idem.StatusInProgress {
		return annotateLate(rec, fence, now), idem.ErrLeaseLost
	}
	n := clone(rec)
	n.LeaseUntil = now.Add(lease)
	if n.ExpiresAt.Before(n.LeaseUntil) {
		n.ExpiresAt = n.LeaseUntil
	}
	n.UpdatedAt = now
	if e := entry(n, fence); e != nil {
		e.LeaseUntil = n.LeaseUntil
	}
	return n, nil
}

// Resolve applies an operator's decision.
func Resolve(rec *idem.Record, fence int64, r idem.Resolution, now time.Time) (*idem.Record, error) {
	if rec == nil || rec.Expired(now) {
		return nil, idem.ErrNotFound
	}
	if fence != 0 && rec.Fence != fence {
		return nil, idem.ErrLeaseLost
	}
	n := clone(rec)
	n.Fence++
	n.UpdatedAt = now
	n.LeaseUntil = now
	n.Reason = r.Reason
	outcome := idem.OutcomeResolvedNotDone
	if r.Done {
		n.Status = idem.StatusCompleted
		n.Result = r.Result
		ret := r.Retention
		if ret <= 0 {
			ret = idem.DefaultRetention
		}
		n.ExpiresAt = now.Add(ret)
		outcome = idem.OutcomeResolvedDone
	} else {
		n.Status = idem.StatusReleased
		n.Result = nil
	}
	if e := entry(n, rec.Fence); e != nil && e.Outcome == "" {
		e.Ended = now
		e.Outcome = outcome
		e.Reason = r.Reason
		e.ResolvedBy = r.By
		if e.LeaseUntil.After(now) {
			e.LeaseUntil = now
		}
	} else {
		n.Journal = Append(n.Journal, idem.JournalEntry{
			Attempt: n.Attempt, Fence: n.Fence, Owner: r.By,
			Started: now, LeaseUntil: now, Ended: now,
			Outcome: outcome, Reason: r.Reason, ResolvedBy: r.By, Decision: true,
		})
	}
	return n, nil
}

func annotateLate(rec *idem.Record, fence int64, now time.Time) *idem.Record {
	for i := range rec.Journal {
		if e := rec.Journal[i]; e.Fence == fence && e.Ended.IsZero() && e.LateFinish.IsZero() {
			n := clone(rec)
			n.Journal[i].LateFinish = now
			return n
		}
	}
	return nil
}

func entry(r *idem.Record, fence int64) *idem.JournalEntry {
	for i := len(r.Journal) - 1; i >= 0; i-- {
		if r.Journal[i].Fence == fence {
			return &r.Journal[i]
		}
	}
	return nil
}

func clone(r *idem.Record) *idem.Record {
	if len(r.Journal) == 1 {
		b := new(recordWithEntry)
		b.rec = *r
		b.entry[0] = r.Journal[0]
		b.rec.Journal = b.entry[:1:1]
		return &b.rec
	}
	n := *r
	n.Journal = append([]idem.JournalEntry(nil), r.Journal...)
	return &n
}

// recordWithEntry holds a record and a one-entry journal in one allocation.
type recordWithEntry struct {
	rec   idem.Record
	entry [1]idem.JournalEntry
}
