package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem"
)

// Complete implements [idem.Store].
func (s *Store) Complete(ctx context.Context, key string, fence int64, result []byte, retention time.Duration) error {
	return s.finish(ctx, "complete", key, fence, idem.StatusCompleted, result, retention)
}

// Fail implements [idem.Store].
func (s *Store) Fail(ctx context.Context, key string, fence int64, reason string, retention time.Duration) error {
	return s.finish(ctx, "fail", key, fence, idem.StatusFailed, reason, retention)
}

// Release implements [idem.Store].
func (s *Store) Release(ctx context.Context, key string, fence int64, reason string) error {
	return s.finish(ctx, "release", key, fence, idem.StatusReleased, reason, 0)
}

// Abandon implements [idem.Store].
func (s *Store) Abandon(ctx context.Context, key string, fence int64, reason string) error {
	return s.finish(ctx, "abandon", key, fence, idem.StatusInProgress, reason, 0)
}

// finish runs the script that ends the attempt holding fence: one round
// trip. A refused call (another fence, another status) marks the stale
// attempt's journal entry with its late finish and returns
// idem.ErrLeaseLost.
func (s *Store) finish(ctx context.Context, op, key string, fence int64, st idem.Status, payload any, retention time.Duration) error {
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
		return idem.ErrLeaseLost
	case code != 1 && code != 2:
		return s.wrap(op, key, fmt.Errorf("unexpected reply %v", v))
	}
	return s.wrap(op, key, err) // nil, or not replicated
}

// Extend implements [idem.Store].
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
		return time.Time{}, idem.ErrLeaseLost
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
