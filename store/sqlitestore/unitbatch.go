package sqlitestore

import (
	"context"
	"errors"

	"github.com/idemkit/idem/store"
)

// ClaimBatchIn is [Store.ClaimBatch] inside a unit of work of the store's
// writer: ctx must be the context a [Store.WriteTx] function was given,
// and the claims are written in that unit's savepoint, so they commit with
// the function's own writes, or roll back with them. A queue in the same
// file claims the keys of the messages it receives this way, in the
// receive's unit (queue/sqlqueue's fused path). The rules of WriteTx
// apply: the claims run on the writer's goroutine, and the writer may run
// the function (and so these claims) again after rolling back. A request
// that [store.ClaimRequest.Check] refuses fails the call before anything
// is written; a store error is returned for the function to return, which
// rolls its savepoint back. Outside such a function it returns
// [ErrNotOnWriter].
func (s *Store) ClaimBatchIn(ctx context.Context, reqs []store.ClaimRequest) ([]store.ClaimResult, error) {
	if err := s.onWriter(ctx); err != nil {
		return nil, err
	}
	for _, req := range reqs {
		if err := req.Check(); err != nil {
			return nil, err
		}
	}
	out := make([]store.ClaimResult, len(reqs))
	from := fromAbsent
	if s.dupes.Often() {
		from = fromRead // decided in the writer, on the record as it is
	}
	items := make([]keyOp, len(reqs))
	for i, req := range reqs {
		items[i] = keyOp{key: req.Key, from: from, dupes: &s.dupes, m: claimM(req, &out[i])}
	}
	if err := s.applyIn(items); err != nil {
		return nil, err
	}
	for i, it := range items {
		if it.err != nil {
			out[i] = store.ClaimResult{Record: store.Record{Key: it.key}, Err: it.err}
		}
	}
	return out, nil
}

// FinishBatchIn is [Store.FinishBatch] inside a unit of work of the
// store's writer, as [Store.ClaimBatchIn] is ClaimBatch: the attempts'
// ends commit with the unit's own writes (a queue's acks of the messages
// they handled), or roll back with them. errs[i] is nil when reqs[i] was
// recorded in the unit and wraps [store.ErrLeaseLost] (or
// [store.ErrNotFound]) when its attempt no longer held the key; err is a
// store error for the function to return.
func (s *Store) FinishBatchIn(ctx context.Context, reqs []store.FinishRequest) (errs []error, err error) {
	if err := s.onWriter(ctx); err != nil {
		return nil, err
	}
	items := make([]keyOp, len(reqs))
	for i, req := range reqs {
		if err := req.Check(); err != nil {
			return nil, err
		}
		items[i] = keyOp{key: req.Key, from: fromHeld, m: finishM(req)}
	}
	if err := s.applyIn(items); err != nil {
		return nil, err
	}
	errs = make([]error, len(reqs))
	for i, it := range items {
		errs[i] = it.err
	}
	return errs, nil
}

// ErrNotOnWriter is returned by [Store.ClaimBatchIn] and
// [Store.FinishBatchIn] called with a context that is not a
// [Store.WriteTx] function's on this store.
var ErrNotOnWriter = errors.New("sqlitestore: ClaimBatchIn and FinishBatchIn run only inside the store's own WriteTx function (with its ctx)")

// onWriter checks that ctx is the context of a unit of work running on
// s's writer.
func (s *Store) onWriter(ctx context.Context) error {
	if s.closed.Load() {
		return errClosed
	}
	if ctx == nil || ctx.Value(onWriterKey{}) != s.w {
		return ErrNotOnWriter
	}
	return nil
}

// applyIn is applyBatch for a unit of work already running on the writer:
// each key decided before it where it can be, then written (or decided
// again on the record as it is) on the writer's connection, inside the
// unit's savepoint.
func (s *Store) applyIn(items []keyOp) error {
	s.stats.ops.Add(int64(len(items)))
	now := s.now()
	for i := range items {
		if err := items[i].prepare(s, now); err != nil {
			return err
		}
	}
	var err error
	s.w.raw(func(w *driverRW) error {
		for i := range items {
			if err = items[i].run(w, now, now); err != nil {
				return nil
			}
		}
		return nil
	})
	for i := range items {
		// A unit rolled back later leaves a remembered record that is not
		// the stored one: its holder's next write misses it and decides
		// again on the record as it is (the writes are conditional on the
		// version).
		s.remember(&items[i], err)
	}
	return err
}
