package store

// The record's state machine, for stores that read a record and write it
// back inside one atomic step of their own (a mutex, a write transaction).
// Stores that decide in the backend (SQL conditions, Lua, DynamoDB
// expressions) implement the same rules there; the conformance suite in
// idemtest, and differential tests against these functions, hold both to
// them.
//
// The rules come in two forms over the same code: functions that copy on
// write (ApplyClaim, ApplyFinish, ApplyExtend, ApplyResolve: the record
// passed in is never modified, for stores that decode a record, change it
// and encode it again), and [Slot], a record changed in place under the
// store's lock (memstore).

import (
	"slices"
	"time"
)

// ApplyClaim applies req to rec (nil if absent) at now. When the claim is
// acquired it returns the record to store; otherwise next is nil and nothing
// must be written. rec is not modified. floor is passed to [FirstFence] for
// a new record (0 if the store keeps none). The caller has checked req
// ([ClaimRequest.Check]).
func ApplyClaim(rec *Record, req ClaimRequest, now time.Time, floor int64) (next *Record, res ClaimResult) {
	res.Now = now
	take, takeover := claimable(rec, req, now)
	if !take {
		res.Record = *rec
		return nil, res
	}
	var n *Record
	if rec == nil {
		// A new key's record and its first journal entry share one
		// allocation: the common case, on every store's hot path.
		b := new(recordWithEntry)
		n = &b.rec
		n.Journal = b.entry[:0:1]
	} else {
		n = cloneGrow(rec, 1)
	}
	claim(n, rec != nil, req, now, takeover, floor)
	res.Acquired, res.Takeover = true, takeover
	res.Record = *n
	return n, res
}

// claimable reports whether req may claim rec (nil if absent) at now, and
// whether that takes over a lapsed attempt.
//
// A lapsed attempt is taken over only by the same request: not when both
// it and req have a fingerprint and they differ (the lapsed attempt may
// have done its request's effect, and running another request's under the
// same key would make two effects of one operation). Such a claim finds
// the record as it is, which the Ledger answers with a mismatch. A
// released record is claimable by any request: its last attempt is known
// not to have done its effect.
func claimable(rec *Record, req ClaimRequest, now time.Time) (take, takeover bool) {
	if rec == nil || rec.Expired(now) {
		return true, false
	}
	switch rec.Status {
	case StatusReleased:
		return true, false
	case StatusInProgress:
		if !rec.Lapsed(now) || (rec.Policy != AtLeastOnce && !req.TakeLapsed) ||
			otherRequest(rec.Fingerprint, req.Fingerprint) {
			return false, false
		}
		return true, true
	}
	return false, false // completed, failed, or a status this code does not know
}

// otherRequest reports whether a record's fingerprint and a request's name
// different requests: both are set and they differ. A missing fingerprint
// matches any.
func otherRequest(stored, requested string) bool {
	return stored != "" && requested != "" && stored != requested
}

// claim writes an acquired claim into n: the record as found when found
// (claimable said yes), otherwise a zero record, whose fence starts at
// FirstFence(now, floor).
func claim(n *Record, found bool, req ClaimRequest, now time.Time, takeover bool, floor int64) {
	// Fence, attempt and reason carry over even across expiry, so a holder
	// from before the expiry is still refused and numbering keeps growing.
	afterExpiry := found && n.Expired(now)
	if !found || afterExpiry {
		n.CreatedAt = now
	}
	if takeover && len(n.Journal) > 0 {
		last := &n.Journal[len(n.Journal)-1]
		if last.Fence == n.Fence && last.Outcome == "" {
			last.Outcome = OutcomeLapsed
		}
	}
	n.Key = req.Key
	n.Status = StatusInProgress
	n.Policy = req.Policy
	if found {
		n.Fence++
	} else {
		n.Fence = FirstFence(now, floor)
	}
	n.AttemptID = req.AttemptID
	n.Attempt++
	n.Owner = req.Owner
	n.Fingerprint = req.Fingerprint
	n.Result = nil
	n.LeaseUntil = now.Add(req.Lease)
	n.ExpiresAt = now.Add(max(req.Lease, req.Retention))
	n.UpdatedAt = now
	n.Journal = AppendJournal(n.Journal, JournalEntry{
		Attempt:     n.Attempt,
		Fence:       n.Fence,
		AttemptID:   req.AttemptID,
		Owner:       req.Owner,
		Correlation: req.Correlation,
		Started:     now,
		LeaseUntil:  n.LeaseUntil,
		Takeover:    takeover,
		AfterExpiry: afterExpiry,
		Policy:      req.Policy.String(),
	})
}

// Append adds e to the journal, keeping the newest MaxJournal entries.
func AppendJournal(j []JournalEntry, e JournalEntry) []JournalEntry {
	j = append(j, e)
	if over := len(j) - MaxJournal; over > 0 {
		j = append(j[:0:0], j[over:]...)
	}
	return j
}

// ApplyFinish ends the attempt req names. On success it returns the record
// to store. On ErrLeaseLost it may still return a record to store: the
// stale attempt's journal entry annotated with its late finish (nil when
// there is nothing to annotate). rec is not modified. The caller has
// checked req ([FinishRequest.Check]).
func ApplyFinish(rec *Record, req FinishRequest, now time.Time) (*Record, error) {
	if ok, late := held(rec, req.Fence, req.AttemptID, now); !ok {
		if late && !IsNotRun(req.Reason) {
			return annotateLate(rec, req.Fence, req.AttemptID, now), ErrLeaseLost
		}
		return nil, ErrLeaseLost
	}
	n := clone(rec)
	finish(n, req, now)
	return n, nil
}

// held reports whether the attempt (fence, attemptID) holds rec at now.
// When it does not, late reports whether rec is there to record the stale
// attempt's late finish.
func held(rec *Record, fence int64, attemptID string, now time.Time) (ok, late bool) {
	if rec == nil || rec.Expired(now) {
		return false, false
	}
	if rec.Fence != fence || rec.AttemptID != attemptID || rec.Status != StatusInProgress {
		return false, true
	}
	return true, false
}

// finish writes req's ending into n, which req's attempt holds.
func finish(n *Record, req FinishRequest, now time.Time) {
	n.UpdatedAt = now
	n.LeaseUntil = now
	switch req.Outcome {
	case OutcomeCompleted:
		n.Status = StatusCompleted
		n.Result = req.Result
		n.ExpiresAt = now.Add(req.Retention)
	case OutcomeFailed:
		n.Status = StatusFailed
		n.Reason = req.Reason
		n.ExpiresAt = now.Add(req.Retention)
	case OutcomeReleased:
		n.Status = StatusReleased
		n.Reason = req.Reason
	case OutcomeAbandoned:
		n.Reason = req.Reason
		n.AttemptID = "" // it cannot end again
	}
	if e := entry(n, req.Fence); e != nil {
		e.Ended = now
		e.LeaseUntil = now
		e.Outcome = req.Outcome
		e.Reason = req.Reason
	}
}

// ApplyExtend renews the lease of the attempt req names. Like ApplyFinish,
// on ErrLeaseLost it may return the stale attempt's journal entry annotated
// with LateFinish, to store: a refused heartbeat proves the attempt was still
// running. rec is not modified.
func ApplyExtend(rec *Record, req ExtendRequest, now time.Time) (*Record, error) {
	if ok, late := held(rec, req.Fence, req.AttemptID, now); !ok {
		if late {
			return annotateLate(rec, req.Fence, req.AttemptID, now), ErrLeaseLost
		}
		return nil, ErrLeaseLost
	}
	n := clone(rec)
	extend(n, req.Fence, req.Lease, now)
	return n, nil
}

// extend renews the lease of n, which fence holds.
func extend(n *Record, fence int64, lease time.Duration, now time.Time) {
	n.LeaseUntil = now.Add(lease)
	if n.ExpiresAt.Before(n.LeaseUntil) {
		n.ExpiresAt = n.LeaseUntil
	}
	n.UpdatedAt = now
	if e := entry(n, fence); e != nil {
		e.LeaseUntil = n.LeaseUntil
	}
}

// ApplyResolve applies an operator's decision. rec is not modified.
func ApplyResolve(rec *Record, r ResolveRequest, now time.Time) (*Record, error) {
	if err := resolvable(rec, r, now); err != nil {
		return nil, err
	}
	n := clone(rec)
	resolve(n, r, now)
	return n, nil
}

// resolvable reports whether r may decide rec (nil if absent) at now: its
// conditions hold (see ResolveRequest).
func resolvable(rec *Record, r ResolveRequest, now time.Time) error {
	if rec == nil || rec.Expired(now) {
		return ErrNotFound
	}
	inProgress := rec.Status == StatusInProgress
	switch {
	case r.Fence != 0 && rec.Fence != r.Fence,
		r.AttemptID != "" && (rec.AttemptID != r.AttemptID || !inProgress),
		r.InProgress && !inProgress,
		r.Lapsed && !rec.Lapsed(now):
		return ErrLeaseLost
	}
	return nil
}

// resolve writes r into n (resolvable said yes).
func resolve(n *Record, r ResolveRequest, now time.Time) {
	decided := n.Fence
	n.Fence++
	n.UpdatedAt = now
	n.LeaseUntil = now
	n.Reason = r.Reason
	outcome := OutcomeResolvedNotDone
	if r.Done {
		n.Status = StatusCompleted
		n.Result = r.Result
		ret := r.Retention
		if ret <= 0 {
			ret = DefaultRetention
		}
		n.ExpiresAt = now.Add(ret)
		outcome = OutcomeResolvedDone
	} else {
		n.Status = StatusReleased
		n.Result = nil
	}
	if e := entry(n, decided); e != nil && e.Outcome == "" {
		e.Ended = now
		e.Outcome = outcome
		e.Reason = r.Reason
		e.ResolvedBy = r.By
		if e.LeaseUntil.After(now) {
			e.LeaseUntil = now
		}
	} else {
		n.Journal = AppendJournal(n.Journal, JournalEntry{
			Attempt: n.Attempt, Fence: n.Fence, Owner: r.By,
			Started: now, LeaseUntil: now, Ended: now,
			Outcome: outcome, Reason: r.Reason, ResolvedBy: r.By, Decision: true,
		})
	}
}

// annotateLate returns a copy of rec with the LateFinish of the attempt's
// open journal entry set, or nil if there is no such entry.
func annotateLate(rec *Record, fence int64, attemptID string, now time.Time) *Record {
	i := lateEntry(rec, fence, attemptID)
	if i < 0 {
		return nil
	}
	n := clone(rec)
	n.Journal[i].LateFinish = now
	return n
}

// lateEntry returns the index of the journal entry of the attempt (fence,
// attemptID) if it is still open (no outcome, no late finish yet), else -1.
func lateEntry(rec *Record, fence int64, attemptID string) int {
	for i := range rec.Journal {
		if e := &rec.Journal[i]; e.Fence == fence && e.AttemptID == attemptID && e.Ended.IsZero() && e.LateFinish.IsZero() {
			return i
		}
	}
	return -1
}

func entry(r *Record, fence int64) *JournalEntry {
	for i := len(r.Journal) - 1; i >= 0; i-- {
		if r.Journal[i].Fence == fence {
			return &r.Journal[i]
		}
	}
	return nil
}

func clone(r *Record) *Record {
	if len(r.Journal) == 1 {
		b := new(recordWithEntry)
		b.rec = *r
		b.entry[0] = r.Journal[0]
		b.rec.Journal = b.entry[:1:1]
		return &b.rec
	}
	return cloneGrow(r, 0)
}

// cloneGrow copies r and its journal, leaving room for extra more entries.
func cloneGrow(r *Record, extra int) *Record {
	n := *r
	n.Journal = make([]JournalEntry, len(r.Journal), len(r.Journal)+extra)
	copy(n.Journal, r.Journal)
	return &n
}

// recordWithEntry holds a record and a one-entry journal in one allocation.
type recordWithEntry struct {
	rec   Record
	entry [1]JournalEntry
}

// Slot is a record that a store keeps as a Go value and changes in place
// under its own lock (memstore), applying the same rules as the functions
// above without copying the record on every write. A nil *Slot is an absent
// key.
//
// Aliasing: a record returned by a Slot never changes afterwards. Its fields
// are a copy; its Journal is either a fresh copy (after an acquired claim,
// [Slot.Copy]) or the slot's own array lent to the caller (a claim that
// found the record). A lent journal is copied before the slot next writes
// one of its entries. The slot's Result is never written in place either
// (a new result replaces the slice), but callers that hand a record to
// users still copy it: users may write to it.
type Slot struct {
	rec  Record
	lent bool // rec.Journal's array is held by a caller: copy before writing
	// pinned: some array of the slot's was lent, so the slot may not be
	// reused (see Free).
	pinned bool
	first  [1]JournalEntry // a new key's journal, in the slot's own allocation
}

// NewSlot claims an absent key in a new slot: it returns the slot to keep
// and the result. floor is as for [ApplyClaim]. A store that keeps dropped
// slots for reuse calls [Slot.ClaimNew] on one instead.
func NewSlot(req ClaimRequest, now time.Time, floor int64) (*Slot, ClaimResult) {
	s := new(Slot)
	return s, s.ClaimNew(req, now, floor)
}

// ClaimNew claims an absent key in s, a new slot or one that [Slot.Reset]
// made ready for reuse, and returns the result. floor is as for
// [ApplyClaim].
func (s *Slot) ClaimNew(req ClaimRequest, now time.Time, floor int64) ClaimResult {
	s.rec.Journal = s.first[:0:1]
	claim(&s.rec, false, req, now, false, floor)
	return s.acquired(now, false)
}

// Claim applies req to the slot's record at now, in place.
func (s *Slot) Claim(req ClaimRequest, now time.Time) ClaimResult {
	take, takeover := claimable(&s.rec, req, now)
	if !take {
		// Duplicates are the common case here: lend the journal rather
		// than copy it on every one.
		s.lent, s.pinned = true, true
		return ClaimResult{Record: s.rec, Now: now}
	}
	s.own()
	claim(&s.rec, true, req, now, takeover, 0)
	return s.acquired(now, takeover)
}

// acquired is the result of an acquired claim. The caller gets its own copy
// of the journal: the attempt's ending will write the slot's entry in place,
// and copying it now keeps the slot's journal in the slot's allocation.
func (s *Slot) acquired(now time.Time, takeover bool) ClaimResult {
	res := ClaimResult{Acquired: true, Takeover: takeover, Record: s.rec, Now: now}
	res.Record.Journal = slices.Clone(s.rec.Journal)
	return res
}

// own makes the slot the only holder of its journal's array.
func (s *Slot) own() {
	if s.lent {
		s.rec.Journal = slices.Clone(s.rec.Journal)
		s.lent = false
	}
}

// Finish ends the attempt req names, like [ApplyFinish], in place. On
// ErrLeaseLost it records the stale attempt's late finish, if any.
func (s *Slot) Finish(req FinishRequest, now time.Time) error {
	if s == nil {
		return ErrLeaseLost
	}
	if ok, late := held(&s.rec, req.Fence, req.AttemptID, now); !ok {
		if late && !IsNotRun(req.Reason) {
			s.annotateLate(req.Fence, req.AttemptID, now)
		}
		return ErrLeaseLost
	}
	s.own()
	finish(&s.rec, req, now)
	return nil
}

// Extend renews the lease of the attempt req names, like [ApplyExtend], in
// place, and returns the new LeaseUntil.
func (s *Slot) Extend(req ExtendRequest, now time.Time) (time.Time, error) {
	if s == nil {
		return time.Time{}, ErrLeaseLost
	}
	if ok, late := held(&s.rec, req.Fence, req.AttemptID, now); !ok {
		if late {
			s.annotateLate(req.Fence, req.AttemptID, now)
		}
		return time.Time{}, ErrLeaseLost
	}
	s.own()
	extend(&s.rec, req.Fence, req.Lease, now)
	return s.rec.LeaseUntil, nil
}

// Resolve applies an operator's decision, like [ApplyResolve], in place.
func (s *Slot) Resolve(r ResolveRequest, now time.Time) error {
	if s == nil {
		return ErrNotFound
	}
	if err := resolvable(&s.rec, r, now); err != nil {
		return err
	}
	s.own()
	resolve(&s.rec, r, now)
	return nil
}

func (s *Slot) annotateLate(fence int64, attemptID string, now time.Time) {
	if i := lateEntry(&s.rec, fence, attemptID); i >= 0 {
		s.own()
		s.rec.Journal[i].LateFinish = now
	}
}

// Reset clears a slot the store has dropped (deleted or swept its key) so
// that a later [Slot.ClaimNew] can reuse its memory, and reports whether it
// may: a slot that lent its journal to a caller is left to the garbage
// collector instead (Reset returns false), since the caller may still read
// it. Reusing slots spares the collector most of the bytes of a new record
// in a process that sweeps as many records as it creates. The slot must
// not be used after a false answer, nor before its ClaimNew after a true
// one.
func (s *Slot) Reset() bool {
	if s.pinned {
		return false
	}
	*s = Slot{}
	return true
}

// Peek returns the slot's record: read it, never modify it or keep it.
func (s *Slot) Peek() *Record { return &s.rec }

// Copy returns the slot's record with its own copies of the result and the
// journal, for callers that may do what they like with it.
func (s *Slot) Copy() Record {
	r := s.rec
	r.Result = append([]byte(nil), r.Result...)
	r.Journal = append([]JournalEntry(nil), r.Journal...)
	return r
}
