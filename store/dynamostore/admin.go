package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/idemkit/idem/store"
)

// List implements store.Store with a Scan of the whole table (consistent
// reads, filtered in DynamoDB by status, lapsed lease, cursor and expiry),
// sorted by key in the store: DynamoDB keeps no order across partition
// keys, so every List reads every item, whatever q.Limit. It is an
// operator's call (the idem command's ls), not one for a hot path: on a
// large table, each call costs the table's size in read capacity. A
// record that cannot be decoded fails the call with a *store.CorruptError
// naming its key (Delete removes it).
func (s *Store) List(ctx context.Context, q store.ListQuery) ([]store.Record, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	if err := q.Check(); err != nil {
		return nil, err
	}
	limit := q.PageSize()
	now := s.now()
	e := newExpr()
	conds := []string{e.n(attrExpiresAt) + " > " + e.v(nanos(now))}
	if q.Status != "" {
		conds = append(conds, e.n(attrStatus)+" = "+e.v(str(string(q.Status))))
	}
	if q.Stuck {
		conds = append(conds, e.n(attrStatus)+" = "+e.v(str(string(store.StatusInProgress))),
			e.n(attrLeaseUntil)+" <= "+e.v(nanos(now)))
	}
	if q.Indeterminate {
		conds = append(conds, e.n(attrStatus)+" = "+e.v(str(string(store.StatusInProgress))),
			e.n(attrLeaseUntil)+" <= "+e.v(nanos(now)), e.n(attrPolicy)+" = "+e.v(str(store.AtMostOnce.String())))
	}
	if q.After != "" {
		conds = append(conds, e.n(AttrKey)+" > "+e.v(str(q.After)))
	}
	if q.Prefix != "" {
		conds = append(conds, "begins_with("+e.n(AttrKey)+", "+e.v(str(q.Prefix))+")")
	}
	if !q.UpdatedAfter.IsZero() {
		conds = append(conds, e.n(attrUpdatedAt)+" > "+e.v(nanos(q.UpdatedAfter)))
	}
	if !q.UpdatedBefore.IsZero() {
		conds = append(conds, e.n(attrUpdatedAt)+" < "+e.v(nanos(q.UpdatedBefore)))
	}
	var out []store.Record
	err := s.scan(ctx, e, strings.Join(conds, " AND "), "", func(it map[string]types.AttributeValue) (bool, error) {
		key := ""
		if k, ok := it[AttrKey].(*types.AttributeValueMemberS); ok {
			key = k.Value
		}
		rec, _, err := decode(key, it)
		if err != nil {
			return false, err
		}
		// The filter ran on DynamoDB; check again by the same rules.
		if !q.Matches(&rec, now) {
			return true, nil
		}
		out = append(out, rec)
		return true, nil
	})
	if err != nil {
		return nil, wrap("list", "", err)
	}
	slices.SortFunc(out, func(a, b store.Record) int { return strings.Compare(a.Key, b.Key) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// scan calls f on every item that filter selects (consistent reads), page
// by page, until f says stop or the table ends.
func (s *Store) scan(ctx context.Context, e *expr, filter, projection string, f func(map[string]types.AttributeValue) (bool, error)) error {
	in := &dynamodb.ScanInput{
		TableName:                 s.table,
		ConsistentRead:            aws.Bool(true),
		FilterExpression:          aws.String(filter),
		ExpressionAttributeNames:  e.Names(),
		ExpressionAttributeValues: e.Values(),
	}
	if projection != "" {
		in.ProjectionExpression = aws.String(projection)
	}
	p := dynamodb.NewScanPaginator(s.client, in)
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return err
		}
		for _, it := range page.Items {
			more, err := f(it)
			if err != nil || !more {
				return err
			}
		}
	}
	return nil
}

// Resolve implements store.Store: a consistent read, then the decided
// record written with a PutItem conditioned on the item being the one
// read (read again and decided again if another write came first). r's
// conditions are checked in Go on the record read, by the store package's
// rules ([store.ApplyResolve]), and hold at the write because the write is
// conditioned on the item being the one read.
func (s *Store) Resolve(ctx context.Context, r store.ResolveRequest) (store.Record, error) {
	key := r.Key
	if err := s.check(ctx); err != nil {
		return store.Record{}, err
	}
	if r.Done && len(r.Result) > MaxResultSize {
		return store.Record{}, wrap("resolve", key, fmt.Errorf("%w: a result of %d bytes (at most %d)", ErrItemTooLarge, len(r.Result), MaxResultSize))
	}
	r.Reason = capReason(r.Reason)
	call := newCall()
	var pending *store.Record
	rec, found, err := s.get(ctx, key)
	for range maxRounds {
		if err != nil {
			return store.Record{}, wrap("resolve", key, err)
		}
		if rec != nil && pending != nil && found == call {
			return *pending, nil
		}
		next, rerr := store.ApplyResolve(rec, r, s.now())
		if rerr != nil {
			return store.Record{}, rerr
		}
		pending = next
		var ok bool
		rec, found, ok, err = s.put(ctx, next, call, found)
		if err == nil && ok {
			return *next, nil
		}
	}
	return store.Record{}, wrap("resolve", key, ErrContention)
}

// Delete implements store.Store: one DeleteItem, conditioned on the record
// existing unexpired. A corrupt record is deleted too. (If the answer to
// a delete that DynamoDB made is lost and the client retries it, the
// retry finds nothing and reports store.ErrNotFound.)
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	e := newExpr()
	cond := "attribute_exists(" + e.n(AttrKey) + ") AND NOT (" + e.n(attrExpiresAt) + " <= " + e.v(nanos(s.now())) + ")"
	_, err := s.client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:                 s.table,
		Key:                       s.keyOf(key),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeNames:  e.Names(),
		ExpressionAttributeValues: e.Values(),
	})
	var cf *types.ConditionalCheckFailedException
	if errors.As(err, &cf) {
		return store.ErrNotFound
	}
	return wrap("delete", key, err)
}

// Sweep implements store.Store: a Scan (consistent reads) for items whose
// retention has passed, each deleted by a DeleteItem conditioned on the
// item being the one the scan saw, until limit are deleted or the table
// ends. Each call reads the table from its start: with TTL enabled on
// [AttrTTL], DynamoDB deletes expired items by itself at no cost, and
// Sweep is only needed where TTL is off (emulators) or to reclaim space
// sooner.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	if err := s.check(ctx); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, nil
	}
	now := s.now()
	e := newExpr()
	filter := e.n(attrExpiresAt) + " <= " + e.v(nanos(now))
	projection := e.n(AttrKey) + ", " + e.n(attrCall)
	n := 0
	err := s.scan(ctx, e, filter, projection, func(it map[string]types.AttributeValue) (bool, error) {
		k, ok1 := it[AttrKey].(*types.AttributeValueMemberS)
		c, ok2 := it[attrCall].(*types.AttributeValueMemberS)
		if !ok1 || !ok2 {
			return true, nil // not a record this store wrote: left alone
		}
		de := newExpr()
		cond := de.n(attrCall) + " = " + de.v(str(c.Value))
		_, err := s.client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
			TableName:                 s.table,
			Key:                       s.keyOf(k.Value),
			ConditionExpression:       aws.String(cond),
			ExpressionAttributeNames:  de.Names(),
			ExpressionAttributeValues: de.Values(),
		})
		var cf *types.ConditionalCheckFailedException
		if errors.As(err, &cf) {
			return true, nil // written since the scan: claimed again
		}
		if err != nil {
			return false, err
		}
		n++
		return n < limit, nil
	})
	if err != nil {
		return n, wrap("sweep", "", err)
	}
	return n, nil
}
