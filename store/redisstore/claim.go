package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/store"
	"github.com/redis/go-redis/v9"
)

// Claim implements [store.Store]: one script (one round trip) that reads
// the key's hash and writes it only if the key is claimable. A new key
// costs the script an EXISTS and an HSET; it sends back only the server's
// time, and the store builds the record it wrote, whose fence is that
// time in microseconds ([store.FirstFence]).
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if err := s.check(ctx); err != nil {
		return store.ClaimResult{}, err
	}
	if err := req.Check(); err != nil {
		return store.ClaimResult{}, err
	}
	v, err := s.eval(ctx, scriptClaim, req.Key, s.claimArgs(req))
	if err != nil && v == nil {
		return store.ClaimResult{}, s.wrap("claim", req.Key, err)
	}
	res, derr := claimResult(req, v)
	if err != nil { // not replicated
		if derr == nil {
			s.undo(res)
		}
		return store.ClaimResult{}, s.wrap("claim", req.Key, err)
	}
	if derr != nil {
		return store.ClaimResult{}, s.wrap("claim", req.Key, derr)
	}
	return res, nil
}

// undo ends an attempt whose claim WAIT could not confirm: it never ran
// ([store.UndoRequest]). A claim of a free key is released, so that the
// key is not left to lapse (and, under AtMostOnce, to become
// indeterminate) for that attempt. A takeover is abandoned instead (left
// lapsed at once, as after a crash): releasing it would forget the lapsed
// attempt it took over, which may have done the effect, and the next
// claim would be a fresh one, not a takeover, so an AtMostOnce key would
// run again instead of being indeterminate. Either way the reason marks
// the attempt as not run (store.NotRunReason), so a later Reconcile hook
// is asked about the attempt before it. The finishing script is run
// directly, with no WAIT of its own ([Store.Finish] would wait for the
// replicas that just failed to answer). Best effort: its errors are
// dropped, and the undo may itself not reach the replicas.
func (s *Store) undo(res store.ClaimResult) {
	if !res.Acquired {
		return
	}
	req := store.UndoRequest(res.Record, res.Takeover, "the claim was not acknowledged by enough replicas")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = scriptFinish.Run(ctx, s.client, []string{s.rkey(req.Key)}, s.finishArgs(req)...).Result()
}

func (s *Store) claimArgs(req store.ClaimRequest) []any {
	take := argFlag[0]
	if req.TakeLapsed {
		take = argFlag[1]
	}
	// The policy was checked: 0 or 1.
	return append(s.argsCap(8), req.AttemptID, req.Owner, req.Correlation, argPolicy[req.Policy],
		micros(req.Lease), micros(req.Retention), req.Fingerprint, take)
}

// claimResult reads the claim script's answer.
func claimResult(req store.ClaimRequest, v any) (store.ClaimResult, error) {
	a, code, err := reply(v)
	if err != nil {
		return store.ClaimResult{}, err
	}
	now, err := replyTime(a, 1)
	if err != nil {
		return store.ClaimResult{}, err
	}
	res := store.ClaimResult{Now: now}
	switch code {
	case 1:
		// A new record, made of the request: what the script wrote.
		lease := time.Duration(micros(req.Lease)) * time.Microsecond
		ret := time.Duration(micros(req.Retention)) * time.Microsecond
		lu := now.Add(lease)
		fence := store.FirstFence(now, 0) // the script's: now in microseconds
		res.Acquired = true
		res.Record = store.Record{
			Key:         req.Key,
			Status:      store.StatusInProgress,
			Policy:      req.Policy,
			Fence:       fence,
			AttemptID:   req.AttemptID,
			Attempt:     1,
			Owner:       req.Owner,
			Fingerprint: req.Fingerprint,
			LeaseUntil:  lu,
			ExpiresAt:   now.Add(max(lease, ret)),
			CreatedAt:   now,
			UpdatedAt:   now,
			Journal: []store.JournalEntry{{
				Attempt: 1, Fence: fence, AttemptID: req.AttemptID, Owner: req.Owner, Correlation: req.Correlation,
				Started: now, LeaseUntil: lu, Policy: req.Policy.String(),
			}},
		}
		return res, nil
	case 0, 2, 3:
		h, err := replyHash(a, 2)
		if err != nil {
			return store.ClaimResult{}, err
		}
		if res.Record, err = decode(req.Key, h); err != nil {
			return store.ClaimResult{}, err
		}
		res.Acquired = code != 0
		res.Takeover = code == 3
		return res, nil
	case -1:
		return store.ClaimResult{}, replyCorrupt(req.Key, a)
	}
	return store.ClaimResult{}, fmt.Errorf("redisstore: unexpected claim reply %v", v)
}

// ClaimBatch implements [store.BatchClaimer]: the claims are pipelined, one
// script per request, all sent in one round trip (one per cluster node
// with [WithWait] on Redis Cluster). Results are in request order. Each
// claim is atomic on its own, with the same rules as [Store.Claim]; a key
// that appears twice is claimed twice, in order, so the second finds the
// first's claim. If the connection fails mid-batch, ClaimBatch returns the
// error, and the keys acquired before it stay claimed until their leases
// pass.
func (s *Store) ClaimBatch(ctx context.Context, reqs []store.ClaimRequest) ([]store.ClaimResult, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	for _, r := range reqs {
		if err := r.Check(); err != nil {
			return nil, err
		}
	}
	out := make([]store.ClaimResult, len(reqs))
	if len(reqs) == 0 {
		return out, nil
	}
	args := make([][]any, len(reqs))
	for i, r := range reqs {
		args[i] = s.claimArgs(r)
	}
	groups, err := s.batchGroups(ctx, len(reqs), func(i int) string { return reqs[i].Key })
	if err != nil {
		return nil, s.wrap("claim batch", "", err)
	}
	var notReplicated error
	for c, idx := range groups {
		if err := s.claimGroup(ctx, c, reqs, idx, args, out); err != nil {
			var nr *NotReplicatedError
			if !errors.As(err, &nr) {
				return nil, s.wrap("claim batch", "", err)
			}
			notReplicated = err
		}
	}
	if notReplicated != nil {
		for _, r := range out {
			s.undo(r)
		}
		return nil, s.wrap("claim batch", "", notReplicated)
	}
	return out, nil
}

// batchGroups splits a batch by the client that must run it: the store's
// client for all, unless WAIT must follow the writes on each cluster
// node's connection.
func (s *Store) batchGroups(ctx context.Context, n int, key func(i int) string) (map[scripter][]int, error) {
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	cc, ok := s.client.(*redis.ClusterClient)
	if s.cfg.waitReplicas == 0 || !ok {
		return map[scripter][]int{s.client: all}, nil
	}
	groups := map[scripter][]int{}
	byNode := map[*redis.Client]scripter{}
	for _, i := range all {
		m, err := cc.MasterForKey(ctx, s.rkey(key(i)))
		if err != nil {
			return nil, err
		}
		if _, ok := byNode[m]; !ok {
			byNode[m] = m
		}
		groups[byNode[m]] = append(groups[byNode[m]], i)
	}
	return groups, nil
}

// claimGroup pipelines the claims idx of reqs on c and fills out.
func (s *Store) claimGroup(ctx context.Context, c scripter, reqs []store.ClaimRequest, idx []int, args [][]any, out []store.ClaimResult) error {
	return s.pipeline(ctx, c, scriptClaim, idx, func(i int) (string, []any) { return s.rkey(reqs[i].Key), args[i] },
		func(i int, v any, rerr error) error {
			if rerr == nil {
				var err error
				if out[i], err = claimResult(reqs[i], v); err == nil {
					return nil
				}
				rerr = err
			}
			// This key alone (a record it cannot read, a reply error of its
			// script): the batch's other claims stand.
			out[i] = store.ClaimResult{Record: store.Record{Key: reqs[i].Key}, Err: rerr}
			return nil
		})
}

// pipeline runs script once for each of idx on c in one round trip (plus a
// WAIT with WithWait), loading the script and resending those that found
// it missing. call gives an index's key and arguments; answer takes an
// index's reply and returns an error that fails the whole batch. A
// NotReplicatedError is returned after every answer is taken. A reply
// error of one script (the server refused that call) is passed to answer
// with it; any other error ends the batch.
func (s *Store) pipeline(ctx context.Context, c scripter, script *redis.Script, idx []int, call func(i int) (string, []any), answer func(i int, v any, err error) error) error {
	var waitErr error
	for try := 0; len(idx) > 0; try++ {
		if try == 2 {
			return errors.New("redisstore: the server keeps forgetting the store's scripts")
		}
		pipe := c.Pipeline()
		cmds := make([]*redis.Cmd, len(idx))
		for j, i := range idx {
			key, args := call(i)
			cmds[j] = script.EvalSha(ctx, pipe, []string{key}, args...)
		}
		var w *redis.Cmd
		if s.cfg.waitReplicas > 0 {
			w = pipe.Do(ctx, "wait", s.cfg.waitReplicas, s.cfg.waitTimeout.Milliseconds())
		}
		_, _ = pipe.Exec(ctx)
		var again []int
		for j, i := range idx {
			v, err := cmds[j].Result()
			if isNoScript(err) {
				again = append(again, i)
				continue
			}
			var re redis.Error
			if err != nil && (!errors.As(err, &re) || err == redis.Nil) {
				return err // the connection, not this script
			}
			if err := answer(i, v, err); err != nil {
				return err
			}
		}
		if w != nil {
			if err := s.replicated(w); err != nil {
				waitErr = err
			}
		}
		if len(again) > 0 {
			if err := load(ctx, c, script); err != nil {
				return err
			}
		}
		idx = again
	}
	return waitErr
}
