package sqlitestore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/internal/dupshare"
	"github.com/idemkit/idem/store"
)

// A mutation decides, from a key's stored record (nil if absent; expired or
// not), the time and the fence floor (for the first fence of a new record,
// store.FirstFence), what to store (nil for nothing) and the outcome error
// (ErrLeaseLost, ErrNotFound, ...), which stands even when a record is
// stored (the late-finish note of a stale holder). It is a pure function of
// its arguments (the store package's state machine), so it can run again
// on a newer record; it also keeps what its caller needs to answer.
type mutation func(rec *store.Record, now time.Time, floor int64) (next *store.Record, err error)

// start says where apply gets the record its first decision is made on.
type start int

const (
	// fromRead reads the record on the read pool.
	fromRead start = iota
	// fromHeld uses the in_progress record this process wrote itself, if
	// it remembers one and it yields a write; otherwise it reads.
	fromHeld
	// fromAbsent assumes the key has no record, which is what a claim of a
	// new key finds: no read, one INSERT in the writer. The INSERT is also
	// conditional on the fence floor (see sqlInsert): the decision takes
	// the highest floor this process has seen, and the writer decides again
	// on the floor of its transaction if that one is higher.
	fromAbsent
)

// apply runs m on key's record and stores the result.
//
// It runs m first outside the writer, concurrently with other callers, on
// the record as from says: a read (most outcomes that write nothing, a
// duplicate, a busy key, a stale fence, end there), the record this process
// holds, or none. The rest hand the writer a ready-made write, which is
// conditional: an INSERT that does nothing if the key exists, or an UPDATE
// of the version m decided on. If the record is not that one (any more),
// the writer runs m again inside its transaction, on the record as it is
// (keyOp.run). Either way the record written is m's result for the record it
// replaces: every write is one atomic conditional write.
//
// An outcome that writes nothing is only ever decided on a read or inside
// the writer's transaction, never on a remembered or assumed record.
//
// When dupes is set (claims), apply tells it whether the key had a record.
func (s *Store) apply(ctx context.Context, key string, from start, dupes *dupshare.Share, m mutation) error {
	if s.closed.Load() {
		return errClosed
	}
	s.stats.ops.Add(1)
	now := s.now()
	it := keyOp{key: key, from: from, dupes: dupes, m: m}
	if err := it.prepare(s, now); err != nil {
		return err
	}
	if it.next == nil {
		rec, ver, err := s.read(ctx, key)
		if err != nil {
			return err
		}
		if dupes != nil {
			dupes.Observe(rec != nil)
		}
		it.rec, it.ver = rec, ver
		if it.next, it.merr = m(rec, now, it.floor); it.next == nil {
			return it.merr
		}
		it.from, it.dupes = fromRead, nil // observed on the read, not again in the writer
		if err := it.encode(s.cfg.implicit); err != nil {
			return err
		}
	}
	err := s.w.do(ctx, false, func(w rw, wnow time.Time) error {
		if err := it.run(w, wnow, now); err != nil {
			return err
		}
		return it.err
	})
	s.remember(&it, err)
	return err
}

// keyOp is one key's mutation, as apply and applyBatch run it: decided
// before the writer where it can be (prepare), then written in the
// writer's transaction (run).
type keyOp struct {
	key   string
	from  start // fromAbsent or fromHeld decide before the writer; fromRead decides in it
	dupes *dupshare.Share
	m     mutation

	// err is this key's outcome: nil, m's error (ErrLeaseLost, ErrNotFound)
	// or its record's corruption.
	err error

	rec     *store.Record // decided on before the writer; nil: absent
	ver     int64
	floor   int64 // the fence floor the decision before the writer took
	next    *store.Record
	merr    error
	args    []any
	written *store.Record
	wver    int64
	// redecided: m ran inside the writer (its answer replaced the one
	// decided before it), in this run or one the writer rolled back.
	redecided bool
}

// prepare decides it before the writer on the record its from names (the
// one this process holds, or none) and makes its ready-made write. It
// leaves next nil when that decides nothing to write: an outcome that
// writes nothing is decided on a read or in the writer, never on a
// remembered or assumed record.
func (it *keyOp) prepare(s *Store, now time.Time) error {
	it.floor = s.floorSeen.Load()
	switch it.from {
	case fromHeld:
		if h, ok := s.held.get(it.key); ok {
			it.rec, it.ver = h.rec, h.ver
			it.next, it.merr = it.m(it.rec, now, it.floor)
		}
	case fromAbsent:
		it.next, it.merr = it.m(nil, now, it.floor)
	}
	return it.encode(s.cfg.implicit)
}

// encode makes the ready-made write of next, if there is one, as the
// writer's rw.encode would (implicit: the store's WithImplicitJournal).
func (it *keyOp) encode(implicit bool) error {
	if it.next == nil {
		return nil
	}
	args, err := encodeRecord(it.next, implicit)
	if err != nil {
		return err
	}
	it.args = args
	if it.rec == nil {
		it.ver = insertVersion()
	}
	return nil
}

// run writes it in the writer's transaction: its ready-made write, a
// conditional one, if the record is still the one it was decided on (at
// decidedAt); otherwise m decided again on the record as it is, at now.
// The key's outcome (m's error, or its record's corruption) is it.err; a
// store error is returned. The writer may run it again after rolling back.
func (it *keyOp) run(w rw, now, decidedAt time.Time) error {
	it.written, it.err = nil, nil
	if it.next != nil {
		ok, err := write(w, it.rec == nil, it.args, it.ver)
		if err != nil {
			return err
		}
		if ok {
			if it.dupes != nil {
				it.dupes.Observe(false) // inserted (fromAbsent)
			}
			if it.redecided {
				// A run the writer rolled back decided m again in its
				// transaction, and m kept that answer: decide on rec
				// again, as written.
				it.next, it.merr = it.m(it.rec, decidedAt, it.floor)
			}
			it.written, it.wver, it.err = it.next, newVersion(it.rec == nil, it.ver), it.merr
			return nil
		}
	}
	it.redecided = true
	rec, ver, err := w.load(it.key)
	if err == nil {
		if it.dupes != nil {
			// As apply's read does; an insert that missed the floor found
			// no record.
			it.dupes.Observe(rec != nil)
		}
		it.written, it.wver, err = decideIn(w, it.key, rec, ver, it.m, now)
	}
	switch {
	case err == nil:
	case errors.Is(err, store.ErrLeaseLost), errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrCorrupt):
		it.err = err // this key's alone; nothing was written for a corrupt one
	default:
		return err
	}
	return nil
}

// remember keeps the in_progress record it wrote, for the holder's next
// write (fromHeld), or forgets the key.
func (s *Store) remember(it *keyOp, err error) {
	if err == nil && it.err == nil && it.written != nil && it.written.Status == store.StatusInProgress {
		s.held.put(it.key, it.written, it.wver)
	} else {
		s.held.forget(it.key)
	}
}

// applyBatch is apply for many keys in one operation of the writer, as
// the batch calls (ClaimBatch, FinishBatch) need: each key is decided
// first outside the writer on the record its from names (none, or the one
// this process holds) and handed over as a ready-made conditional write;
// a key whose write misses, or that needs its record read, is decided
// again inside the writer's transaction on the record as it is. Keys run
// in order, so a later one sees an earlier one's write. A store error
// undoes the batch's writes (the writer rolls back its transaction) and is
// returned; outcomes and corrupt records are each key's err.
func (s *Store) applyBatch(ctx context.Context, items []keyOp) error {
	if s.closed.Load() {
		return errClosed
	}
	s.stats.ops.Add(int64(len(items)))
	now := s.now()
	for i := range items {
		if err := items[i].prepare(s, now); err != nil {
			return err
		}
	}
	// Not an atomic op (a savepoint, whose statement journal copies every
	// page the batch touches): every error the batch returns is a
	// stmtError, on which the writer rolls back its whole transaction and
	// runs the other operations again.
	err := s.w.do(ctx, false, func(w rw, wnow time.Time) error {
		for i := range items {
			if err := items[i].run(w, wnow, now); err != nil {
				return asStmtError(err)
			}
		}
		return nil
	})
	for i := range items {
		s.remember(&items[i], err)
	}
	return err
}

// asStmtError makes err one on which the writer rolls back its whole
// transaction, as a batch's writes must be undone together.
func asStmtError(err error) error {
	if isStmtError(err) {
		return err
	}
	return &stmtError{"batch", err}
}

// decideIn runs m on rec, key's record (nil if absent) of version ver
// loaded in the same write transaction, and stores the result. It returns
// the record it wrote (nil if none) and its version.
func decideIn(w rw, key string, rec *store.Record, ver int64, m mutation, now time.Time) (*store.Record, int64, error) {
	var floor int64
	if rec == nil {
		// A new record's first fence clears the floor as this transaction
		// has it, so its insert cannot miss.
		var err error
		if floor, err = w.floor(); err != nil {
			return nil, 0, err
		}
	}
	next, merr := m(rec, now, floor)
	if next == nil {
		return nil, 0, merr
	}
	wver, err := storeIn(w, key, rec == nil, next, ver)
	if err != nil {
		return nil, 0, err
	}
	return next, wver, merr
}

// storeIn writes next, the new state of key's record, inside a write
// transaction: an insert when the key had no row (absent), else an update
// of the version ver that was loaded in the same transaction. It returns
// the version written.
func storeIn(w rw, key string, absent bool, next *store.Record, ver int64) (int64, error) {
	args, err := w.encode(next)
	if err != nil {
		return 0, err
	}
	if absent {
		ver = insertVersion()
	}
	ok, err := write(w, absent, args, ver)
	if err != nil {
		return 0, err
	}
	if !ok {
		// Nothing else writes inside our transaction.
		return 0, &stmtError{"write", fmt.Errorf("%q changed inside the write transaction", key)}
	}
	return newVersion(absent, ver), nil
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

func claimM(req store.ClaimRequest, res *store.ClaimResult) mutation {
	return func(rec *store.Record, now time.Time, floor int64) (*store.Record, error) {
		next, r := store.ApplyClaim(rec, req, now, floor)
		if next != nil {
			normalize(next)
			r.Record = *next
		}
		*res = r
		return next, nil
	}
}

func finishM(req store.FinishRequest) mutation {
	return func(rec *store.Record, now time.Time, _ int64) (*store.Record, error) {
		next, err := store.ApplyFinish(rec, req, now)
		if next != nil {
			normalize(next)
		}
		return next, err
	}
}

func extendM(req store.ExtendRequest, until *time.Time) mutation {
	return func(rec *store.Record, now time.Time, _ int64) (*store.Record, error) {
		next, err := store.ApplyExtend(rec, req, now)
		if next != nil {
			normalize(next)
			*until = next.LeaseUntil
		}
		return next, err
	}
}

func resolveM(r store.ResolveRequest, out *store.Record) mutation {
	return func(rec *store.Record, now time.Time, _ int64) (*store.Record, error) {
		next, err := store.ApplyResolve(rec, r, now)
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
	rec *store.Record // never modified: mutations copy
	ver int64
}

const maxHeld = 1 << 14

func (h *heldRecords) get(key string) (heldRecord, bool) {
	h.mu.Lock()
	r, ok := h.m[key]
	h.mu.Unlock()
	return r, ok
}

func (h *heldRecords) put(key string, rec *store.Record, ver int64) {
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
// Either way the deleted fence raises the fence floor (a trigger), so the
// key's next record starts above it.
func remove(w rw, key string, now time.Time) error {
	ok, err := w.remove(key, now.UnixMicro())
	if err != nil {
		return err
	}
	if !ok {
		return store.ErrNotFound
	}
	return nil
}

// noteFloor raises *seen to floor, a fence floor read in a transaction.
func noteFloor(seen *atomic.Int64, floor int64) {
	for {
		old := seen.Load()
		if floor <= old || seen.CompareAndSwap(old, floor) {
			return
		}
	}
}
