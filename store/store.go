package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"time"
)

// Store keeps one [Record] per key. Every mutating call must be one atomic
// conditional write on the backend (a conditional UPSERT, a Lua script, a
// DynamoDB condition expression): never a read followed by a separate write
// that another writer could slip between.
//
// Times come from the store's clock where it has one, so workers with skewed
// clocks agree on leases. Expiry is checked on every call, whatever the
// backend's own TTL does: a record whose ExpiresAt has passed behaves as
// absent.
//
// Errors: [ErrLeaseLost] when the fence does not match an in_progress record
// (it was taken over, resolved, finished, deleted or expired); [ErrNotFound]
// from Get and admin calls on an absent key; [ErrCorrupt] for a record that
// cannot be decoded. Any other error means the store could not answer, and
// callers never read it as an outcome.
//
// The package idemtest holds the conformance suite every Store must pass.
type Store interface {
	// Claim takes the key for one attempt if it is absent, expired,
	// released, or in_progress with a lapsed lease that may be taken over:
	// the record's policy is AtLeastOnce or req.TakeLapsed is set, and the
	// lapsed attempt was for the same request (the record's Fingerprint or
	// req.Fingerprint is empty, or they are equal). A lapsed attempt with
	// another fingerprint is never taken over, whatever the policy and
	// TakeLapsed: it may have done its own request's effect, and the Ledger
	// answers the claim with a mismatch. A released record is claimable
	// with any fingerprint: its last attempt ended and gave the key back.
	// On success the record is in_progress with fence+1, attempt+1, the new
	// owner, fingerprint and policy, LeaseUntil = now+Lease, and ExpiresAt
	// = now+max(Lease, Retention); a journal entry is appended. Otherwise
	// nothing is written and the record is returned as found.
	Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error)
	// Complete records the attempt's result: status completed, ExpiresAt =
	// now+retention.
	Complete(ctx context.Context, key string, fence int64, result []byte, retention time.Duration) error
	// Fail records a permanent failure: status failed, Reason = reason,
	// ExpiresAt = now+retention.
	Fail(ctx context.Context, key string, fence int64, reason string, retention time.Duration) error
	// Release makes the key claimable at once (status released), keeping the
	// fence, attempt count and reason for the next claim.
	Release(ctx context.Context, key string, fence int64, reason string) error
	// Abandon ends the attempt's lease now without an outcome: the record
	// stays in_progress and is lapsed from now on, so its policy decides
	// (takeover under AtLeastOnce, indeterminate under AtMostOnce).
	Abandon(ctx context.Context, key string, fence int64, reason string) error
	// Extend renews the lease to now+lease and returns the new LeaseUntil.
	Extend(ctx context.Context, key string, fence int64, lease time.Duration) (time.Time, error)
	// Get returns the record, or ErrNotFound if it is absent or expired.
	Get(ctx context.Context, key string) (Record, error)

	// List returns records in key order, for operators.
	List(ctx context.Context, q ListQuery) ([]Record, error)
	// Resolve decides a key by hand or by a reconciler: Done makes it
	// completed with Result; not Done makes it released. It bumps the fence,
	// so a holder still running is refused. When fence is non-zero the record
	// must still have that fence (else ErrLeaseLost), which lets an operator
	// resolve exactly the attempt they inspected. A fence alone does not
	// name an attempt for good: fences start again at 1 once Delete or Sweep
	// has removed a record, so a record claimed and finished since by others
	// can reach the same fence. Callers that decide an attempt in progress
	// (a reconciler holding the claim, an operator who inspected a lapsed
	// one) set [Resolution.InProgress] too. An absent or expired record is
	// ErrNotFound.
	Resolve(ctx context.Context, key string, fence int64, r Resolution) (Record, error)
	// Delete removes the record whatever its state. ErrNotFound if absent.
	Delete(ctx context.Context, key string) error
	// Sweep deletes at most limit records whose retention has passed and
	// returns how many it deleted; callers loop until it returns 0.
	Sweep(ctx context.Context, limit int) (int, error)
	// Now returns the store's clock.
	Now(ctx context.Context) (time.Time, error)
	// Close releases the store's resources; later calls return ErrClosed.
	Close() error
}

// ClaimRequest asks a [Store] to claim a key for one attempt.
type ClaimRequest struct {
	Key         string
	Owner       string
	Correlation string // recorded in the journal entry
	Policy      Policy
	Lease       time.Duration
	Retention   time.Duration // the in_progress record expires after max(Lease, Retention)
	Fingerprint string
	// TakeLapsed takes over a lapsed attempt even under AtMostOnce. Set by a
	// caller that reconciles before running (a Reconcile hook).
	TakeLapsed bool
}

// ClaimResult is what a claim found or made.
type ClaimResult struct {
	Acquired bool
	// Takeover: acquired over an in_progress record whose lease had passed.
	// The earlier attempt may have done part or all of its effect.
	Takeover bool
	// Record is the record after the claim when Acquired, otherwise as found.
	// Its Journal may share memory with the store: read it, never modify it.
	Record Record
	// Now is the store's clock at the claim.
	Now time.Time
	// Err, in a result of [BatchClaimer.ClaimBatch] only, is a failure of
	// this key alone: its record cannot be decoded ([ErrCorrupt]), or the
	// store refused this key's write (a record too large for the store, a
	// key too contended or throttled, as a store documents); the batch's
	// other keys have their outcomes. Nothing was written for the key.
	// [Store.Claim] returns such a failure as its error.
	Err error
}

// ListQuery selects records for [Store.List].
type ListQuery struct {
	Status Status // "" for any
	// Stuck selects in_progress records whose lease has passed (lapsed
	// AtLeastOnce attempts waiting for a takeover, and indeterminate
	// AtMostOnce ones).
	Stuck bool
	After string // return keys greater than After (a cursor)
	Limit int    // at most this many; 0 means 100
}

// Resolution is an operator's (or a reconciler's) decision on a key.
type Resolution struct {
	Done      bool          // the effect happened: completed with Result
	Result    []byte        // Done: the result to replay to duplicates
	Reason    string        // why, recorded in the journal and the record
	Retention time.Duration // Done: keep the record this long from now; 0 means [DefaultRetention]
	By        string        // who resolved it (journal owner)
	// InProgress refuses the resolution with ErrLeaseLost unless the record
	// is still in_progress, its lease running or lapsed alike: with a
	// non-zero fence, the attempt at that fence that the caller holds or
	// inspected. It keeps a caller from overwriting a record that was
	// deleted and then claimed and finished by others up to the same fence.
	// Leave it unset to overwrite a completed, failed or released record on
	// purpose. An absent or expired record is still ErrNotFound.
	InProgress bool
}

// BatchClaimer is implemented by stores that claim many keys in one round
// trip, for consumers that receive batches. Results are in request order; a
// per-key outcome is in its ClaimResult (a failure of one key alone in its
// Err), a store failure is the error.
type BatchClaimer interface {
	ClaimBatch(ctx context.Context, reqs []ClaimRequest) ([]ClaimResult, error)
}

// Completion is one attempt's result, for [BatchCompleter].
type Completion struct {
	Key       string
	Fence     int64
	Result    []byte
	Retention time.Duration
}

// BatchCompleter is implemented by stores that complete many attempts in one
// round trip. It does what [Store.Complete] does for each of cs: errs[i] is
// nil when cs[i] was recorded and [ErrLeaseLost] (or [ErrNotFound]) when
// its attempt no longer held the key. err is a store failure: then which
// completions were recorded is unknown, as after a failed Complete.
type BatchCompleter interface {
	CompleteBatch(ctx context.Context, cs []Completion) (errs []error, err error)
}

// TxStore is implemented by stores that can run the caller's writes in the
// same transaction as the claim and the completion, so an effect in the
// store's own database happens exactly once. See idem.DoTx.
type TxStore[Tx any] interface {
	Store
	// InTx begins a transaction and claims req in it. If the claim is
	// acquired it calls fn with the transaction; when fn returns nil the key
	// is completed with fn's result (kept for retention) and the transaction
	// commits, otherwise it rolls back and the key is as it was before. If
	// the claim is not acquired, fn is not called and the transaction rolls
	// back. The returned ClaimResult describes the claim.
	InTx(ctx context.Context, req ClaimRequest, retention time.Duration,
		fn func(ctx context.Context, tx Tx) ([]byte, error)) (ClaimResult, []byte, error)
}

// UndoClaim ends the attempt of an acquired claim whose operation will
// never run (its caller left, a batch it was part of failed): a claim of a
// free key is released, so the key is free at once whatever the policy; a
// takeover is abandoned (left lapsed at once, as after a crash), so the
// attempt it took over, which may have done the effect, is met again. The
// reason is [NotRunReason](detail): a later Reconcile hook is asked about
// the attempt before it. A claim not acquired is left as it is.
func UndoClaim(ctx context.Context, s Store, cr ClaimResult, detail string) error {
	switch {
	case !cr.Acquired:
		return nil
	case cr.Takeover:
		return s.Abandon(ctx, cr.Record.Key, cr.Record.Fence, NotRunReason(detail))
	default:
		return s.Release(ctx, cr.Record.Key, cr.Record.Fence, NotRunReason(detail))
	}
}

// FingerprintOf is the fingerprint idem.Fingerprint records for request
// (the hex SHA-256 of its bytes), for code that claims through a Store
// itself ([ClaimRequest.Fingerprint]) and must agree with Ledger callers on
// the same keys.
func FingerprintOf(request []byte) string {
	sum := sha256.Sum256(request)
	return hex.EncodeToString(sum[:])
}
