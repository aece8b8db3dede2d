package idem

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/store"
)

var (
	// ErrInProgress: another attempt holds the key and its lease is running.
	// Retry later (nack with a delay; HTTP 409 with Retry-After). The error
	// is an [*InProgressError], which says until when.
	ErrInProgress = errors.New("idem: operation in progress")
	// ErrMismatch: the key was already used for a request with a different
	// fingerprint. The caller reused a key for a different operation.
	ErrMismatch = errors.New("idem: key reused with a different request")
	// ErrIndeterminate: an attempt under [AtMostOnce] started and never
	// finished, so its effect may or may not have happened. The key is not run
	// again until a Reconcile hook or an operator resolves it. The error is an
	// [*IndeterminateError].
	ErrIndeterminate = errors.New("idem: outcome of an earlier attempt is unknown")
	// ErrLeaseLost: the attempt's lease passed and the key was taken over (or
	// resolved, or deleted); the holder's writes are refused. Returned by
	// [Ledger.Do] when a heartbeat or the completion finds the lease lost.
	ErrLeaseLost = store.ErrLeaseLost
	// ErrInvalidKey: the key is empty, has an empty part, is too long, or is
	// not valid UTF-8. Nothing was sent to the store.
	ErrInvalidKey = errors.New("idem: invalid key")
	// ErrFailed: the key failed permanently on an earlier attempt; the error
	// is a [*FailedError] carrying the stored reason.
	ErrFailed = errors.New("idem: operation failed permanently")
	// ErrCorrupt: a stored record cannot be decoded. It is never read as
	// "absent" or "not done". The error is a [*CorruptError].
	ErrCorrupt = store.ErrCorrupt
	// ErrClosed: the store was closed.
	ErrClosed = store.ErrClosed
	// ErrNotTransactional: [DoTx] was called on a Ledger whose store does not
	// implement [store.TxStore] for the requested transaction type.
	ErrNotTransactional = errors.New("idem: store does not run transactions of this type")
)

// InProgressError is returned (wrapping [ErrInProgress]) when another
// attempt holds the key.
type InProgressError struct {
	Key        string
	Fence      int64
	Attempt    int
	Owner      string
	LeaseUntil time.Time     // when the holder's lease ends, by the store's clock
	RetryAfter time.Duration // LeaseUntil minus the store's now (at least 1 ms)
	// Started is when the holder's attempt began, by the store's clock,
	// from its journal entry; zero when the store did not return it.
	Started time.Time
	// Running is how long the holder has run: the store's now minus
	// Started (0 when Started is zero). A holder that has just started
	// likely ends soon; one that has run for a while likely runs about as
	// long again. queue.Consumer spaces its busy retries by it.
	Running time.Duration
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("idem: %q in progress (attempt %d, fence %d, owner %s), retry after %v",
		e.Key, e.Attempt, e.Fence, e.Owner, e.RetryAfter)
}

func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// IndeterminateError is returned (wrapping [ErrIndeterminate]) when an
// earlier [AtMostOnce] attempt lapsed without recording its outcome.
type IndeterminateError struct {
	Key     string
	Fence   int64
	Attempt int
	Owner   string    // the holder that never finished
	Since   time.Time // when its lease ended
	Reason  string    // the error it reported, if it reported one
}

func (e *IndeterminateError) Error() string {
	s := fmt.Sprintf("idem: %q indeterminate: attempt %d (fence %d, owner %s) lapsed at %s without recording its outcome; resolve it (idem resolve)",
		e.Key, e.Attempt, e.Fence, e.Owner, e.Since.UTC().Format(time.RFC3339Nano))
	if e.Reason != "" {
		s += ": last error: " + e.Reason
	}
	return s
}

func (e *IndeterminateError) Is(target error) bool { return target == ErrIndeterminate }

// FailedError is returned (wrapping [ErrFailed]) to every call on a key that
// an earlier attempt marked failed with [Permanent].
type FailedError struct {
	Key     string
	Reason  string // the permanent error's text, as stored
	Attempt int
	Fence   int64
}

func (e *FailedError) Error() string {
	return fmt.Sprintf("idem: %q failed permanently on attempt %d: %s", e.Key, e.Attempt, e.Reason)
}

func (e *FailedError) Is(target error) bool { return target == ErrFailed }

// MismatchError is returned (wrapping [ErrMismatch]) when a key is reused
// with a different fingerprint, while its record is completed, failed or in
// progress, a lapsed attempt included (Status says which). A released
// record is not a mismatch: the next call runs under its own fingerprint.
type MismatchError struct {
	Key    string
	Status Status // the stored record's status
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("idem: %q was already used (%s) with a different request", e.Key, e.Status)
}

func (e *MismatchError) Is(target error) bool { return target == ErrMismatch }

// StoreError wraps every error that comes from the store. Whatever the store
// said, a StoreError is never an outcome: the operation may or may not have
// run, and the key is left for its lease and policy to decide.
type StoreError struct {
	Op  string // claim, complete, fail, release, abandon, extend, get
	Key string
	Err error
}

func (e *StoreError) Error() string {
	return fmt.Sprintf("idem: store %s %q: %v", e.Op, e.Key, e.Err)
}

func (e *StoreError) Unwrap() error { return e.Err }

// CorruptError is returned (wrapping [ErrCorrupt]) by a store that cannot
// decode a record.
type CorruptError = store.CorruptError

// PermanentError marks an error from fn as permanent; see [Permanent].
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as permanent: returned from fn, it marks the key
// failed, and every later call for the key gets a [*FailedError] with err's
// text instead of running again (until the record's retention passes).
// Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// NotDoneError marks an error from fn as "nothing happened"; see [NotDone].
type NotDoneError struct{ Err error }

func (e *NotDoneError) Error() string { return e.Err.Error() }
func (e *NotDoneError) Unwrap() error { return e.Err }

// NotDone tells the Ledger that fn failed before its effect could happen (a
// refused connection, a validation error before the send), so the key is
// released for a retry even under [AtMostOnce]. Under [AtLeastOnce] every
// non-permanent error already releases the key. NotDone(nil) is nil.
func NotDone(err error) error {
	if err == nil {
		return nil
	}
	return &NotDoneError{Err: err}
}
