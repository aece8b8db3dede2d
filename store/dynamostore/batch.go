package dynamostore

import (
	"context"
	"errors"
	"sync"

	"github.com/idemkit/idem"
)

// batchWorkers bounds the claims of one [Store.ClaimBatch] in flight.
const batchWorkers = 16

var _ idem.BatchClaimer = (*Store)(nil)

// ClaimBatch implements idem.BatchClaimer. DynamoDB has no batch write that
// is conditional per item (BatchWriteItem has no conditions;
// TransactWriteItems fails as a whole when one condition fails), so the
// batch is not one round trip: the claims of distinct keys run
// concurrently (at most 16 at a time), each as [Store.Claim] does it, and
// the batch takes about as long as its slowest claim. A key that appears
// more than once is claimed in request order, so its second claim finds
// the first one's record. Results are in request order; a record that
// cannot be decoded fails its own key (ClaimResult.Err); if any other
// claim fails, the error is returned (the other claims may have been made).
func (s *Store) ClaimBatch(ctx context.Context, reqs []idem.ClaimRequest) ([]idem.ClaimResult, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	out := make([]idem.ClaimResult, len(reqs))
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
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, k := range order {
		idx := byKey[k]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			for _, i := range idx {
				res, err := s.Claim(ctx, reqs[i])
				if errors.Is(err, idem.ErrCorrupt) {
					// This key alone: its record cannot be read.
					out[i] = idem.ClaimResult{Record: idem.Record{Key: reqs[i].Key}, Err: err}
					continue
				}
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
						cancel()
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
		return nil, first
	}
	return out, nil
}
