package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/store"
)

// Finish implements [store.Store]: one script (one round trip) that ends
// the attempt req names if it still holds the key (the record is
// in_progress with req's fence and attempt id, and has not expired). A
// refused call returns [store.ErrLeaseLost] and marks the stale attempt's
// open journal entry with its late finish, unless req.Reason says the
// attempt never ran ([store.NotRunReason]).
func (s *Store) Finish(ctx context.Context, req store.FinishRequest) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	if err := req.Check(); err != nil {
		return err
	}
	v, err := s.eval(ctx, scriptFinish, req.Key, s.finishArgs(req))
	if v == nil {
		return s.wrap("finish", req.Key, err)
	}
	if ferr := finishAnswer(req.Key, v); ferr != nil {
		return ferr
	}
	return s.wrap("finish", req.Key, err) // nil, or not replicated
}

// finishArgs are the finishing script's arguments for req (see
// finishScript).
func (s *Store) finishArgs(req store.FinishRequest) []any {
	notRun := argFlag[0]
	if store.IsNotRun(req.Reason) {
		notRun = argFlag[1]
	}
	var outcome any
	switch req.Outcome { // boxed once; Check refused any other
	case store.OutcomeCompleted:
		outcome = argCompleted
	case store.OutcomeFailed:
		outcome = argFailed
	case store.OutcomeReleased:
		outcome = argReleased
	default:
		outcome = argAbandoned
	}
	reason := argEmpty
	if req.Reason != "" {
		reason = req.Reason
	}
	return append(s.argsCap(7), req.Fence, req.AttemptID, outcome, req.Result, reason, micros(req.Retention), notRun)
}

// The outcomes and the empty reason as arguments, boxed once.
var (
	argCompleted any = string(store.OutcomeCompleted)
	argFailed    any = string(store.OutcomeFailed)
	argReleased  any = string(store.OutcomeReleased)
	argAbandoned any = string(store.OutcomeAbandoned)
	argEmpty     any = ""
)

// finishAnswer reads the finishing script's answer: nil when the attempt
// was ended (by this run or an earlier run of the same call),
// store.ErrLeaseLost, a *store.CorruptError, or an unexpected reply.
func finishAnswer(key string, v any) error {
	a, code, err := reply(v)
	switch {
	case err != nil:
		return fmt.Errorf("redisstore: finish %q: %w", key, err)
	case code == -1:
		return replyCorrupt(key, a)
	case code == 0:
		return store.ErrLeaseLost
	case code != 1 && code != 2:
		return fmt.Errorf("redisstore: finish %q: unexpected reply %v", key, v)
	}
	return nil
}

// FinishBatch implements [store.BatchFinisher]: the requests, of any
// outcome, are pipelined, one script each, all sent in one round trip (one
// per cluster node with [WithWait] on Redis Cluster), and run in order, so
// that a key named twice is finished twice (the second finds the first's
// write). Each is atomic on its own, with the same rules as
// [Store.Finish]: errs[i] is [store.ErrLeaseLost] when reqs[i]'s attempt
// no longer held the key, wraps [store.ErrInvalid] for a request Finish
// refuses (not sent), and wraps [store.ErrCorrupt] when its record cannot
// be decoded. When err is not nil (the connection failed mid-batch, or
// WithWait's replicas did not acknowledge), some requests may have been
// recorded.
func (s *Store) FinishBatch(ctx context.Context, reqs []store.FinishRequest) (errs []error, err error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	errs = make([]error, len(reqs))
	send := make([]int, 0, len(reqs))
	for i, r := range reqs {
		if errs[i] = r.Check(); errs[i] == nil {
			send = append(send, i)
		}
	}
	if len(send) == 0 {
		return errs, nil
	}
	groups, err := s.batchGroups(ctx, len(send), func(i int) string { return reqs[send[i]].Key })
	if err != nil {
		return nil, s.wrap("finish batch", "", err)
	}
	for c, idx := range groups {
		for j, i := range idx {
			idx[j] = send[i] // an index of reqs
		}
		err := s.pipeline(ctx, c, scriptFinish, idx,
			func(i int) (string, []any) { return s.rkey(reqs[i].Key), s.finishArgs(reqs[i]) },
			func(i int, v any, err error) error {
				if err != nil {
					errs[i] = err // this request's script was refused
					return nil
				}
				if _, _, rerr := reply(v); rerr != nil {
					return rerr
				}
				errs[i] = finishAnswer(reqs[i].Key, v)
				return nil
			})
		if err != nil {
			return nil, s.wrap("finish batch", "", err)
		}
	}
	return errs, nil
}

// Extend implements [store.Store]: one script that renews the lease of
// the attempt req names if it still holds the key. A refused call returns
// [store.ErrLeaseLost] and marks the stale attempt's open journal entry
// with its late finish.
func (s *Store) Extend(ctx context.Context, req store.ExtendRequest) (time.Time, error) {
	if err := s.check(ctx); err != nil {
		return time.Time{}, err
	}
	if err := req.Check(); err != nil {
		return time.Time{}, err
	}
	v, err := s.eval(ctx, scriptExtend, req.Key, s.args(req.Fence, req.AttemptID, micros(req.Lease)))
	if v == nil {
		return time.Time{}, s.wrap("extend", req.Key, err)
	}
	a, code, rerr := reply(v)
	switch {
	case rerr != nil:
		return time.Time{}, s.wrap("extend", req.Key, rerr)
	case code == -1:
		return time.Time{}, replyCorrupt(req.Key, a)
	case code == 0:
		return time.Time{}, store.ErrLeaseLost
	case code != 1 && code != 2:
		return time.Time{}, s.wrap("extend", req.Key, fmt.Errorf("unexpected reply %v", v))
	}
	until, terr := replyTime(a, 1)
	if terr != nil {
		return time.Time{}, s.wrap("extend", req.Key, terr)
	}
	if err != nil {
		return time.Time{}, s.wrap("extend", req.Key, err)
	}
	return until, nil
}
