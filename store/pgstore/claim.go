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

// maxClaimRuns bounds how many times a claim runs again because its key
// changed under it (see claimSQL). Each run again means another
// transaction committed the key meanwhile, so this is reached only under
// pathological contention.
const maxClaimRuns = 32

var errContended = errors.New("pgstore: the key kept changing under the claim")

// Claim implements [store.Store]: one INSERT ... ON CONFLICT DO UPDATE ...
// WHERE <claimable> statement (see the package doc). A request that
// [store.ClaimRequest.Check] refuses is not sent.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if err := s.check(ctx); err != nil {
		return store.ClaimResult{}, err
	}
	if err := req.Check(); err != nil {
		return store.ClaimResult{}, err
	}
	res, err := s.claimOne(ctx, s.pool, req)
	if err != nil {
		return store.ClaimResult{}, s.wrap("claim", err)
	}
	return res, nil
}

// claimOne claims req, which its caller checked, on q.
func (s *Store) claimOne(ctx context.Context, q querier, req store.ClaimRequest) (store.ClaimResult, error) {
	args := []any{req.Key, pgtext.Storable(req.Owner), pgtext.Storable(req.Correlation), req.Policy.String(),
		micros(req.Lease), micros(req.Retention), pgtext.Storable(req.Fingerprint), req.TakeLapsed, req.AttemptID}
	for range maxClaimRuns {
		rows, err := s.query(ctx, q, s.q.claim, args...)
		if err != nil {
			return store.ClaimResult{}, err
		}
		var (
			res   store.ClaimResult
			found bool
			again bool
		)
		for rows.Next() {
			r, stale, _, err := scanClaim(rows)
			if err != nil {
				rows.Close()
				return store.ClaimResult{}, err
			}
			res, found, again = r, true, stale
		}
		if err := rows.Err(); err != nil {
			return store.ClaimResult{}, err
		}
		if found && !again {
			return res, nil
		}
		s.reruns.Add(1)
	}
	return store.ClaimResult{}, errContended
}

// scanClaim reads one row of claimSQL or claimBatchSQL. stale reports a
// row that was not acquired although the statement's snapshot found it
// claimable: the claim must run again; inserted, a row the statement
// inserted (the key had none): a new record, whose fence is the
// statement's clock (store.FirstFence). The caller checks that the row's
// key is one it asked for.
func scanClaim(rows pgx.Rows) (res store.ClaimResult, stale, inserted bool, err error) {
	var (
		raw                 rawRecord
		acquired, claimable bool
		now                 time.Time
	)
	if err := rows.Scan(raw.dest(&acquired, &claimable, &now, &inserted)...); err != nil {
		return res, false, false, err
	}
	if !acquired && claimable {
		return res, true, false, nil
	}
	if inserted && (raw.fence != store.FirstFence(now, 0) || raw.attempt != 1) {
		return res, false, false, fmt.Errorf("pgstore: claim returned an unexpected row for %q (fence %d, attempt %d)", raw.key, raw.fence, raw.attempt)
	}
	rec, err := raw.record()
	if err != nil {
		res.Record.Key = raw.key // the caller can charge the failure to this key
		return res, false, false, err
	}
	res = store.ClaimResult{Acquired: acquired, Record: rec, Now: now.UTC()}
	if acquired && len(rec.Journal) > 0 {
		// The statement marked the new entry when it took over.
		res.Takeover = rec.Journal[len(rec.Journal)-1].Takeover
	}
	return res, false, inserted, nil
}

// ClaimBatch implements [store.BatchClaimer]: the requests are claimed with
// the same rules as [Store.Claim], in one statement (one round trip),
// except when most recent batches had only new keys and this one has a
// key with a row: then in two (see the package doc).
// Results are in request order. A request that [store.ClaimRequest.Check]
// refuses fails the batch before anything is sent. A key that appears more than once is
// claimed again, after its first claim, by a further statement for each
// repetition, so that every request sees the record as the earlier ones
// left it. The claims of one statement commit together; if a later
// statement fails (or ctx ends between statements), ClaimBatch returns
// the error and undoes the claims it had acquired before it (a claim of
// a free key is released, a takeover abandoned, left lapsed at once; both
// as not run, see [store.NotRunReason]); a key it cannot undo (the
// database gone) stays claimed until its lease passes.
func (s *Store) ClaimBatch(ctx context.Context, reqs []store.ClaimRequest) ([]store.ClaimResult, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	for _, r := range reqs {
		if err := r.Check(); err != nil {
			return nil, err
		}
	}
	out, err := s.claimBatch(ctx, s.pool, reqs, true)
	if err != nil {
		return nil, s.wrap("claim batch", err)
	}
	return out, nil
}

// claimBatch claims reqs on q. When a statement fails and undo is set,
// the claims acquired before it are undone (q commits each statement);
// in a caller's transaction, which the failure rolls back, they are not.
func (s *Store) claimBatch(ctx context.Context, q querier, reqs []store.ClaimRequest, undo bool) ([]store.ClaimResult, error) {
	out := make([]store.ClaimResult, len(reqs))
	if len(reqs) == 1 {
		res, err := s.claimOne(ctx, q, reqs[0])
		if err != nil {
			return nil, err
		}
		out[0] = res
		return out, nil
	}
	first := true
	err := inRounds(len(reqs), func(i int) string { return reqs[i].Key }, func(round []int) error {
		// Only the first round can find new keys: a later round repeats
		// keys that the first one claimed or found.
		newKeys := first
		first = false
		return s.claimRound(ctx, q, reqs, round, out, newKeys)
	})
	if err != nil {
		if undo {
			s.releaseAcquired(ctx, out, err)
		}
		return nil, err
	}
	return out, nil
}

// releaseAcquired undoes, as far as it can, the claims that a batch
// claim acquired before one of its statements failed: the caller gets
// only the error, so no fn will run under those claims. A claim of a free
// key is released: left claimed, it would answer "busy" to every retry
// until its lease passed (and, under AtMostOnce, then be lapsed). A
// takeover is abandoned instead (left lapsed at once, as after a crash):
// releasing it would forget the lapsed attempt it took over, which may
// have done the effect, and the next claim would be a fresh one, not a
// takeover. Either way the reason marks the attempt as not run
// (store.NotRunReason), so a later Reconcile hook is asked about the
// attempt before it (store.UndoRequest, here on the batch's own
// connection pool rather than through the transaction that failed). It
// runs even when ctx is done (the most common failure), bounded by
// releaseTimeout. A key it cannot undo stays claimed until its lease
// passes.
func (s *Store) releaseAcquired(ctx context.Context, out []store.ClaimResult, cause error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	detail := "the batch claim failed before it returned: " + cause.Error()
	for _, r := range out {
		if !r.Acquired {
			continue
		}
		if err := s.finish(ctx, s.pool, store.UndoRequest(r.Record, r.Takeover, detail)); err != nil && ctx.Err() != nil {
			return
		}
	}
}

// releaseTimeout bounds releaseAcquired.
const releaseTimeout = 5 * time.Second

// inRounds calls round with the indexes 0..n-1 split into rounds in which
// no key appears twice (one statement cannot write a row twice): each round
// holds the first pending index of each key, in order.
func inRounds(n int, key func(i int) string, round func(idx []int) error) error {
	pending := make([]int, n)
	for i := range pending {
		pending[i] = i
	}
	for len(pending) > 0 {
		var this, later []int
		seen := make(map[string]bool, len(pending))
		for _, i := range pending {
			if seen[key(i)] {
				later = append(later, i)
				continue
			}
			seen[key(i)] = true
			this = append(this, i)
		}
		if err := round(this); err != nil {
			return err
		}
		pending = later
	}
	return nil
}

// claimRound claims reqs[i] for each i of round (distinct keys) in one
// statement, and again for the keys that changed under it. When newKeys
// says the round may hold keys with no row, and while most recent batches
// had none with a row, the keys are first inserted by a statement of
// their own (claimNewSQL), which costs the database about what a bare
// insert of the rows costs, and only the keys that have a row go through
// the full claim. A batch with a key that has a row then takes two round
// trips, which cost more than the full claim alone (9 new keys and one
// completed: 9 – 20% slower), so while more than a quarter of recent
// batches had such a key, batches start with the full claim.
func (s *Store) claimRound(ctx context.Context, q querier, reqs []store.ClaimRequest, round []int, out []store.ClaimResult, newKeys bool) error {
	// Keys in byte order: concurrent batches lock their rows in the same
	// order and cannot deadlock.
	slices.SortFunc(round, func(a, b int) int {
		switch {
		case reqs[a].Key < reqs[b].Key:
			return -1
		case reqs[a].Key > reqs[b].Key:
			return 1
		}
		return 0
	})
	// fullFirst: the batch goes straight to the full claim, whose rows
	// tell whether it had a key with a row (foundRow).
	fullFirst, foundRow := newKeys && s.dupes.Often(), false
	if newKeys && !fullFirst {
		inserted, err := s.claimNew(ctx, q, reqs, round, out)
		if err != nil {
			return err
		}
		round = slices.DeleteFunc(round, func(i int) bool { return inserted[reqs[i].Key] })
		s.dupes.Observe(len(round) > 0)
		if len(round) == 0 {
			return nil
		}
	}
	for range maxClaimRuns {
		n := len(round)
		a := newBatchArgs(reqs, round)
		rows, err := s.query(ctx, q, s.q.claimBatch, pgarray.Text(a.keys), pgarray.Text(a.owners), pgarray.Text(a.corrs), pgarray.Text(a.policies), a.leases, a.rets, pgarray.Text(a.fps), a.takes, pgarray.Text(a.ids))
		if err != nil {
			return err
		}
		index := a.index
		done := make(map[string]bool, n)
		for rows.Next() {
			res, stale, inserted, err := scanClaim(rows)
			if i, ok := index[res.Record.Key]; ok && err != nil && errors.Is(err, store.ErrCorrupt) && !done[res.Record.Key] {
				// This key alone: its record cannot be read. (If the
				// statement acquired it, the claim lapses with its lease.)
				done[res.Record.Key] = true
				out[i] = store.ClaimResult{Record: store.Record{Key: res.Record.Key}, Err: err}
				continue
			}
			if err != nil {
				rows.Close()
				return err
			}
			if stale {
				continue
			}
			i, ok := index[res.Record.Key]
			if !ok || done[res.Record.Key] {
				rows.Close()
				return fmt.Errorf("pgstore: claim batch returned an unexpected row for %q", res.Record.Key)
			}
			done[res.Record.Key] = true
			out[i] = res
			foundRow = foundRow || !inserted
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(done) == n {
			if fullFirst {
				s.dupes.Observe(foundRow)
			}
			return nil
		}
		round = slices.DeleteFunc(round, func(i int) bool { return done[reqs[i].Key] })
		s.reruns.Add(1)
	}
	return errContended
}

// batchArgs are the parameters of claimBatchSQL and claimNewSQL for some
// requests: one array per field, and each key's request index.
type batchArgs struct {
	keys, ids, owners, corrs, policies, fps []string
	leases, rets                            pgarray.Int64s
	takes                                   []bool
	index                                   map[string]int
}

func newBatchArgs(reqs []store.ClaimRequest, round []int) batchArgs {
	n := len(round)
	a := batchArgs{
		keys: make([]string, n), ids: make([]string, n), owners: make([]string, n), corrs: make([]string, n), policies: make([]string, n), fps: make([]string, n),
		leases: make(pgarray.Int64s, n), rets: make(pgarray.Int64s, n), takes: make([]bool, n),
		index: make(map[string]int, n),
	}
	for j, i := range round {
		r := &reqs[i]
		a.keys[j], a.ids[j], a.owners[j], a.corrs[j], a.policies[j], a.fps[j] = r.Key, r.AttemptID, pgtext.Storable(r.Owner), pgtext.Storable(r.Correlation), r.Policy.String(), pgtext.Storable(r.Fingerprint)
		a.leases[j], a.rets[j], a.takes[j] = micros(r.Lease), micros(r.Retention), r.TakeLapsed
		a.index[r.Key] = i
	}
	return a
}

// claimNew runs claimNewSQL for the requests of round and sets out[i] for
// each key it inserted: acquired, the record a claim gives a new key. It
// returns the keys inserted.
func (s *Store) claimNew(ctx context.Context, q querier, reqs []store.ClaimRequest, round []int, out []store.ClaimResult) (map[string]bool, error) {
	a := newBatchArgs(reqs, round)
	rows, err := s.query(ctx, q, s.q.claimNew, pgarray.Text(a.keys), pgarray.Text(a.owners), pgarray.Text(a.corrs), pgarray.Text(a.policies), a.leases, a.rets, pgarray.Text(a.fps), pgarray.Text(a.ids))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	inserted := make(map[string]bool, len(round))
	for rows.Next() {
		var raw rawRecord
		if err := rows.Scan(&raw.key, &raw.fence, &raw.leaseUntil, &raw.expiresAt, &raw.createdAt); err != nil {
			return nil, err
		}
		i, ok := a.index[raw.key]
		if !ok || inserted[raw.key] || raw.fence != store.FirstFence(raw.createdAt, 0) {
			return nil, fmt.Errorf("pgstore: claim batch inserted an unexpected row for %q (fence %d)", raw.key, raw.fence)
		}
		req := &reqs[i]
		raw.status, raw.policy, raw.attempt, raw.attemptID = string(store.StatusInProgress), req.Policy.String(), 1, req.AttemptID
		raw.owner, raw.fingerprint, raw.updatedAt = pgtext.Storable(req.Owner), pgtext.Storable(req.Fingerprint), raw.createdAt
		raw.correlation = pgtext.Storable(req.Correlation) // journal nil: the implicit entry, which is what the row holds, implicit or written out
		rec, err := raw.record()
		if err != nil {
			return nil, err
		}
		inserted[raw.key] = true
		out[i] = store.ClaimResult{Acquired: true, Record: rec, Now: rec.CreatedAt}
	}
	return inserted, rows.Err()
}
