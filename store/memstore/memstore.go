// Package memstore is an store.Store that keeps records in process memory:
// for tests, and for a single process that accepts forgetting everything when
// it exits. It passes the same conformance suite as the durable stores.
//
// Records are sharded by key hash so that concurrent calls on different keys
// rarely contend. Each record is changed in place under its shard's lock
// (the store package: the same rules as every other store), never while a
// caller can see it: records handed out are snapshots. The memory of deleted
// and swept records is reused for new keys. The clock is time.Now unless
// [WithClock] says otherwise.
package memstore

import (
	"context"
	"hash/maphash"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/store"
)

const shards = 64

// Store is an in-memory store.Store. The zero value is not usable; call [New].
type Store struct {
	now    func() time.Time
	seed   maphash.Seed
	closed atomic.Bool
	shards [shards]shard
}

type shard struct {
	mu      sync.Mutex
	records map[string]*store.Slot
	// floor is the highest fence of a record the shard dropped (Delete,
	// Sweep): a key's new record starts above it (store.FirstFence), so
	// its fences never repeat even when the clock has not moved since.
	floor int64
	// spare holds slots of dropped records for new keys (at most
	// maxSpare): under the shard's lock, so reuse costs no atomic
	// operation, and most recently dropped first, while still in cache.
	spare []*store.Slot
	_     [8]byte // keep shards on separate cache lines
}

// maxSpare bounds each shard's spare slots: 64 shards × 128 × 512 bytes is
// at most 4 MiB kept after a sweep of a larger burst.
const maxSpare = 128

// newSlot returns a spare slot or a new one.
func (sh *shard) newSlot() *store.Slot {
	if n := len(sh.spare); n > 0 {
		s := sh.spare[n-1]
		sh.spare[n-1] = nil
		sh.spare = sh.spare[:n-1]
		return s
	}
	return new(store.Slot)
}

// drop removes key's record (slot) from the shard and keeps its slot for a
// new key if it may.
func (sh *shard) drop(key string, slot *store.Slot) {
	sh.floor = max(sh.floor, slot.Peek().Fence)
	delete(sh.records, key)
	if slot.Reset() && len(sh.spare) < maxSpare {
		sh.spare = append(sh.spare, slot)
	}
}

// Option configures a Store.
type Option func(*Store)

// WithClock sets the store's clock (default time.Now), so tests can make
// leases and retention pass without sleeping.
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// New returns an empty Store.
func New(opts ...Option) *Store {
	s := &Store{now: time.Now, seed: maphash.MakeSeed()}
	for _, o := range opts {
		o(s)
	}
	for i := range s.shards {
		s.shards[i].records = make(map[string]*store.Slot)
	}
	return s
}

var (
	_ store.Store        = (*Store)(nil)
	_ store.BatchClaimer = (*Store)(nil)
)

func (s *Store) shard(key string) *shard {
	return &s.shards[maphash.String(s.seed, key)%shards]
}

// with runs f on key's shard under its lock.
func (s *Store) with(ctx context.Context, key string, f func(sh *shard, now time.Time) error) error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return f(sh, s.now())
}

// Claim implements store.Store.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (res store.ClaimResult, err error) {
	if err := req.Check(); err != nil {
		return res, err
	}
	err = s.with(ctx, req.Key, func(sh *shard, now time.Time) error {
		if slot := sh.records[req.Key]; slot != nil {
			res = slot.Claim(req, now)
			// The slot may lend its journal (it copies before writing
			// it again); the result is copied because callers hand it to
			// users.
			res.Record.Result = append([]byte(nil), res.Record.Result...)
			return nil
		}
		slot := sh.newSlot()
		res = slot.ClaimNew(req, now, sh.floor)
		sh.records[req.Key] = slot
		return nil
	})
	return res, err
}

// ClaimBatch implements store.BatchClaimer: the claims are made in order,
// each as [Store.Claim] makes it. If one fails (ctx ended, or the store
// was closed, during the batch), ClaimBatch undoes the claims it had made
// and returns the error: a claim of a free key is released, a takeover is
// abandoned (left lapsed at once, as after a crash, so that the attempt it
// took over is met again), both with a reason made by [store.NotRunReason],
// as the Ledger does for a claim whose caller left.
func (s *Store) ClaimBatch(ctx context.Context, reqs []store.ClaimRequest) ([]store.ClaimResult, error) {
	out := make([]store.ClaimResult, len(reqs))
	for i, r := range reqs {
		res, err := s.Claim(ctx, r)
		if err != nil {
			s.undo(out[:i])
			return nil, err
		}
		out[i] = res
	}
	return out, nil
}

// undo ends the attempts of the claims of a failed batch: their callers
// never run them ([store.UndoClaim]). Errors are dropped (a closed store
// keeps nothing).
func (s *Store) undo(out []store.ClaimResult) {
	for _, r := range out {
		_ = store.UndoClaim(context.Background(), s, r, "the claim batch failed before its results reached the caller")
	}
}

// Finish implements store.Store.
func (s *Store) Finish(ctx context.Context, req store.FinishRequest) error {
	if err := req.Check(); err != nil {
		return err
	}
	if req.Outcome == store.OutcomeCompleted {
		req.Result = append([]byte(nil), req.Result...) // the caller keeps its slice
	}
	return s.with(ctx, req.Key, func(sh *shard, now time.Time) error {
		return sh.records[req.Key].Finish(req, now)
	})
}

// Extend implements store.Store.
func (s *Store) Extend(ctx context.Context, req store.ExtendRequest) (until time.Time, err error) {
	if err := req.Check(); err != nil {
		return until, err
	}
	err = s.with(ctx, req.Key, func(sh *shard, now time.Time) error {
		until, err = sh.records[req.Key].Extend(req, now)
		return err
	})
	return until, err
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, key string) (rec store.Record, err error) {
	err = s.with(ctx, key, func(sh *shard, now time.Time) error {
		slot := sh.records[key]
		if slot == nil || slot.Peek().Expired(now) {
			return store.ErrNotFound
		}
		rec = slot.Copy()
		return nil
	})
	return rec, err
}

// List implements store.Store.
func (s *Store) List(ctx context.Context, q store.ListQuery) ([]store.Record, error) {
	if s.closed.Load() {
		return nil, store.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := q.Check(); err != nil {
		return nil, err
	}
	limit := q.PageSize()
	now := s.now()
	var out []store.Record
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, slot := range sh.records {
			if q.Matches(slot.Peek(), now) {
				out = append(out, slot.Copy())
			}
		}
		sh.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return strings.Compare(out[i].Key, out[j].Key) < 0 })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Resolve implements store.Store.
func (s *Store) Resolve(ctx context.Context, r store.ResolveRequest) (rec store.Record, err error) {
	r.Result = append([]byte(nil), r.Result...) // the caller keeps its slice
	err = s.with(ctx, r.Key, func(sh *shard, now time.Time) error {
		slot := sh.records[r.Key]
		if err := slot.Resolve(r, now); err != nil {
			return err
		}
		rec = slot.Copy()
		return nil
	})
	return rec, err
}

// Delete implements store.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	return s.with(ctx, key, func(sh *shard, now time.Time) error {
		slot := sh.records[key]
		if slot == nil || slot.Peek().Expired(now) {
			return store.ErrNotFound
		}
		sh.drop(key, slot)
		return nil
	})
}

// Sweep implements store.Store.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	if s.closed.Load() {
		return 0, store.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	now := s.now()
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, slot := range sh.records {
			if n >= limit {
				break
			}
			if r := slot.Peek(); r.Expired(now) {
				sh.drop(k, slot)
				n++
			}
		}
		sh.mu.Unlock()
	}
	return n, nil
}

// Now implements store.Store.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	if s.closed.Load() {
		return time.Time{}, store.ErrClosed
	}
	return s.now(), nil
}

// Close implements store.Store. Records are dropped.
func (s *Store) Close() error {
	s.closed.Store(true)
	return nil
}
