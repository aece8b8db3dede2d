package sqlitestore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/transition"
)

// A mutation decides, from a key's stored record (nil if absent; expired or
// not) and the time, what to store (nil for nothing) and the outcome error
// (ErrLeaseLost, ErrNotFound, ...), which stands even when a record is
// stored (the late-finish note of a stale holder). It is a pure function of
// its arguments (the transition package), so it can run again on a newer
// record; it also keeps what its caller needs to answer.
type mutation func(rec *idem.Record, now time.Time) (next *idem.Record, err error)

// apply runs m on key's record and stores the result.
//
// It runs m first outside the writer, on a read of the record: most
// outcomes that write nothing (a duplicate, a busy key, a stale fence) end
// there, concurrently with other callers, and the rest hand the writer a
// ready-made write. That write is conditional: an INSERT that does nothing if
// the key exists, or an UPDATE of the version that was read. If the record
// changed in between, the writer runs m again inside its transaction, on the
// record as it is then (applyIn). Either way the record written is m's
// result for the record it replaces: every write is one atomic conditional
// write.
//
// When useHeld is set and this process wrote the key's in_progress record
// itself (a claim or an extend), m runs on that record instead of a read,
// provided it yields a write: the write's condition checks that the record
// is still the one remembered. An outcome that writes nothing is always
// decided on a read.
func (s *Store) apply(ctx context.Context, key string, useHeld bool, m mutation) error {
	if s.closed.Load() {
		return errClosed
	}
	s.stats.ops.Add(1)
	now := s.now()
	var (
		rec  *idem.Record
		ver  int64
		next *idem.Record
		merr error
	)
	if useHeld {
		if h, ok := s.held.get(key); ok {
			rec, ver = h.rec, h.ver
			next, merr = m(rec, now)
		}
	}
	if next == nil {
		var err error
		if rec, ver, err = s.read(ctx, key); err != nil {
			return err
		}
		if next, merr = m(rec, now); next == nil {
			return merr
		}
	}
	args, err := encodeRecord(next)
	if err != nil {
		return err
	}
	if rec == nil {
		ver = insertVersion()
	}
	var (
		written *idem.Record
		wver    int64
	)
	err = s.w.do(ctx, false, func(w rw, now time.Time) error {
		ok, err := write(w, rec == nil, args, ver)
		if err != nil {
			return err
		}
		if ok {
			written, wver = next, newVersion(rec == nil, ver)
			return merr
		}
		written, wver, err = applyIn(w, key, m, now)
		return err
	})
	switch {
	case err == nil && written != nil && written.Status == idem.StatusInProgress:
		s.held.put(key, written, wver)
	default:
		s.held.forget(key)
	}
	return err
}

// applyIn runs m on key's record inside a write transaction and stores the
// result. It returns the record it wrote (nil if none) and its version.
func applyIn(w rw, key string, m mutation, now time.Time) (*idem.Record, int64, error) {
	rec, ver, err := w.load(key)
	if err != nil {
		return nil, 0, err
	}
	next, merr := m(rec, now)
	if next == nil {
		return nil, 0, merr
	}
	args, err := encodeRecord(next)
	if err != nil {
		return nil, 0, err
	}
	if rec == nil {
		ver = insertVersion()
	}
	ok, err := write(w, rec == nil, args, ver)
	if err != nil {
		return nil, 0, err
	}
	if !ok {
		// Nothing else writes inside our transaction.
		return nil, 0, &stmtError{"write", fmt.Errorf("%q changed inside the write transaction", key)}
	}
	return next, newVersion(rec == nil, ver), merr
}

// newVersion is the version of the record written: ver itself when it was
// inserted, ver+1 when it replaced version ver.
func newVersion(inserted bool, ver int64) int64 {
	if inserted {
		return ver
	}
	return ver + 1
}

// insertVersion is the version of a row inserted for a key: random, so
// that a key deleted and inserted again does not repeat the versions a
// compare-and-set write may still hold from a read of the earlier row.
func insertVersion() int64 { return rand.Int64N(1 << 62) }

// write writes a record: an insert with version ver, or an update of
// version ver.
func write(w rw, insert bool, args []any, ver int64) (bool, error) {
	if insert {
		return w.insert(args, ver)
	}
	return w.update(args, ver)
}

// The mutations of the Store's calls. Each normalizes the record it returns
// to the stored precision, so that what a call returns equals what a later
// read returns.

func claimM(req idem.ClaimRequest, res *idem.ClaimResult) mutation {
	return func(rec *idem.Record, now time.Time) (*idem.Record, error) {
		next, r := transition.Claim(rec, req, now)
		if next != nil {
			normalize(next)
			r.Record = *next
		}
		*res = r
		return next, nil
	}
}

func finishM(fence int64, end transition.Ending) mutation {
	return func(rec *idem.Record, now time.Time) (*idem.Record, error) {
		next, err := transition.Finish(rec, fence, end, now)
		if next != nil {
			normalize(next)
		}
		return next, err
	}
}

func extendM(fence int64, lease time.Duration, until *time.Time) mutation {
	return func(rec *idem.Record, now time.Time) (*idem.Record, error) {
		next, err := transition.Extend(rec, fence, lease, now)
		if next != nil {
			normalize(next)
			*until = next.LeaseUntil
		}
		return next, err
	}
}

func resolveM(fence int64, r idem.Resolution, out *idem.Record) mutation {
	return func(rec *idem.Record, now time.Time) (*idem.Record, error) {
		next, err := transition.Resolve(rec, fence, r, now)
		if next != nil {
			normalize(next)
			*out = *next
		}
		return next, err
	}
}

// heldRecords remembers the in_progress records this process wrote (the
// attempts it holds), with their versions, so that completing or extending
// them needs no read. Every use is checked by the write's condition, so a
// stale entry (another process took the key over) costs only a retry inside
// the writer. It keeps at most maxHeld entries.
type heldRecords struct {
	mu sync.Mutex
	m  map[string]heldRecord
}

type heldRecord struct {
	rec *idem.Record // never modified: mutations copy
	ver int64
}

const maxHeld = 1 << 14

func (h *heldRecords) get(key string) (heldRecord, bool) {
	h.mu.Lock()
	r, ok := h.m[key]
	h.mu.Unlock()
	return r, ok
}

func (h *heldRecords) put(key string, rec *idem.Record, ver int64) {
	h.mu.Lock()
	if h.m == nil {
		h.m = make(map[string]heldRecord)
	}
	if _, ok := h.m[key]; !ok && len(h.m) >= maxHeld {
		for k := range h.m { // evict one, any
			delete(h.m, k)
			break
		}
	}
	h.m[key] = heldRecord{rec, ver}
	h.mu.Unlock()
}

func (h *heldRecords) forget(key string) {
	h.mu.Lock()
	delete(h.m, key)
	h.mu.Unlock()
}

// remove deletes key whatever its state; ErrNotFound if it is absent or
// expired. An expired record is left for Sweep: until then it keeps the
// key's fence growing, so a holder from before the expiry stays refused.
func remove(w rw, key string, now time.Time) error {
	ok, err := w.remove(key, now.UnixMicro())
	if err != nil {
		return err
	}
	if !ok {
		return idem.ErrNotFound
	}
	return nil
}
