package pgstore

import (
	"context"

	"github.com/idemkit/idem/store"
	"github.com/jackc/pgx/v5"
)

// ClaimBatchTx is [Store.ClaimBatch] inside tx, a transaction the caller
// began on the store's database (READ COMMITTED, which the claim
// statements need): the claims commit with the caller's own writes, or
// roll back with them. A queue in the same database claims the keys of
// the messages it receives this way, in the receive's transaction
// (queue/sqlqueue's fused path). The claimed rows stay locked until tx
// ends, so a concurrent claim of one of the keys waits for it. When a
// statement fails, ClaimBatchTx returns the error and undoes nothing: the
// caller rolls tx back, which undoes every claim of the batch.
func (s *Store) ClaimBatchTx(ctx context.Context, tx pgx.Tx, reqs []store.ClaimRequest) ([]store.ClaimResult, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	for _, r := range reqs {
		if err := r.Check(); err != nil {
			return nil, err
		}
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	out, err := s.claimBatch(ctx, tx, reqs, false)
	if err != nil {
		return nil, s.wrap("claim batch", err)
	}
	return out, nil
}

// FinishBatchTx is [Store.FinishBatch] inside tx, a transaction the caller
// began on the store's database: the attempts' ends commit with the
// caller's own writes (a queue's acks of the messages they handled), or
// roll back with them. errs[i] is nil when reqs[i] was recorded in tx and
// wraps [store.ErrLeaseLost] when its attempt no longer held the key (its
// journal entry is annotated in tx, as FinishBatch does). err is a
// failure of tx, which the caller rolls back.
func (s *Store) FinishBatchTx(ctx context.Context, tx pgx.Tx, reqs []store.FinishRequest) (errs []error, err error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	for _, r := range reqs {
		if err := r.Check(); err != nil {
			return nil, err
		}
	}
	errs, err = s.finishBatch(ctx, tx, reqs)
	if err != nil {
		return nil, s.wrap("finish batch", err)
	}
	return errs, nil
}
