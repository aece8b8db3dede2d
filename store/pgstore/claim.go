package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idem"
	"github.com/jackc/pgx/v5"
)

// maxClaimRuns bounds how many times a claim runs again because its key
// changed under it (see claimSQL). Each run again means another
// transaction committed the key meanwhile, so this is reached only under
// pathological contention.
const maxClaimRuns = 32

var errContended = errors.New("pgstore: the key kept changing under the claim")

// Claim implements [idem.Store]: one INSERT ... ON CONFLICT DO UPDATE ...
// WHERE <claimable> statement (see the package doc).
func (s *Store) Claim(ctx context.Context, req idem.ClaimRequest) (idem.ClaimResult, error) {
	if err := s.check(ctx); err != nil {
		return idem.ClaimResult{}, err
	}
	res, err := s.claimOne(ctx, s.pool, req)
	if err != nil {
		return idem.ClaimResult{}, s.wrap("claim", err)
	}
	return res, nil
}

func checkPolicy(p idem.Policy) error {
	if p != idem.AtLeastOnce && p != idem.AtMostOnce {
		return fmt.Errorf("pgstore: claim with unknown policy %v", p)
	}
	return nil
}

// claimOne claims req on q.
func (s *Store) claimOne(ctx context.Context, q querier, req idem.ClaimRequest) (idem.ClaimResult, error) {
	if err := checkPolicy(req.Policy); err != nil {
		return idem.ClaimResult{}, err
	}
	args := []any{req.Key, text(req.Owner), text(req.Correlation), req.Policy.String(),
		micros(req.Lease), micros(req.Retention), text(req.Fingerprint), req.TakeLapsed}
	for range maxClaimRuns {
		rows, err := s.query(ctx, q, s.q.claim, args...)
		if err != nil {
			return idem.ClaimResult{}, err
		}
		var (
			res   idem.ClaimResult
			found bool
			again bool
		)
		for rows.Next() {
			r, stale, err := scanClaim(rows, func(string) *idem.ClaimRequest { return &req })
			if err != nil {
				rows.Close()
				return idem.ClaimResult{}, err
			}
			res, found, again = r, true, stale
		}
		if err := rows.Err(); err != nil {
			return idem.ClaimResult{}, err
		}
		if found && !again {
			return res, nil
		}
		s.reruns.Add(1)
	}
	return idem.ClaimResult{}, errContended
}

// scanClaim reads one row of claimSQL or claimBatchSQL. stale reports a
// row that was not acquired although the statement's snapshot found it
// claimable: the claim must run again. reqFor returns the request of a
// key, for the journal of a new key (which the statement does not send
// back).
func scanClaim(rows pgx.Rows, reqFor func(key string) *idem.ClaimRequest) (res idem.ClaimResult, stale bool, err error) {
	var (
		raw                 rawRecord
		acquired, claimable bool
		now                 time.Time
	)
	if err := rows.Scan(raw.dest(&acquired, &claimable, &now)...); err != nil {
		return res, false, err
	}
	if !acquired && claimable {
		return res, true, nil
	}
	if acquired && raw.journal == nil {
		// The INSERT inserted the row (xmax = 0): a new key, whose journal
		// is the one entry of the request.
		req := reqFor(raw.key)
		if req == nil || raw.fence != 1 || raw.attempt != 1 {
			return res, false, fmt.Errorf("pgstore: claim returned an unexpected row for %q (fence %d, attempt %d)", raw.key, raw.fence, raw.attempt)
		}
		raw.entries = []idem.JournalEntry{{
			Attempt:     1,
			Fence:       1,
			Owner:       text(req.Owner),
			Correlation: text(req.Correlation),
			Started:     now.UTC(),
			LeaseUntil:  raw.leaseUntil.UTC(),
			Policy:      req.Policy.String(),
		}}
	}
	rec, err := raw.record()
	if err != nil {
		res.Record.Key = raw.key // the caller can charge the failure to this key
		return res, false, err
	}
	res = idem.ClaimResult{Acquired: acquired, Record: rec, Now: now.UTC()}
	if acquired && len(rec.Journal) > 0 {
		// The statement marked the new entry when it took over.
		res.Takeover = rec.Journal[len(rec.Journal)-1].Takeover
	}
	return res, false, nil
}

// ClaimBatch implements [idem.BatchClaimer]: the requests are claimed in
// one statement (one round trip), with the same rules as [Store.Claim].
// Results are in request order. A key that appears more than once is
// claimed again, after its first claim, by a further statement for each
// repetition, so that every request sees the record as the earlier ones
// left it. The claims of one statement commit together; if a later
// statement fails, ClaimBatch returns the error and the keys acquired
// before it stay claimed until their leases pass.
func (s *Store) ClaimBatch(ctx context.Context, reqs []idem.ClaimRequest) ([]idem.ClaimResult, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	out, err := s.claimBatch(ctx, s.pool, reqs)
	if err != nil {
		return nil, s.wrap("claim batch", err)
	}
	return out, nil
}

func (s *Store) claimBatch(ctx context.Context, q querier, reqs []idem.ClaimRequest) ([]idem.ClaimResult, error) {
	out := make([]idem.ClaimResult, len(reqs))
	if len(reqs) == 1 {
		res, err := s.claimOne(ctx, q, reqs[0])
		if err != nil {
			return nil, err
		}
		out[0] = res
		return out, nil
	}
	for _, r := range reqs {
		if err := checkPolicy(r.Policy); err != nil {
			return nil, err
		}
	}
	err := inRounds(len(reqs), func(i int) string { return reqs[i].Key }, func(round []int) error {
		return s.claimRound(ctx, q, reqs, round, out)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

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
// statement, and again for the keys that changed under it.
func (s *Store) claimRound(ctx context.Context, q querier, reqs []idem.ClaimRequest, round []int, out []idem.ClaimResult) error {
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
	for range maxClaimRuns {
		n := len(round)
		keys, owners, corrs, policies, fps := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		leases, rets, takes := make([]int64, n), make([]int64, n), make([]bool, n)
		index := make(map[string]int, n)
		for j, i := range round {
			r := &reqs[i]
			keys[j], owners[j], corrs[j], policies[j], fps[j] = r.Key, text(r.Owner), text(r.Correlation), r.Policy.String(), text(r.Fingerprint)
			leases[j], rets[j], takes[j] = micros(r.Lease), micros(r.Retention), r.TakeLapsed
			index[r.Key] = i
		}
		rows, err := s.query(ctx, q, s.q.claimBatch, keys, owners, corrs, policies, leases, rets, fps, takes)
		if err != nil {
			return err
		}
		done := make(map[string]bool, n)
		for rows.Next() {
			res, stale, err := scanClaim(rows, func(key string) *idem.ClaimRequest {
				if i, ok := index[key]; ok {
					return &reqs[i]
				}
				return nil
			})
			if i, ok := index[res.Record.Key]; ok && err != nil && errors.Is(err, idem.ErrCorrupt) && !done[res.Record.Key] {
				// This key alone: its record cannot be read. (If the
				// statement acquired it, the claim lapses with its lease.)
				done[res.Record.Key] = true
				out[i] = idem.ClaimResult{Record: idem.Record{Key: res.Record.Key}, Err: err}
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
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(done) == n {
			return nil
		}
		round = slices.DeleteFunc(round, func(i int) bool { return done[reqs[i].Key] })
		s.reruns.Add(1)
	}
	return errContended
}
