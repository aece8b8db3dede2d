package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/idemkit/idem/store"
)

// DefaultKeepExpired is how long after its retention (ExpiresAt) a record
// stays in the table before DynamoDB's TTL may delete it, unless
// [WithKeepExpired] says otherwise.
const DefaultKeepExpired = 24 * time.Hour

var (
	// ErrItemTooLarge is wrapped by the error of a write whose item would
	// exceed DynamoDB's 400 KB item limit (see [MaxItemSize] and
	// [MaxResultSize]): refused before sending when the store can tell,
	// otherwise DynamoDB's refusal is reported with it. Nothing was written.
	ErrItemTooLarge = errors.New("dynamostore: item too large for DynamoDB (400 KB)")
	// ErrContention is wrapped by the error of a call that found the record
	// changed under it too many times in a row. Nothing was decided: it is
	// a store error, never an outcome.
	ErrContention = errors.New("dynamostore: the record kept changing under the call")
)

// maxRounds bounds the read-and-compare-and-set rounds of one call.
const maxRounds = 32

// Store is an [store.Store] kept in one DynamoDB table, with one item per
// key. Make one with [New]; it is safe for concurrent use by many
// goroutines, and any number of processes may share the table.
type Store struct {
	client *dynamodb.Client
	table  *string
	now    func() time.Time
	keep   time.Duration
	closed atomic.Bool
	allOld atomic.Int64 // items returned with a failed condition, for tests
	// readFirst: Claim reads before it writes (WithReadFirst).
	readFirst bool
}

var _ store.Store = (*Store)(nil)

// Option configures a [Store].
type Option func(*Store)

// WithClock sets the clock the store reads for leases and retention
// (default time.Now). DynamoDB has no clock of its own to offer; see the
// package doc on clock skew. Tests use it to make time pass without
// sleeping.
func WithClock(now func() time.Time) Option {
	return func(s *Store) {
		if now != nil {
			s.now = now
		}
	}
}

// WithKeepExpired sets how long past its retention a record stays in the
// table (default [DefaultKeepExpired]): the TTL attribute ([AttrTTL]) is
// ExpiresAt plus this. The store reads an expired record as absent either
// way, but while the item is there a claim after the expiry continues
// the key's fence and attempt numbers, so that a holder from before the
// expiry is still refused. Zero lets TTL delete a record from its
// ExpiresAt on (DynamoDB deletes expired items within days, not at once).
func WithKeepExpired(d time.Duration) Option {
	return func(s *Store) { s.keep = max(d, 0) }
}

// WithReadFirst makes Claim read the key's item first (a consistent
// GetItem) and write only when the key is free to take, with a PutItem
// conditioned on the item being the one read. By default (false) Claim
// writes first, as Powertools does: a PutItem conditioned on the key
// having no item, which is the whole claim of a new key.
//
// Writing first is the cheaper choice where most claims are of new keys
// (first deliveries): one write, one round trip. Reading first costs a
// new key a read more and a second round trip, but answers a duplicate or
// a busy key with one read instead of a failed conditional write (a read
// unit costs a fifth of a write unit on demand), and with one request
// instead of two on endpoints that do not return the item with a failed
// condition (emulators). It suits workloads where most claims find a
// record: redelivering queues, retrying senders, polling consumers. Both
// are equally safe: every write is conditioned on what was read.
func WithReadFirst(on bool) Option {
	return func(s *Store) { s.readFirst = on }
}

// New returns a store on table, which must exist with a string partition
// key named [AttrKey] (see [CreateTable]). The client is the caller's:
// [Store.Close] does not touch it. Every call sends one request at a time
// through it, with the client's retries: a retried write is recognised by
// its call id (see the package doc).
func New(client *dynamodb.Client, table string, opts ...Option) *Store {
	s := &Store{client: client, table: aws.String(table), now: time.Now, keep: DefaultKeepExpired}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Table returns the name of the store's table.
func (s *Store) Table() string { return *s.table }

// Client returns the store's client.
func (s *Store) Client() *dynamodb.Client { return s.client }

// Close marks the store closed: later calls return [store.ErrClosed]. The
// client is left as it is.
func (s *Store) Close() error {
	s.closed.Store(true)
	return nil
}

var errClosed = fmt.Errorf("dynamostore: %w", store.ErrClosed)

func (s *Store) check(ctx context.Context) error {
	if s.closed.Load() {
		return errClosed
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("dynamostore: %w", err)
	}
	return nil
}

// wrap names the call and key in a backend error.
func wrap(op, key string, err error) error {
	if err == nil {
		return nil
	}
	if tooLarge(err) {
		err = fmt.Errorf("%w: %v", ErrItemTooLarge, err)
	}
	if key == "" {
		return fmt.Errorf("dynamostore: %s: %w", op, err)
	}
	return fmt.Errorf("dynamostore: %s %q: %w", op, key, err)
}

// tooLarge reports whether DynamoDB refused a write for the item's size.
func tooLarge(err error) bool {
	var ve interface{ ErrorCode() string }
	return errors.As(err, &ve) && ve.ErrorCode() == "ValidationException" &&
		strings.Contains(err.Error(), "exceeded the maximum allowed size")
}

// invalidPath reports whether DynamoDB refused an update for a document
// path that the item does not have.
func invalidPath(err error) bool {
	var ve interface{ ErrorCode() string }
	return errors.As(err, &ve) && ve.ErrorCode() == "ValidationException" &&
		strings.Contains(err.Error(), "document path provided in the update expression is invalid")
}

// newCall returns a call id: stored with every write, it tells a call that
// finds the record changed whether the change is its own (a write that
// DynamoDB made but whose answer was lost, then retried by the client).
func newCall() string { return strconv.FormatUint(rand.Uint64(), 36) }

func (s *Store) keyOf(key string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{AttrKey: str(key)}
}

// get reads key's item with a consistent read: the record, the call that
// wrote it, and whether it exists.
func (s *Store) get(ctx context.Context, key string) (*store.Record, string, error) {
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      s.table,
		Key:            s.keyOf(key),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, "", err
	}
	if len(out.Item) == 0 {
		return nil, "", nil
	}
	rec, call, err := decode(key, out.Item)
	if err != nil {
		return nil, "", err
	}
	return &rec, call, nil
}

// put writes rec as a whole, by call, if the item is still the one prev
// wrote ("" for no item): the compare-and-set of the paths that read. It
// reports whether it wrote; if not, it returns the item found instead
// (nil if none), with the call that wrote it.
func (s *Store) put(ctx context.Context, rec *store.Record, call, prev string) (*store.Record, string, bool, error) {
	it := encode(rec, call, s.keep)
	if n := itemSize(it); n > MaxItemSize {
		return nil, "", false, fmt.Errorf("%w: the record would take %d bytes", ErrItemTooLarge, n)
	}
	e := newExpr()
	var cond string
	if prev == "" {
		cond = "attribute_not_exists(" + e.n(AttrKey) + ")"
	} else {
		cond = e.n(attrCall) + " = " + e.v(str(prev))
	}
	_, err := s.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           s.table,
		Item:                                it,
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            e.Names(),
		ExpressionAttributeValues:           e.Values(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err == nil {
		return nil, "", true, nil
	}
	found, err := s.found(ctx, rec.Key, err)
	if err != nil {
		return nil, "", false, err
	}
	if found.rec == nil {
		return nil, "", false, nil
	}
	return found.rec, found.call, false, nil
}

// item is a record as found, with the call that wrote it.
type item struct {
	rec  *store.Record
	call string
}

// found returns the item a write's condition failed on: the one DynamoDB
// returned with the failure (ALL_OLD), or else one read with a consistent
// GetItem. Any other error is returned as it is.
func (s *Store) found(ctx context.Context, key string, err error) (item, error) {
	var cf *types.ConditionalCheckFailedException
	if !errors.As(err, &cf) {
		return item{}, err
	}
	if len(cf.Item) > 0 {
		s.allOld.Add(1)
		r, c, err := decode(key, cf.Item)
		if err != nil {
			return item{}, err
		}
		return item{&r, c}, nil
	}
	r, c, err := s.get(ctx, key)
	return item{r, c}, err
}

// Claim implements store.Store. A claim is first one PutItem conditioned
// on the key having no item (attribute_not_exists), which is the whole
// claim of a new key. When the condition fails, the item is what DynamoDB
// returns with the failure (ReturnValuesOnConditionCheckFailure ALL_OLD),
// or, from an endpoint that does not return it, what a consistent GetItem
// reads: if the key is busy, done or failed, that is the answer. If it may
// be taken (released, expired, a lapsed lease), the new record is written
// with a PutItem conditioned on the item being exactly the one found (by
// its call id), and the claim decides again if another write came first.
//
// A new item's first fence is [store.FirstFence] of the store's clock,
// with no floor: see the package doc (Fences) for its limit.
func (s *Store) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	if err := req.Check(); err != nil {
		return store.ClaimResult{}, err
	}
	if err := s.check(ctx); err != nil {
		return store.ClaimResult{}, err
	}
	call := newCall()
	var (
		rec     *store.Record
		found   string
		ok      bool
		err     error
		pending store.ClaimResult // what the last write sent means, should the claim find it
	)
	if s.readFirst {
		rec, found, err = s.get(ctx, req.Key)
	} else {
		var next *store.Record
		next, pending = store.ApplyClaim(nil, req, s.now(), 0)
		rec, found, ok, err = s.put(ctx, next, call, "")
	}
	for range maxRounds {
		if err != nil {
			return store.ClaimResult{}, wrap("claim", req.Key, err)
		}
		if ok || rec != nil && found == call {
			return pending, nil
		}
		next, res := store.ApplyClaim(rec, req, s.now(), 0)
		if next == nil {
			return res, nil
		}
		pending = res
		rec, found, ok, err = s.put(ctx, next, call, found)
	}
	return store.ClaimResult{}, wrap("claim", req.Key, ErrContention)
}

// Finish implements store.Store: one UpdateItem conditioned on the
// attempt holding the key (see finish). A result larger than
// [MaxResultSize] is refused with an error wrapping [ErrItemTooLarge]
// before anything is sent; a reason longer than [MaxReasonLen] bytes is
// cut.
func (s *Store) Finish(ctx context.Context, req store.FinishRequest) error {
	if err := req.Check(); err != nil {
		return err
	}
	_, err := s.finish(ctx, opOf(req.Outcome), req, 0)
	return err
}

// Extend implements store.Store: one UpdateItem conditioned on the attempt
// holding the key and the new lease ending within ExpiresAt; a lease past
// ExpiresAt moves ExpiresAt with it by a compare-and-set write.
func (s *Store) Extend(ctx context.Context, req store.ExtendRequest) (time.Time, error) {
	if err := req.Check(); err != nil {
		return time.Time{}, err
	}
	return s.finish(ctx, "extend", store.FinishRequest{Key: req.Key, Fence: req.Fence, AttemptID: req.AttemptID}, req.Lease)
}

// opOf names a finishing call in errors, as the calls Finish replaced did.
func opOf(o store.Outcome) string {
	switch o {
	case store.OutcomeCompleted:
		return "complete"
	case store.OutcomeFailed:
		return "fail"
	case store.OutcomeReleased:
		return "release"
	}
	return "abandon"
}

// finish runs Finish and Extend (op "extend", for lease): one conditional
// UpdateItem whose condition holds the attempt (the record is in_progress
// under req's fence and attempt id, unexpired, with its journal entry).
// When the condition fails the call reads the item to tell why, by the
// store package's rules: a stale attempt gets store.ErrLeaseLost, and its
// journal entry is marked with LateFinish by a compare-and-set write
// (unless a finish says it never ran); the rare case the fast condition is
// too strict for (an extension past the record's ExpiresAt) is written the
// same way.
func (s *Store) finish(ctx context.Context, op string, req store.FinishRequest, lease time.Duration) (time.Time, error) {
	if err := s.check(ctx); err != nil {
		return time.Time{}, err
	}
	key := req.Key
	if op == "complete" && len(req.Result) > MaxResultSize {
		return time.Time{}, wrap(op, key, fmt.Errorf("%w: a result of %d bytes (at most %d)", ErrItemTooLarge, len(req.Result), MaxResultSize))
	}
	req.Reason = capReason(req.Reason)
	call := newCall()
	now := s.now()
	until := now.Add(lease)
	e := newExpr()
	jf := strconv.FormatInt(req.Fence, 10)
	cond := e.n(attrStatus) + " = " + e.v(str(string(store.StatusInProgress))) +
		" AND " + e.n(attrFence) + " = " + e.v(num(req.Fence)) +
		" AND " + e.n(attrAttemptID) + " = " + e.v(str(req.AttemptID)) +
		" AND " + e.n(attrExpiresAt) + " > " + e.v(nanos(now)) +
		" AND attribute_exists(" + e.n(attrJournal, jf) + ")"
	e.Set(str(call), attrCall)
	e.Set(nanos(now), attrUpdatedAt)
	if op == "extend" {
		// The lease must not outlive the record: the fast path only
		// extends within ExpiresAt.
		cond += " AND " + e.n(attrExpiresAt) + " >= " + e.v(nanos(until))
		e.Set(nanos(until), attrLeaseUntil)
		e.Set(nanos(until), attrJournal, jf, store.WireLeaseUntil)
	} else {
		e.Set(nanos(now), attrLeaseUntil)
		switch req.Outcome {
		case store.OutcomeCompleted:
			e.Set(str(string(store.StatusCompleted)), attrStatus)
			if len(req.Result) > 0 {
				e.Set(&types.AttributeValueMemberB{Value: req.Result}, attrResult)
			} else {
				e.Remove(attrResult)
			}
		case store.OutcomeFailed:
			e.Set(str(string(store.StatusFailed)), attrStatus)
			e.SetS(req.Reason, attrReason)
		case store.OutcomeReleased:
			e.Set(str(string(store.StatusReleased)), attrStatus)
			e.SetS(req.Reason, attrReason)
		case store.OutcomeAbandoned:
			// It stays in_progress, lapsed from now on; the attempt
			// gives its id up, so that it cannot end twice.
			e.Remove(attrAttemptID)
			e.SetS(req.Reason, attrReason)
		}
		if req.Outcome == store.OutcomeCompleted || req.Outcome == store.OutcomeFailed {
			exp := now.Add(req.Retention)
			e.Set(nanos(exp), attrExpiresAt)
			e.Set(ttlSeconds(exp, s.keep), AttrTTL)
		}
		e.Set(nanos(now), attrJournal, jf, store.WireEnded)
		e.Set(nanos(now), attrJournal, jf, store.WireLeaseUntil)
		e.Set(str(string(req.Outcome)), attrJournal, jf, store.WireOutcome)
		e.SetS(req.Reason, attrJournal, jf, store.WireReason)
	}
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           s.table,
		Key:                                 s.keyOf(key),
		ConditionExpression:                 aws.String(cond),
		UpdateExpression:                    aws.String(e.Update()),
		ExpressionAttributeNames:            e.Names(),
		ExpressionAttributeValues:           e.Values(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err == nil {
		return until, nil
	}
	var it item
	if invalidPath(err) {
		// DynamoDB refused the update for a journal path that the item
		// lacks instead of failing the condition (nothing was written):
		// the item decides, as for a failed condition.
		it.rec, it.call, err = s.get(ctx, key)
	} else {
		it, err = s.found(ctx, key, err)
	}
	// pending is what the last write sent means, should the call find it.
	var pending error
	pendingUntil := until
	for range maxRounds {
		if err != nil {
			return time.Time{}, wrap(op, key, err)
		}
		if it.rec != nil && it.call == call {
			if pending != nil {
				return time.Time{}, pending
			}
			return pendingUntil, nil
		}
		now := s.now()
		var (
			next    *store.Record
			outcome error
		)
		if op == "extend" {
			next, outcome = store.ApplyExtend(it.rec, store.ExtendRequest{Key: key, Fence: req.Fence, AttemptID: req.AttemptID, Lease: lease}, now)
		} else {
			next, outcome = store.ApplyFinish(it.rec, req, now)
		}
		if next == nil {
			return time.Time{}, outcome
		}
		pending, pendingUntil = outcome, next.LeaseUntil
		var ok bool
		it.rec, it.call, ok, err = s.put(ctx, next, call, it.call)
		if err == nil && ok {
			if outcome != nil {
				return time.Time{}, outcome
			}
			return next.LeaseUntil, nil
		}
	}
	return time.Time{}, wrap(op, key, ErrContention)
}

// Get implements store.Store with a consistent GetItem.
func (s *Store) Get(ctx context.Context, key string) (store.Record, error) {
	if err := s.check(ctx); err != nil {
		return store.Record{}, err
	}
	rec, _, err := s.get(ctx, key)
	if err != nil {
		return store.Record{}, wrap("get", key, err)
	}
	if rec == nil || rec.Expired(s.now()) {
		return store.Record{}, store.ErrNotFound
	}
	return *rec, nil
}

// Now implements store.Store: the store's clock (the client's, see
// [WithClock]).
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	if err := s.check(ctx); err != nil {
		return time.Time{}, err
	}
	return s.now(), nil
}
