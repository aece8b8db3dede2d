package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/store"
	"github.com/redis/go-redis/v9"
)

// Get implements [store.Store]: one script that reads the hash and the
// server's clock. An expired record is [store.ErrNotFound], whether or not
// Redis has dropped it yet.
func (s *Store) Get(ctx context.Context, key string) (store.Record, error) {
	if err := s.check(ctx); err != nil {
		return store.Record{}, err
	}
	v, err := scriptGet.Run(ctx, s.client, []string{s.rkey(key)}, s.readArgs()...).Result()
	if err != nil {
		return store.Record{}, s.wrap("get", key, err)
	}
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return store.Record{}, s.wrap("get", key, fmt.Errorf("unexpected reply %v", v))
	}
	now, err := replyTime(a, 0)
	if err != nil {
		return store.Record{}, s.wrap("get", key, err)
	}
	h, err := replyHash(a, 1)
	if err != nil {
		return store.Record{}, s.wrap("get", key, err)
	}
	if len(h) == 0 {
		return store.Record{}, store.ErrNotFound
	}
	rec, err := decode(key, h)
	if err != nil {
		return store.Record{}, err
	}
	if rec.Expired(now) {
		return store.Record{}, store.ErrNotFound
	}
	return rec, nil
}

// Now implements [store.Store]: the server's clock (Redis TIME).
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	if err := s.check(ctx); err != nil {
		return time.Time{}, err
	}
	t, err := s.client.Time(ctx).Result()
	if err != nil {
		return time.Time{}, s.wrap("now", "", err)
	}
	return fromMicros(t.UnixMicro() + s.offset()), nil
}

// Resolve implements [store.Store]: one script that checks r's conditions
// (its fence, attempt id, in progress, lapsed), bumps the fence and
// records the decision.
func (s *Store) Resolve(ctx context.Context, r store.ResolveRequest) (store.Record, error) {
	if err := s.check(ctx); err != nil {
		return store.Record{}, err
	}
	key := r.Key
	done, inProgress, lapsed := argFlag[0], argFlag[0], argFlag[0]
	if r.InProgress {
		inProgress = argFlag[1]
	}
	if r.Lapsed {
		lapsed = argFlag[1]
	}
	ret := r.Retention
	if r.Done {
		done = argFlag[1]
		if ret <= 0 {
			ret = store.DefaultRetention
		}
	}
	v, err := s.eval(ctx, scriptResolve, key, s.args(r.Fence, r.AttemptID, done, r.Result, r.Reason, micros(ret), r.By, inProgress, lapsed))
	if v == nil {
		return store.Record{}, s.wrap("resolve", key, err)
	}
	a, code, rerr := reply(v)
	switch {
	case rerr != nil:
		return store.Record{}, s.wrap("resolve", key, rerr)
	case code == -1:
		return store.Record{}, replyCorrupt(key, a)
	case code == 0:
		return store.Record{}, store.ErrNotFound
	case code == 2:
		return store.Record{}, store.ErrLeaseLost
	case code != 1:
		return store.Record{}, s.wrap("resolve", key, fmt.Errorf("unexpected reply %v", v))
	}
	h, herr := replyHash(a, 2)
	if herr != nil {
		return store.Record{}, s.wrap("resolve", key, herr)
	}
	rec, derr := decode(key, h)
	if derr != nil {
		return store.Record{}, derr
	}
	if err != nil {
		return store.Record{}, s.wrap("resolve", key, err) // not replicated
	}
	return rec, nil
}

// Delete implements [store.Store]: one script that deletes the hash unless
// it is absent or expired ([store.ErrNotFound]). A record that cannot be
// decoded is deleted too: that is how an operator gets rid of one.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	v, err := s.eval(ctx, scriptDelete, key, s.readArgs())
	if v == nil {
		return s.wrap("delete", key, err)
	}
	if n, ok := v.(int64); ok && n == 0 {
		return store.ErrNotFound
	}
	return s.wrap("delete", key, err)
}

// scanCount is the COUNT hint of the SCANs of List and Sweep, and the
// size of their pipelines.
const scanCount = 1000

// List implements [store.Store]. Redis has no index of the store's keys:
// List SCANs every key of the database that matches the prefix (on every
// master of a cluster; q.Prefix narrows the SCAN's MATCH pattern), keeps
// those after q.After, sorts them byte-wise, and then reads records in
// that order, in pipelines of 1000, until it has q.Limit that match q's
// filters (status, lapsed, indeterminate, updated time, checked in Go by
// [store.ListQuery.Matches]). Its cost therefore grows
// with the number of records under the prefix (about a second per million
// on one server, and memory for their keys), whatever the query: it is
// for operators (`idem ls`), not for a hot path. A record that cannot be
// decoded fails the call with a *store.CorruptError naming its key.
//
// (A sorted set of keys would make List cheap, but keeping it in the same
// atomic step as each record's script would put every key in one slot of
// a cluster; the store keeps its single-key scripts instead.)
func (s *Store) List(ctx context.Context, q store.ListQuery) ([]store.Record, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	if err := q.Check(); err != nil {
		return nil, err
	}
	limit := q.PageSize()
	now, err := s.Now(ctx)
	if err != nil {
		return nil, err
	}
	var keys []string
	err = s.scan(ctx, q.Prefix, func(_ context.Context, _ redis.Cmdable, batch []string) error {
		for _, rk := range batch {
			if k := rk[len(s.cfg.prefix):]; k > q.After && strings.HasPrefix(k, q.Prefix) {
				keys = append(keys, k)
			}
		}
		return nil
	})
	if err != nil {
		return nil, s.wrap("list", "", err)
	}
	slices.Sort(keys)
	keys = slices.Compact(keys) // SCAN may return a key twice
	var out []store.Record
	for len(keys) > 0 && len(out) < limit {
		n := min(len(keys), scanCount, 2*(limit-len(out))+16)
		batch := keys[:n]
		keys = keys[n:]
		pipe := s.client.Pipeline()
		cmds := make([]*redis.MapStringStringCmd, len(batch))
		for i, k := range batch {
			cmds[i] = pipe.HGetAll(ctx, s.rkey(k))
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, s.wrap("list", "", err)
		}
		for i, k := range batch {
			m := cmds[i].Val()
			if len(m) == 0 {
				continue // deleted meanwhile
			}
			flat := make([]any, 0, 2*len(m))
			for f, v := range m {
				flat = append(flat, f, v)
			}
			rec, err := decode(k, flat)
			if err != nil {
				return nil, err
			}
			if !q.Matches(&rec, now) {
				continue
			}
			out = append(out, rec)
			if len(out) == limit {
				break
			}
		}
	}
	return out, nil
}

// Sweep implements [store.Store]. Redis drops a record by itself once its
// retention and the keep-expired period ([WithKeepExpired]) have passed;
// Sweep deletes records whose retention has passed before that. It SCANs
// the prefix (on every master of a cluster), reads the expiry of each key
// found, and deletes those that have expired, each with a script that
// checks the expiry again, until it has deleted limit. Like [Store.List],
// each call costs a SCAN of the records under the prefix.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	if err := s.check(ctx); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, nil
	}
	now, err := s.Now(ctx)
	if err != nil {
		return 0, err
	}
	deleted := 0
	errEnough := errors.New("enough")
	err = s.scan(ctx, "", func(ctx context.Context, c redis.Cmdable, batch []string) error {
		pipe := c.Pipeline()
		exs := make([]*redis.StringCmd, len(batch))
		for i, rk := range batch {
			exs[i] = pipe.HGet(ctx, rk, "ex")
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		var expired []string
		for i, rk := range batch {
			if ex, err := exs[i].Int64(); err == nil && !now.Before(fromMicros(ex)) {
				expired = append(expired, rk)
			}
		}
		expired = expired[:min(len(expired), limit-deleted)]
		if len(expired) == 0 {
			return nil
		}
		pipe = c.Pipeline()
		dels := make([]*redis.Cmd, len(expired))
		for i, rk := range expired {
			dels[i] = scriptSweep.EvalSha(ctx, pipe, []string{rk}, s.readArgs()...)
		}
		_, _ = pipe.Exec(ctx)
		for i, rk := range expired {
			n, err := dels[i].Int64()
			if isNoScript(err) {
				n, err = scriptSweep.Run(ctx, c, []string{rk}, s.readArgs()...).Int64()
			}
			if err != nil {
				return err
			}
			deleted += int(n)
		}
		if deleted >= limit {
			return errEnough
		}
		return nil
	})
	if err != nil && !errors.Is(err, errEnough) {
		return deleted, s.wrap("sweep", "", err)
	}
	return deleted, nil
}

// scan calls f with the keys under the prefix whose record keys begin
// with keyPrefix ("" for all), in batches, on the client of the node that
// holds them.
func (s *Store) scan(ctx context.Context, keyPrefix string, f func(ctx context.Context, c redis.Cmdable, batch []string) error) error {
	match := globEscape(s.cfg.prefix+keyPrefix) + "*"
	node := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for {
			batch, next, err := c.Scan(ctx, cursor, match, scanCount).Result()
			if err != nil {
				return err
			}
			if len(batch) > 0 {
				if err := f(ctx, c, batch); err != nil {
					return err
				}
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	var nodes []*redis.Client
	var mu sync.Mutex
	collect := func(_ context.Context, m *redis.Client) error {
		mu.Lock()
		nodes = append(nodes, m)
		mu.Unlock()
		return nil
	}
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		if err := c.ForEachMaster(ctx, collect); err != nil {
			return err
		}
	case *redis.Ring:
		if err := c.ForEachShard(ctx, collect); err != nil {
			return err
		}
	default:
		return node(ctx, s.client)
	}
	// One node at a time: f need not be safe for concurrent use.
	for _, m := range nodes {
		if err := node(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

// globEscape escapes the characters that SCAN's MATCH pattern reads as
// wildcards.
func globEscape(p string) string {
	var b strings.Builder
	for i := range len(p) {
		switch p[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(p[i])
	}
	return b.String()
}
