package pgstore

import (
	"context"
	"errors"
	"time"

	"github.com/idemkit/idem/internal/pgtext"
	"github.com/idemkit/idem/store"
	"github.com/jackc/pgx/v5"
)

// Get implements [store.Store].
func (s *Store) Get(ctx context.Context, key string) (store.Record, error) {
	if err := s.check(ctx); err != nil {
		return store.Record{}, err
	}
	var raw rawRecord
	err := s.queryRow(ctx, s.pool, s.q.get, key).Scan(raw.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Record{}, store.ErrNotFound
	}
	if err != nil {
		return store.Record{}, s.wrap("get", err)
	}
	return raw.record()
}

// List implements [store.Store]. Records come in key order, compared byte by
// byte. A record that cannot be decoded fails the whole call with a
// *store.CorruptError naming its key.
//
// List(Stuck), List(Indeterminate) and List(Status in_progress) read the
// partial index of in_progress rows, so they stay cheap on a large table:
// their cost grows with the number of running and lapsed attempts, not
// with the number of records. The other queries walk the primary key from
// q.After (or the key range of q.Prefix) and stop at q.Limit matches: a
// filter that few records match (failed, released, an UpdatedAfter or
// UpdatedBefore bound; none has an index) reads the records it passes
// over.
func (s *Store) List(ctx context.Context, q store.ListQuery) ([]store.Record, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	if err := q.Check(); err != nil {
		return nil, err
	}
	if !pgtext.Valid(q.Prefix) {
		return nil, nil // no key (valid text) begins with it
	}
	sql, args := s.q.listSQL(q)
	rows, err := s.query(ctx, s.pool, sql, args...)
	if err != nil {
		return nil, s.wrap("list", err)
	}
	defer rows.Close()
	var out []store.Record
	for rows.Next() {
		var raw rawRecord
		if err := rows.Scan(raw.dest()...); err != nil {
			return nil, s.wrap("list", err)
		}
		rec, err := raw.record()
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap("list", err)
	}
	return out, nil
}

// Resolve implements [store.Store]: one UPDATE, conditioned on r's
// conditions, that bumps the fence and either annotates the journal entry
// of the attempt it decides or appends an entry for the resolution. When
// it updates nothing, a second statement (on this path only) tells
// [store.ErrNotFound] from [store.ErrLeaseLost].
func (s *Store) Resolve(ctx context.Context, r store.ResolveRequest) (store.Record, error) {
	if err := s.check(ctx); err != nil {
		return store.Record{}, err
	}
	var result []byte
	if r.Done {
		result = r.Result
		if r.Retention <= 0 {
			r.Retention = store.DefaultRetention
		}
	}
	var raw rawRecord
	err := s.queryRow(ctx, s.pool, s.q.resolve, r.Key, r.Done, result, pgtext.Storable(r.Reason), micros(r.Retention), pgtext.Storable(r.By),
		r.Fence, r.AttemptID, r.InProgress, r.Lapsed).Scan(raw.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		var exists bool
		if err := s.queryRow(ctx, s.pool, s.q.exists, r.Key).Scan(&exists); err != nil {
			return store.Record{}, s.wrap("resolve", err)
		}
		if exists {
			return store.Record{}, store.ErrLeaseLost
		}
		return store.Record{}, store.ErrNotFound
	}
	if err != nil {
		return store.Record{}, s.wrap("resolve", err)
	}
	return raw.record()
}

// Delete implements [store.Store].
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	tag, err := s.exec(ctx, s.pool, s.q.delete, key)
	if err != nil {
		return s.wrap("delete", err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}

// Sweep implements [store.Store]: one DELETE of at most limit expired rows,
// oldest first, found through the index on expires_at and locked with FOR
// UPDATE SKIP LOCKED, so that concurrent sweepers share the work without
// waiting for each other and a sweep never waits for a claim. Each call is
// one short transaction holding the locks of at most limit rows; callers
// loop until it returns 0 (a few thousand rows per call is a good size).
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	if err := s.check(ctx); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, nil
	}
	tag, err := s.exec(ctx, s.pool, s.q.sweep, limit)
	if err != nil {
		return 0, s.wrap("sweep", err)
	}
	return int(tag.RowsAffected()), nil
}

// Now implements [store.Store]: the server's clock (statement_timestamp()).
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	if err := s.check(ctx); err != nil {
		return time.Time{}, err
	}
	var now time.Time
	if err := s.pool.QueryRow(ctx, s.q.now).Scan(&now); err != nil {
		return time.Time{}, s.wrap("now", err)
	}
	return now.UTC(), nil
}
