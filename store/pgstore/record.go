package pgstore

import (
	"fmt"
	"time"

	"github.com/idemkit/idem/store"
)

// rawRecord is a row as scanned, before it is checked.
type rawRecord struct {
	key, status, policy, owner, fingerprint, reason string
	fence                                           int64
	attempt                                         int32
	result                                          []byte
	leaseUntil, expiresAt, createdAt, updatedAt     time.Time
	journal                                         []byte // nil: implicit (store.ImplicitEntry)
	correlation, attemptID                          string
}

// dest returns the scan destinations of the record columns, followed by
// extra.
func (r *rawRecord) dest(extra ...any) []any {
	return append([]any{&r.key, &r.status, &r.policy, &r.fence, &r.attempt, &r.owner, &r.fingerprint, &r.result,
		&r.reason, &r.leaseUntil, &r.expiresAt, &r.createdAt, &r.updatedAt, &r.journal, &r.correlation, &r.attemptID}, extra...)
}

// record checks the row and returns it as an store.Record, or an
// *store.CorruptError: a damaged row is never read as absent.
func (r *rawRecord) record() (store.Record, error) {
	corrupt := func(format string, args ...any) error {
		return &store.CorruptError{Key: r.key, Detail: fmt.Sprintf(format, args...)}
	}
	status, err := store.ParseStatus(r.status)
	if err != nil {
		return store.Record{}, corrupt("status %q is not one of in_progress, completed, failed, released", r.status)
	}
	policy, err := store.ParsePolicy(r.policy)
	if err != nil {
		return store.Record{}, corrupt("policy %q is not at_least_once or at_most_once", r.policy)
	}
	var journal []store.JournalEntry
	if r.journal != nil {
		if journal, err = store.UnmarshalJournal(r.journal); err != nil {
			return store.Record{}, corrupt("%v", err)
		}
	}
	rec := store.Record{
		Key:         r.key,
		Status:      status,
		Policy:      policy,
		Fence:       r.fence,
		AttemptID:   r.attemptID,
		Attempt:     int(r.attempt),
		Owner:       r.owner,
		Fingerprint: r.fingerprint,
		Result:      r.result,
		Reason:      r.reason,
		LeaseUntil:  r.leaseUntil.UTC(),
		ExpiresAt:   r.expiresAt.UTC(),
		CreatedAt:   r.createdAt.UTC(),
		UpdatedAt:   r.updatedAt.UTC(),
		Journal:     journal,
	}
	if r.journal == nil {
		// Implicit: the entry the columns say, as implicitJournalSQL
		// (sql.go) writes it out.
		rec.Journal = []store.JournalEntry{store.ImplicitEntry(&rec, r.correlation)}
	}
	return rec, nil
}
