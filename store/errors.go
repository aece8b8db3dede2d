package store

import (
	"errors"
	"fmt"
)

// Errors a [Store] returns for outcomes. Any other error means the store
// could not answer, and callers never read it as an outcome.
var (
	// ErrLeaseLost: the attempt named by a finishing write or an extension
	// no longer holds the key (it was taken over, resolved, finished,
	// deleted or expired). The package idem exports it too.
	ErrLeaseLost = errors.New("idem: lease lost")
	// ErrNotFound: the store has no record for the key (or only an expired
	// one). Returned by Get and the admin calls.
	ErrNotFound = errors.New("idem: no record")
	// ErrCorrupt: a stored record cannot be decoded. It is never read as
	// "absent" or "not done". The error is a [*CorruptError].
	ErrCorrupt = errors.New("idem: corrupt record")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("idem: store closed")
	// ErrInvalid: the store refused a request before sending it: an empty
	// key or attempt id, an unknown policy or outcome. Nothing was written.
	ErrInvalid = errors.New("idem: invalid store request")
)

// CorruptError is returned (wrapping [ErrCorrupt]) by a store that cannot
// decode a record.
type CorruptError struct {
	Key    string
	Detail string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("idem: corrupt record for %q: %s", e.Key, e.Detail)
}

func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }
