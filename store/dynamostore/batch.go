package dynamostore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idemkit/idem/store"
)

// batchWorkers bounds the claims of one [Store.ClaimBatch] in flight.
const batchWorkers = 16

var _ store.BatchClaimer = (*Store)(nil)

// ClaimBatch implements store.BatchClaimer. DynamoDB has no batch write that
// is conditional per item (BatchWriteItem has no conditions;
// TransactWriteItems fails as a whole when one condition fails), so the
// batch is not one round trip: the claims of distinct keys run
// concurrently (at most 16 at a time), each as [Store.Claim] does it, and
// the batch takes about as long as its slowest claim. A key that appears
// more than once is claimed in request order, so its second claim finds
// the first one's record. Results are in request order.
//
// A failure of one key alone, after which nothing was written for it, is
// that key's ClaimResult.Err, and the batch's other keys have their
// outcomes: a record that cannot be decoded ([store.ErrCorrupt]), one that
// would be too large ([ErrItemTooLarge]), one that kept changing under
// the claim ([ErrContention]), or a request DynamoDB still throttled
// after the client's retries (ProvisionedThroughputExceededException,
// ThrottlingException, RequestLimitExceeded). Any other error (the
// endpoint, the network, the context) fails the batch: ClaimBatch starts
// no more claims, waits for those in flight, undoes the claims they
// acquired (best effort: a claim of a free key is released, a takeover
// abandoned, left lapsed at once as after a crash; both as not run, see
// [store.NotRunReason]), and returns the error. A request that
// [store.ClaimRequest.Check] refuses refuses the whole batch
// ([store.ErrInvalid]) before anything is sent.
func (s *Store) ClaimBatch(ctx context.Context, reqs []store.ClaimRequest) ([]store.ClaimResult, error) {
	// A request the store refuses (store.ErrInvalid) refuses the batch
	// before anything is sent, so there is nothing to undo.
	for _, r := range reqs {
		if err := r.Check(); err != nil {
			return nil, err
		}
	}
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	out := make([]store.ClaimResult, len(reqs))
	// The requests of each key, in order.
	var order []string
	byKey := map[string][]int{}
	for i, r := range reqs {
		if _, ok := byKey[r.Key]; !ok {
			order = append(order, r.Key)
		}
		byKey[r.Key] = append(byKey[r.Key], i)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		sem   = make(chan struct{}, batchWorkers)
	)
	failed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return first != nil
	}
	for _, k := range order {
		idx := byKey[k]
		sem <- struct{}{}
		if failed() {
			<-sem
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			for _, i := range idx {
				if failed() {
					return
				}
				res, err := s.Claim(ctx, reqs[i])
				if err != nil && keyAlone(err) {
					out[i] = store.ClaimResult{Record: store.Record{Key: reqs[i].Key}, Err: err}
					continue
				}
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
				out[i] = res
			}
		})
	}
	wg.Wait()
	if first != nil {
		s.releaseBatch(ctx, out)
		return nil, first
	}
	return out, nil
}

// keyAlone reports whether err, from a claim, is a failure of its key
// alone after which nothing was written for the key.
func keyAlone(err error) bool {
	return errors.Is(err, store.ErrCorrupt) || errors.Is(err, ErrItemTooLarge) ||
		errors.Is(err, ErrContention) || throttled(err)
}

// throttled reports whether DynamoDB refused a request for its rate (the
// client's retries exhausted): the request was not applied.
func throttled(err error) bool {
	var ae interface{ ErrorCode() string }
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.ErrorCode() {
	case "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded":
		return true
	}
	return false
}

// releaseBatch undoes the claims of a failed batch that were acquired
// ([store.UndoClaim]): their callers get the batch's error and never run
// them. Left to lapse, an AtMostOnce key would become indeterminate though
// nothing ran. Best effort: errors are dropped, the key then lapses.
func (s *Store) releaseBatch(ctx context.Context, out []store.ClaimResult) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	sem := make(chan struct{}, batchWorkers)
	for _, r := range out {
		if !r.Acquired {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_ = store.UndoClaim(ctx, s, r, "the claim batch failed before its results reached the caller")
		})
	}
	wg.Wait()
}
