package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idem/internal/pgarray"
	"github.com/idemkit/idem/internal/pgtext"
	"github.com/idemkit/idem/store"
	"github.com/jackc/pgx/v5"
)

// Finish implements [store.Store]: one UPDATE conditioned on the attempt
// holding the key (its fence and attempt id, in_progress, not expired).
// When it updates nothing, a second statement annotates the stale
// attempt's journal entry with its late finish, unless req.Reason says
// the attempt never ran ([store.IsNotRun]). A request that
// [store.FinishRequest.Check] refuses is not sent.
func (s *Store) Finish(ctx context.Context, req store.FinishRequest) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	if err := req.Check(); err != nil {
		return err
	}
	return s.wrap("finish", s.finish(ctx, s.pool, req))
}

// finish runs the finishing statement of req's outcome (finishSQL) on q.
// When it updates nothing, the attempt no longer holds the key: a second
// statement annotates its journal entry with the late finish, unless the
// attempt never ran.
func (s *Store) finish(ctx context.Context, q querier, req store.FinishRequest) error {
	var (
		sql  string
		args = []any{req.Key, req.Fence, req.AttemptID}
	)
	switch req.Outcome {
	case store.OutcomeCompleted:
		sql, args = s.q.complete, append(args, req.Result, micros(req.Retention))
		if req.Reason != "" {
			sql, args = s.q.completeReason, append(args, pgtext.Storable(req.Reason))
		}
	case store.OutcomeFailed:
		sql, args = s.q.fail, append(args, pgtext.Storable(req.Reason), micros(req.Retention))
	case store.OutcomeReleased:
		sql, args = s.q.release, append(args, pgtext.Storable(req.Reason))
	case store.OutcomeAbandoned:
		sql, args = s.q.abandon, append(args, pgtext.Storable(req.Reason))
	default:
		return req.Check() // not reached: the callers checked req
	}
	tag, err := s.exec(ctx, q, sql, args...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		if store.IsNotRun(req.Reason) {
			return store.ErrLeaseLost // an attempt that never ran did not finish late
		}
		return s.late(ctx, q, req.Key, req.Fence, req.AttemptID)
	}
	return nil
}

// late annotates the journal entry of the attempt (fence, attemptID),
// which no longer holds key, and returns store.ErrLeaseLost (or the error
// that prevented the annotation: the caller learns of the lost lease
// either way, as a store error at worst).
func (s *Store) late(ctx context.Context, q querier, key string, fence int64, attemptID string) error {
	if _, err := s.exec(ctx, q, s.q.late, key, fence, attemptID); err != nil {
		return fmt.Errorf("%w (annotating the late finish failed: %w)", store.ErrLeaseLost, err)
	}
	return store.ErrLeaseLost
}

// Extend implements [store.Store]: one UPDATE conditioned as Finish's;
// when the attempt no longer holds the key, its journal entry is
// annotated with the late finish (a refused heartbeat proves the attempt
// was still running).
func (s *Store) Extend(ctx context.Context, req store.ExtendRequest) (time.Time, error) {
	if err := s.check(ctx); err != nil {
		return time.Time{}, err
	}
	if err := req.Check(); err != nil {
		return time.Time{}, err
	}
	var until time.Time
	err := s.queryRow(ctx, s.pool, s.q.extend, req.Key, req.Fence, req.AttemptID, micros(req.Lease)).Scan(&until)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, s.wrap("extend", s.late(ctx, s.pool, req.Key, req.Fence, req.AttemptID))
	}
	if err != nil {
		return time.Time{}, s.wrap("extend", err)
	}
	return until.UTC(), nil
}

// FinishBatch implements [store.BatchFinisher]: it does what
// [Store.Finish] does for each of reqs, in order. The completions (without
// a reason: what the Ledger sends) of distinct keys go in one statement,
// one round trip and one commit, for consumers that claimed a batch with
// [Store.ClaimBatch]; the other outcomes, rare in a batch, take a
// statement each, as Finish does. errs[i] is nil when reqs[i] was
// recorded and wraps [store.ErrLeaseLost] when its attempt no longer held
// the key (its journal entry is then annotated with the late finish, as
// Finish does). A request that [store.FinishRequest.Check] refuses fails
// the batch before anything is sent. err is a store failure: then which
// were recorded is unknown (a key that appears more than once takes a
// further statement for each repetition, run after the first commits).
func (s *Store) FinishBatch(ctx context.Context, reqs []store.FinishRequest) (errs []error, err error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	for _, r := range reqs {
		if err := r.Check(); err != nil {
			return nil, err
		}
	}
	errs, err = s.finishBatch(ctx, s.pool, reqs)
	if err != nil {
		return nil, s.wrap("finish batch", err)
	}
	return errs, nil
}

func (s *Store) finishBatch(ctx context.Context, q querier, reqs []store.FinishRequest) ([]error, error) {
	errs := make([]error, len(reqs))
	err := inRounds(len(reqs), func(i int) string { return reqs[i].Key }, func(round []int) error {
		return s.finishRound(ctx, q, reqs, round, errs)
	})
	if err != nil {
		return nil, err
	}
	return errs, nil
}

// finishRound finishes reqs[i] for each i of round (distinct keys): the
// completions in one completeBatchSQL statement (or finishSQL's, for one),
// the others one by one.
func (s *Store) finishRound(ctx context.Context, q querier, reqs []store.FinishRequest, round []int, errs []error) error {
	var batch []int
	for _, i := range round {
		if r := &reqs[i]; r.Outcome == store.OutcomeCompleted && r.Reason == "" {
			batch = append(batch, i)
			continue
		}
		if err := s.finish(ctx, q, reqs[i]); err != nil {
			if !errors.Is(err, store.ErrLeaseLost) {
				return err
			}
			errs[i] = err
		}
	}
	switch len(batch) {
	case 0:
		return nil
	case 1:
		// One statement either way: finishSQL's, without the arrays.
		i := batch[0]
		if err := s.finish(ctx, q, reqs[i]); err != nil {
			if !errors.Is(err, store.ErrLeaseLost) {
				return err
			}
			errs[i] = err
		}
		return nil
	}
	// By their UTF-8 bytes, as Go compares strings: the statement finds each
	// key's inputs by binary search over the keys (completeBatchSQL).
	slices.SortFunc(batch, func(a, b int) int {
		switch {
		case reqs[a].Key < reqs[b].Key:
			return -1
		case reqs[a].Key > reqs[b].Key:
			return 1
		}
		return 0
	})
	n := len(batch)
	keys, fences, ids, results, rets := make([]string, n), make([]int64, n), make([]string, n), make([][]byte, n), make([]int64, n)
	for j, i := range batch {
		r := &reqs[i]
		keys[j], fences[j], ids[j], results[j], rets[j] = r.Key, r.Fence, r.AttemptID, r.Result, micros(r.Retention)
	}
	rows, err := s.query(ctx, q, s.q.completeBatch, pgarray.Text(keys), pgarray.Int64s(fences), pgarray.Text(ids), results, pgarray.Int64s(rets))
	if err != nil {
		return err
	}
	done := make(map[string]bool, n)
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			rows.Close()
			return err
		}
		done[k] = true
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, i := range batch {
		if !done[reqs[i].Key] {
			errs[i] = store.ErrLeaseLost
		}
	}
	return nil
}
