package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idem/internal/pgtext"
	"github.com/idemkit/idem/store"
	"github.com/jackc/pgx/v5"
)

// Complete implements [store.Store]: one UPDATE conditioned on the fence; a
// refused (stale) holder's journal entry is annotated with its late finish
// in the same statement.
func (s *Store) Complete(ctx context.Context, key string, fence int64, result []byte, retention time.Duration) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	return s.wrap("complete", s.finish(ctx, s.pool, s.q.complete, key, fence, result, micros(retention)))
}

// Fail implements [store.Store].
func (s *Store) Fail(ctx context.Context, key string, fence int64, reason string, retention time.Duration) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	return s.wrap("fail", s.finish(ctx, s.pool, s.q.fail, key, fence, pgtext.Storable(reason), micros(retention)))
}

// Release implements [store.Store].
func (s *Store) Release(ctx context.Context, key string, fence int64, reason string) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	return s.wrap("release", s.finish(ctx, s.pool, s.q.release, key, fence, pgtext.Storable(reason)))
}

// Abandon implements [store.Store].
func (s *Store) Abandon(ctx context.Context, key string, fence int64, reason string) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	return s.wrap("abandon", s.finish(ctx, s.pool, s.q.abandon, key, fence, pgtext.Storable(reason)))
}

// finish runs one of the finishing statements (finishSQL) on q. When it
// updates nothing, the attempt no longer holds the key: a second statement
// annotates its journal entry with the late finish.
func (s *Store) finish(ctx context.Context, q querier, sql, key string, fence int64, args ...any) error {
	tag, err := s.exec(ctx, q, sql, append([]any{key, fence}, args...)...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return s.late(ctx, q, key, fence)
	}
	return nil
}

// late annotates the journal entry of fence, which no longer holds key,
// and returns store.ErrLeaseLost (or the error that prevented the
// annotation: the caller learns of the lost lease either way, as a store
// error at worst).
func (s *Store) late(ctx context.Context, q querier, key string, fence int64) error {
	if _, err := s.exec(ctx, q, s.q.late, key, fence); err != nil {
		return fmt.Errorf("%w (annotating the late finish failed: %w)", store.ErrLeaseLost, err)
	}
	return store.ErrLeaseLost
}

// Extend implements [store.Store].
func (s *Store) Extend(ctx context.Context, key string, fence int64, lease time.Duration) (time.Time, error) {
	if err := s.check(ctx); err != nil {
		return time.Time{}, err
	}
	var until time.Time
	err := s.queryRow(ctx, s.pool, s.q.extend, key, fence, micros(lease)).Scan(&until)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, s.wrap("extend", s.late(ctx, s.pool, key, fence))
	}
	if err != nil {
		return time.Time{}, s.wrap("extend", err)
	}
	return until.UTC(), nil
}

// Completion is one attempt's result for [Store.CompleteBatch].
type Completion = store.Completion

// CompleteBatch implements [store.BatchCompleter]: it does what
// [Store.Complete] does for each of cs, in one
// statement: one round trip and one commit for the whole batch, for
// consumers that claimed a batch with [Store.ClaimBatch]. errs[i] is nil
// when cs[i] was recorded and [store.ErrLeaseLost] when its attempt no
// longer held the key (its journal entry is then annotated with the late
// finish, as Complete does). err is a store failure: then nothing was
// recorded, unless a key appears more than once in cs (each repetition
// takes a further statement, run after the first commits).
func (s *Store) CompleteBatch(ctx context.Context, cs []Completion) (errs []error, err error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	errs = make([]error, len(cs))
	err = inRounds(len(cs), func(i int) string { return cs[i].Key }, func(round []int) error {
		return s.completeRound(ctx, cs, round, errs)
	})
	if err != nil {
		return nil, s.wrap("complete batch", err)
	}
	return errs, nil
}

func (s *Store) completeRound(ctx context.Context, cs []Completion, round []int, errs []error) error {
	// By their UTF-8 bytes, as Go compares strings: the statement finds each
	// key's inputs by binary search over the keys (completeBatchSQL).
	slices.SortFunc(round, func(a, b int) int {
		switch {
		case cs[a].Key < cs[b].Key:
			return -1
		case cs[a].Key > cs[b].Key:
			return 1
		}
		return 0
	})
	n := len(round)
	keys, fences, results, rets := make([]string, n), make([]int64, n), make([][]byte, n), make([]int64, n)
	for j, i := range round {
		keys[j], fences[j], results[j], rets[j] = cs[i].Key, cs[i].Fence, cs[i].Result, micros(cs[i].Retention)
	}
	rows, err := s.query(ctx, s.pool, s.q.completeBatch, keys, fences, results, rets)
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
	for _, i := range round {
		if !done[cs[i].Key] {
			errs[i] = store.ErrLeaseLost
		}
	}
	return nil
}
