package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/store"
)

// Complete implements [store.Store].
func (s *Store) Complete(ctx context.Context, key string, fence int64, result []byte, retention time.Duration) error {
	return s.finish(ctx, "complete", key, fence, store.StatusCompleted, result, retention)
}

// Fail implements [store.Store].
func (s *Store) Fail(ctx context.Context, key string, fence int64, reason string, retention time.Duration) error {
	return s.finish(ctx, "fail", key, fence, store.StatusFailed, reason, retention)
}

// Release implements [store.Store].
func (s *Store) Release(ctx context.Context, key string, fence int64, reason string) error {
	return s.finish(ctx, "release", key, fence, store.StatusReleased, reason, 0)
}

// Abandon implements [store.Store].
func (s *Store) Abandon(ctx context.Context, key string, fence int64, reason string) error {
	return s.finish(ctx, "abandon", key, fence, store.StatusInProgress, reason, 0)
}

// CompleteBatch implements [store.BatchCompleter]: the completions are
// pipelined, one script per completion, all sent in one round trip (one per
// cluster node with [WithWait] on Redis Cluster). Each is atomic on its own,
// with the same rules as [Store.Complete]: errs[i] is [store.ErrLeaseLost]
// when cs[i]'s attempt no longer held the key, and wraps [store.ErrCorrupt]
// when its record cannot be decoded. When err is not nil (the
// connection failed mid-batch, or WithWait's replicas did not acknowledge),
// some completions may have been recorded.
func (s *Store) CompleteBatch(ctx context.Context, cs []store.Completion) (errs []error, err error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	errs = make([]error, len(cs))
	if len(cs) == 0 {
		return errs, nil
	}
	groups, err := s.batchGroups(ctx, len(cs), func(i int) string { return cs[i].Key })
	if err != nil {
		return nil, s.wrap("complete batch", "", err)
	}
	for c, idx := range groups {
		err := s.pipeline(ctx, c, scriptFinish, idx,
			func(i int) (string, []any) {
				return s.rkey(cs[i].Key), s.args(cs[i].Fence, string(store.StatusCompleted), cs[i].Result, micros(cs[i].Retention))
			},
			func(i int, v any, err error) error {
				if err != nil {
					errs[i] = err // this completion's script was refused
					return nil
				}
				a, code, rerr := reply(v)
				switch {
				case rerr != nil:
					return rerr
				case code == -1:
					errs[i] = replyCorrupt(cs[i].Key, a)
				case code == 0:
					errs[i] = store.ErrLeaseLost
				case code != 1 && code != 2:
					return fmt.Errorf("unexpected reply %v", v)
				}
				return nil
			})
		if err != nil {
			return nil, s.wrap("complete batch", "", err)
		}
	}
	return errs, nil
}

// finish runs the script that ends the attempt holding fence: one round
// trip. A refused call (another fence, another status) marks the stale
// attempt's journal entry with its late finish and returns
// store.ErrLeaseLost.
func (s *Store) finish(ctx context.Context, op, key string, fence int64, st store.Status, payload any, retention time.Duration) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	v, err := s.eval(ctx, scriptFinish, key, s.args(fence, string(st), payload, micros(retention)))
	if v == nil {
		return s.wrap(op, key, err)
	}
	a, code, rerr := reply(v)
	switch {
	case rerr != nil:
		return s.wrap(op, key, rerr)
	case code == -1:
		return replyCorrupt(key, a)
	case code == 0:
		return store.ErrLeaseLost
	case code != 1 && code != 2:
		return s.wrap(op, key, fmt.Errorf("unexpected reply %v", v))
	}
	return s.wrap(op, key, err) // nil, or not replicated
}

// Extend implements [store.Store].
func (s *Store) Extend(ctx context.Context, key string, fence int64, lease time.Duration) (time.Time, error) {
	if err := s.check(ctx); err != nil {
		return time.Time{}, err
	}
	v, err := s.eval(ctx, scriptExtend, key, s.args(fence, micros(lease)))
	if v == nil {
		return time.Time{}, s.wrap("extend", key, err)
	}
	a, code, rerr := reply(v)
	switch {
	case rerr != nil:
		return time.Time{}, s.wrap("extend", key, rerr)
	case code == -1:
		return time.Time{}, replyCorrupt(key, a)
	case code == 0:
		return time.Time{}, store.ErrLeaseLost
	case code != 1 && code != 2:
		return time.Time{}, s.wrap("extend", key, fmt.Errorf("unexpected reply %v", v))
	}
	until, terr := replyTime(a, 1)
	if terr != nil {
		return time.Time{}, s.wrap("extend", key, terr)
	}
	if err != nil {
		return time.Time{}, s.wrap("extend", key, err)
	}
	return until, nil
}
