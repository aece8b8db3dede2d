package store

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Store keeps one [Record] per key. Every mutating call must be one atomic
// conditional write on the backend (a conditional UPSERT, a Lua script, a
// DynamoDB condition expression): never a read followed by a separate write
// that another writer could slip between.
//
// Attempts have an identity: every claim carries an attempt id that its
// caller made ([NewAttemptID]), and every write that ends or extends the
// attempt ([Store.Finish], [Store.Extend]) names it, with the fence the
// claim got. The store applies such a write only while that attempt holds
// the key: the record is in_progress with that attempt id and fence. So a
// caller whose answer was lost (a timeout, a cut connection) can read the
// key ([Store.Get]) and tell by [Record.AttemptID] whether its claim
// landed, and repeat a finishing write without ending anyone else's
// attempt.
//
// Fences never repeat for a key: a record's first fence comes from the
// store's clock in microseconds ([FirstFence]), and each claim or
// resolution adds one. A record deleted, swept or expired and claimed anew
// starts above every fence it had, as long as the store's clock does not
// go back by more than the time between the old record's last claim and
// its removal. A store may keep a stricter floor of its own.
//
// Times come from the store's clock where it has one, so workers with skewed
// clocks agree on leases. Expiry is checked on every call, whatever the
// backend's own TTL does: a record whose ExpiresAt has passed behaves as
// absent.
//
// Errors: [ErrLeaseLost] when the attempt a write names does not hold the
// key (it was taken over, resolved, finished, abandoned, deleted or
// expired); [ErrNotFound] from Get and admin calls on an absent key;
// [ErrCorrupt] for a record that cannot be decoded; [ErrInvalid] for a
// request the store refuses before sending it. Any other error means the
// store could not answer, and callers never read it as an outcome: a write
// may or may not have happened.
//
// The package idemtest holds the conformance suite every Store must pass.
type Store interface {
	// Claim takes the key for the attempt req names if the record is
	// absent, expired, released, or in_progress with a lapsed lease that
	// may be taken over: the record's policy is AtLeastOnce or
	// req.TakeLapsed is set, and the lapsed attempt was for the same
	// request (the record's Fingerprint or req.Fingerprint is empty, or
	// they are equal). A lapsed attempt with another fingerprint is never
	// taken over, whatever the policy and TakeLapsed: it may have done its
	// own request's effect. A released record is claimable with any
	// fingerprint: its last attempt ended and gave the key back.
	//
	// On success the record is in_progress with a new fence (fence+1, or
	// [FirstFence] for a new record), attempt+1, req's attempt id, owner,
	// fingerprint and policy, LeaseUntil = now+Lease, and ExpiresAt =
	// now+max(Lease, Retention); a journal entry is appended. Otherwise
	// nothing is written and the record is returned as found
	// ([ClaimResult.Answer] says what it means).
	Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error)
	// Finish ends the attempt req names with req.Outcome, in one
	// conditional write: completed (Result kept, ExpiresAt =
	// now+Retention), failed (Reason kept, ExpiresAt = now+Retention),
	// released (claimable at once, keeping fence, attempt count and
	// reason), or abandoned (the lease ends now without an outcome: the
	// record stays in_progress and is lapsed from now on, so its policy
	// decides; the record's AttemptID is cleared, so the attempt cannot
	// end twice). The attempt's journal entry records the outcome.
	//
	// ErrLeaseLost when the attempt does not hold the key; then the
	// attempt's journal entry, if it has not ended, is marked LateFinish
	// (it was still running after another took the key), unless Reason
	// says it never ran ([NotRunReason]).
	Finish(ctx context.Context, req FinishRequest) error
	// Extend renews the lease of the attempt req names to now+req.Lease
	// (and ExpiresAt to at least the same) and returns the new
	// LeaseUntil. A lapsed lease that nobody took over is renewed too.
	// ErrLeaseLost, and LateFinish, as for Finish.
	Extend(ctx context.Context, req ExtendRequest) (time.Time, error)
	// Get returns the record, or ErrNotFound if it is absent or expired.
	Get(ctx context.Context, key string) (Record, error)

	// List returns records in key order, for operators.
	List(ctx context.Context, q ListQuery) ([]Record, error)
	// Resolve decides a key by hand or by a reconciler (see
	// [ResolveRequest]): Done makes it completed with Result; not Done
	// makes it released. It adds one to the fence, so a holder still
	// running is refused. ErrLeaseLost when a condition of req fails;
	// ErrNotFound for an absent or expired record.
	Resolve(ctx context.Context, req ResolveRequest) (Record, error)
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
	Key string
	// AttemptID names the attempt: made by the caller before the claim is
	// sent ([NewAttemptID]), unique across processes and records. Required.
	AttemptID   string
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

// FinishRequest ends an attempt: see [Store.Finish].
type FinishRequest struct {
	Key       string
	Fence     int64  // the fence the attempt's claim got
	AttemptID string // the attempt's id, as claimed
	// Outcome is OutcomeCompleted, OutcomeFailed, OutcomeReleased or
	// OutcomeAbandoned.
	Outcome Outcome
	Result  []byte // completed: the result to replay to duplicates
	// Reason is recorded in the record and the journal entry: the
	// permanent error (failed), the last error (released, abandoned). ""
	// for completed.
	Reason string
	// Retention keeps a completed or failed record this long from now.
	Retention time.Duration
}

// ExtendRequest renews an attempt's lease: see [Store.Extend].
type ExtendRequest struct {
	Key       string
	Fence     int64
	AttemptID string
	Lease     time.Duration
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

// Answer is what a claim means to its caller (the claim outcomes of the
// design): run the operation, or answer without running it. See
// [ClaimResult.Answer].
type Answer uint8

const (
	// AnswerAcquired: run the operation. [ClaimResult.Takeover] says
	// whether the claim took over a lapsed attempt, which may have done
	// part or all of the effect.
	AnswerAcquired Answer = iota + 1
	// AnswerDuplicate: the key is completed; replay Record.Result.
	AnswerDuplicate
	// AnswerBusy: another attempt holds the key until Record.LeaseUntil.
	AnswerBusy
	// AnswerIndeterminate: an attempt lapsed without recording its
	// outcome, and the record's policy (AtMostOnce) does not run it again.
	AnswerIndeterminate
	// AnswerFailed: the key failed for good (Record.Reason).
	AnswerFailed
	// AnswerMismatch: the key was used for a different request (another
	// fingerprint), in any state but released.
	AnswerMismatch
)

func (a Answer) String() string {
	switch a {
	case AnswerAcquired:
		return "acquired"
	case AnswerDuplicate:
		return "duplicate"
	case AnswerBusy:
		return "busy"
	case AnswerIndeterminate:
		return "indeterminate"
	case AnswerFailed:
		return "failed"
	case AnswerMismatch:
		return "mismatch"
	}
	return "Answer(" + strconv.Itoa(int(a)) + ")"
}

// Answer says what the claim means to a caller whose request had
// fingerprint ("" for none): the one rule the idem Ledger and `idem serve`
// answer by. A different fingerprint is checked first: a key reused for
// another request is a mismatch whether it is completed, failed or in
// progress, running or lapsed (the store does not take a lapsed attempt
// over for another request). An in_progress record is indeterminate when
// its lease has passed at r.Now (the store did not take it over), busy
// otherwise.
//
// The error reports a result no store may give (a released record not
// taken, a status it does not know): a store bug, never an outcome.
func (r ClaimResult) Answer(fingerprint string) (Answer, error) {
	if r.Acquired {
		return AnswerAcquired, nil
	}
	rec := &r.Record
	switch rec.Status {
	case StatusCompleted, StatusFailed, StatusInProgress:
		if fingerprint != "" && rec.Fingerprint != "" && fingerprint != rec.Fingerprint {
			return AnswerMismatch, nil
		}
	}
	switch rec.Status {
	case StatusCompleted:
		return AnswerDuplicate, nil
	case StatusFailed:
		return AnswerFailed, nil
	case StatusInProgress:
		if rec.Lapsed(r.Now) {
			return AnswerIndeterminate, nil
		}
		return AnswerBusy, nil
	}
	return 0, fmt.Errorf("store: a claim of %q found a %q record and did not take it (a store bug)", rec.Key, rec.Status)
}

// ListQuery selects records for [Store.List]: the records that match every
// field set (the zero value of each field selects any record), in key
// order, after After, at most Limit. [ListQuery.Matches] is the rule every
// store applies, whether it filters in its engine or in Go. Expired records
// are never listed.
//
// Store authors: a store must apply every field. Status, Stuck,
// Indeterminate and After are cheap where the store has an index of keys
// by status; Prefix is a key range ([PrefixEnd]); UpdatedAfter and
// UpdatedBefore have no index in idem's stores, so a store reads records
// in key order until it has Limit that match (a store documents the cost).
type ListQuery struct {
	Status Status // "" for any
	// Stuck selects lapsed records ([Record.Lapsed]): in_progress records
	// whose lease has passed, lapsed AtLeastOnce attempts waiting for a
	// takeover and indeterminate AtMostOnce ones alike. The console and
	// `idem serve` call this filter "lapsed".
	Stuck bool
	// Indeterminate selects indeterminate records ([Record.Indeterminate]):
	// lapsed records whose policy (AtMostOnce) does not take them over; they
	// wait for a Reconcile hook or an operator's [ResolveRequest].
	Indeterminate bool
	// Prefix selects keys that begin with Prefix ("" for any).
	Prefix string
	// UpdatedAfter, when not zero, selects records whose UpdatedAt (their
	// last change, by the store's clock) is after it; UpdatedBefore, when
	// not zero, those whose UpdatedAt is before it. Both bounds are
	// exclusive.
	UpdatedAfter, UpdatedBefore time.Time
	// After is a cursor: only keys greater than After ("" for any).
	After string
	// Limit is the most records to return; 0 (or less) means
	// [DefaultListLimit].
	Limit int
}

// DefaultListLimit is the number of records [Store.List] returns for a
// [ListQuery] whose Limit is 0 or less.
const DefaultListLimit = 100

// PageSize returns q.Limit, or [DefaultListLimit] when it is 0 or less.
func (q ListQuery) PageSize() int {
	if q.Limit <= 0 {
		return DefaultListLimit
	}
	return q.Limit
}

// Check returns an error wrapping [ErrInvalid] if a store must refuse q:
// a Status that is not one of the four.
func (q ListQuery) Check() error {
	if q.Status != "" && !q.Status.Valid() {
		return fmt.Errorf("%w: list with unknown status %q", ErrInvalid, q.Status)
	}
	return nil
}

// Matches reports whether r, read at now (the store's clock), is one of
// the records q selects, Limit aside: not expired, its key after q.After
// and beginning with q.Prefix, and matching every filter q sets.
func (q ListQuery) Matches(r *Record, now time.Time) bool {
	switch {
	case r.Expired(now),
		q.After != "" && r.Key <= q.After,
		!strings.HasPrefix(r.Key, q.Prefix),
		q.Status != "" && r.Status != q.Status,
		q.Stuck && !r.Lapsed(now),
		q.Indeterminate && !r.Indeterminate(now),
		!q.UpdatedAfter.IsZero() && !r.UpdatedAt.After(q.UpdatedAfter),
		!q.UpdatedBefore.IsZero() && !r.UpdatedAt.Before(q.UpdatedBefore):
		return false
	}
	return true
}

// PrefixEnd returns the least key greater than every key that begins with
// prefix, for a store that selects [ListQuery.Prefix] as the key range
// [prefix, PrefixEnd(prefix)); "" when there is no such bound (an empty
// prefix, or one made only of the highest code point or byte). For a
// prefix that is valid UTF-8 the bound is valid UTF-8 too (its last code
// point is the next one, surrogates skipped), so a store whose keys are
// text (PostgreSQL) can use it; keys compare byte by byte, which is code
// point order for UTF-8. For another prefix it is the prefix with its
// last byte below 0xff incremented and what follows it cut.
func PrefixEnd(prefix string) string {
	if utf8.ValidString(prefix) {
		rs := []rune(prefix)
		for i := len(rs) - 1; i >= 0; i-- {
			if rs[i] == utf8.MaxRune {
				continue
			}
			next := rs[i] + 1
			if next == 0xD800 { // surrogates are not code points of UTF-8
				next = 0xE000
			}
			return string(rs[:i]) + string(next)
		}
		return ""
	}
	b := []byte(prefix)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1])
		}
	}
	return ""
}

// ResolveRequest is an operator's (or a reconciler's) decision on a key,
// for [Store.Resolve], with the conditions under which it applies.
type ResolveRequest struct {
	Key       string
	Done      bool          // the effect happened: completed with Result
	Result    []byte        // Done: the result to replay to duplicates
	Reason    string        // why, recorded in the journal and the record
	Retention time.Duration // Done: keep the record this long from now; 0 means [DefaultRetention]
	By        string        // who resolved it (journal owner)

	// The conditions; each one that fails is ErrLeaseLost. Leave them all
	// unset to overwrite a record whatever its state, on purpose.

	// Fence, when non-zero, must be the record's fence: the caller
	// resolves exactly the attempt (or decision) it inspected. Fences
	// never repeat for a key, so this names one attempt for good.
	Fence int64
	// AttemptID, when set, must be the attempt that holds the key: the
	// record is in_progress with this attempt id (a reconciler deciding
	// the attempt it holds).
	AttemptID string
	// InProgress refuses unless the record is in_progress, its lease
	// running or lapsed alike.
	InProgress bool
	// Lapsed refuses unless the record is in_progress and its lease has
	// passed: an operator who inspected a lapsed attempt does not decide
	// one that a late heartbeat has since revived.
	Lapsed bool
}

// BatchClaimer is implemented by stores that claim many keys in one round
// trip, for consumers that receive batches. Results are in request order; a
// per-key outcome is in its ClaimResult (a failure of one key alone in its
// Err), a store failure is the error.
type BatchClaimer interface {
	ClaimBatch(ctx context.Context, reqs []ClaimRequest) ([]ClaimResult, error)
}

// BatchFinisher is implemented by stores that end many attempts in one
// round trip. It does what [Store.Finish] does for each of reqs, which name
// distinct keys or not: errs[i] is nil when reqs[i] was recorded and
// [ErrLeaseLost] (or [ErrNotFound]) when its attempt no longer held the
// key. err is a store failure: then which were recorded is unknown, as
// after a failed Finish.
type BatchFinisher interface {
	FinishBatch(ctx context.Context, reqs []FinishRequest) (errs []error, err error)
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
	if !cr.Acquired {
		return nil
	}
	return s.Finish(ctx, UndoRequest(cr.Record, cr.Takeover, detail))
}

// UndoRequest is the request that ends an attempt that never ran fn: rec
// is the record its claim made (Key, Fence and AttemptID are read), and
// takeover says whether that claim took over a lapsed attempt. See
// [UndoClaim].
func UndoRequest(rec Record, takeover bool, detail string) FinishRequest {
	req := FinishRequest{Key: rec.Key, Fence: rec.Fence, AttemptID: rec.AttemptID, Outcome: OutcomeReleased, Reason: NotRunReason(detail)}
	if takeover {
		req.Outcome = OutcomeAbandoned
	}
	return req
}

// FirstFence is the fence of a record's first claim at now, the store's
// clock: now in microseconds since 1970, or floor+1 when that is higher
// (floor: the highest fence the store knows it gave out for a record it
// removed, or 0). Fences then count up by one from there, so a record
// deleted, swept or expired and claimed anew starts above every fence it
// had (see [Store]).
func FirstFence(now time.Time, floor int64) int64 { return max(now.UnixMicro(), floor+1, 1) }

// Check returns an error wrapping [ErrInvalid] if a store must refuse req:
// an empty key or attempt id, or a policy it does not know.
func (r ClaimRequest) Check() error {
	switch {
	case r.Key == "":
		return fmt.Errorf("%w: claim with an empty key", ErrInvalid)
	case r.AttemptID == "":
		return fmt.Errorf("%w: claim of %q without an attempt id", ErrInvalid, r.Key)
	case r.Policy != AtLeastOnce && r.Policy != AtMostOnce:
		return fmt.Errorf("%w: claim of %q with unknown policy %v", ErrInvalid, r.Key, r.Policy)
	}
	return nil
}

// Check returns an error wrapping [ErrInvalid] if a store must refuse req:
// an empty key or attempt id, or an outcome Finish does not record.
func (r FinishRequest) Check() error {
	switch {
	case r.Key == "":
		return fmt.Errorf("%w: finish with an empty key", ErrInvalid)
	case r.AttemptID == "":
		return fmt.Errorf("%w: finish of %q without an attempt id", ErrInvalid, r.Key)
	}
	switch r.Outcome {
	case OutcomeCompleted, OutcomeFailed, OutcomeReleased, OutcomeAbandoned:
		return nil
	}
	return fmt.Errorf("%w: finish of %q with outcome %q (want completed, failed, released or abandoned)", ErrInvalid, r.Key, r.Outcome)
}

// Check returns an error wrapping [ErrInvalid] if a store must refuse req:
// an empty key or attempt id.
func (r ExtendRequest) Check() error {
	switch {
	case r.Key == "":
		return fmt.Errorf("%w: extend with an empty key", ErrInvalid)
	case r.AttemptID == "":
		return fmt.Errorf("%w: extend of %q without an attempt id", ErrInvalid, r.Key)
	}
	return nil
}

// UndoLostClaim undoes req's claim if it landed although its caller never
// got the answer (a timeout, a cut connection, a context that ended after
// the store took the claim): it reads the key and, if req's attempt holds
// it, ends that attempt as not run ([UndoRequest]: a fresh claim is
// released, a takeover abandoned). found reports whether the claim was
// there to undo; err is the store's, from the read or the undo (then the
// caller may try again: a second call finds the claim, or finds it undone).
func UndoLostClaim(ctx context.Context, s Store, req ClaimRequest, detail string) (found bool, err error) {
	rec, err := s.Get(ctx, req.Key)
	switch {
	case errors.Is(err, ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	case rec.Status != StatusInProgress || req.AttemptID == "" || rec.AttemptID != req.AttemptID:
		return false, nil // it did not land, or not yet
	}
	e, _ := rec.EntryOf(req.AttemptID)
	return true, s.Finish(ctx, UndoRequest(rec, e.Takeover, detail))
}

// NewAttemptID returns a new attempt id: 128 random bits, base64url
// without padding (22 characters). The bits come from math/rand/v2's
// global generator, ChaCha8 seeded by the runtime from the operating
// system: unguessable and unique across processes, at a fraction of a
// system call's cost (a claim makes one).
func NewAttemptID() string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], mrand.Uint64())
	binary.LittleEndian.PutUint64(b[8:], mrand.Uint64())
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// FingerprintOf is the fingerprint idem.Fingerprint records for request
// (the hex SHA-256 of its bytes), for code that claims through a Store
// itself ([ClaimRequest.Fingerprint]) and must agree with Ledger callers on
// the same keys.
func FingerprintOf(request []byte) string {
	sum := sha256.Sum256(request)
	return hex.EncodeToString(sum[:])
}
