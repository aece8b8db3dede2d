package idem

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkit/idem/store"
)

// Run is [Ledger.Do] for typed results: fn's value is stored as JSON, and
// every call returns the stored value decoded, the first as well as its
// duplicates, so that they all see the same T (a field JSON leaves out, such
// as one tagged `json:"-"`, is zero in every answer, not only in the
// replays). If the value cannot be encoded after fn succeeded, or its JSON
// does not decode back into a T (an interface-typed field, a failing
// UnmarshalJSON), the effect has happened but cannot be recorded in a form
// a duplicate could read: the attempt is abandoned (left for the policy to
// decide, like a crash) and the error returned. Recording it would make the
// key answer every duplicate with a decoding error until it expires.
func Run[T any](ctx context.Context, l *Ledger, key OperationKey, fn func(ctx context.Context) (T, error), opts ...CallOption) (T, Result, error) {
	var (
		fresh T
		ran   bool
	)
	res, err := l.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
		v, err := fn(ctx)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, abandonError{err: fmt.Errorf("idem: encoding the result of %q as JSON: %w", key.s, err)}
		}
		var back T
		if err := json.Unmarshal(b, &back); err != nil {
			return nil, abandonError{err: fmt.Errorf("idem: the JSON of the result of %q does not decode back into %T, so duplicates could not read it: %w", key.s, back, err)}
		}
		fresh, ran = back, true
		return b, nil
	}, opts...)
	var zero T
	if err != nil {
		return zero, res, err
	}
	if ran && !res.Replayed && !res.Reconciled {
		return fresh, res, nil
	}
	var v T
	if err := json.Unmarshal(res.Value, &v); err != nil {
		return zero, res, fmt.Errorf("idem: decoding the stored result of %q into %T: %w", key.s, v, err)
	}
	return v, res, nil
}

// DoTx runs fn exactly once for key inside one transaction of the ledger's
// store: the claim, fn's own writes through tx, and the completion commit
// together or not at all. An effect that lives in the same database (a row,
// a balance, an outbox message) therefore happens exactly once, even across
// crashes: there is no window between the effect and its record.
//
// Tx is the store's transaction type, e.g. *sql.Tx for sqlitestore. If the
// store does not run transactions of that type, DoTx returns
// [ErrNotTransactional].
//
// When fn returns an error the transaction rolls back and the key is left as
// it was; nothing is recorded, not even a [Permanent] error, and the error is
// returned unchanged. Concurrent calls for one key are serialized by the
// database: one commits, the others then see the key completed (Replayed).
// No heartbeat runs: the claim is invisible to others until it commits.
//
// With an [Observer] attached, the call is an OpStart and an OpEnd, as for
// [Ledger.Do]; a rolled-back call's Outcome is "rolled-back".
func DoTx[Tx any](ctx context.Context, l *Ledger, key OperationKey, fn func(ctx context.Context, tx Tx) ([]byte, error), opts ...CallOption) (_ Result, err error) {
	if err := key.Err(); err != nil {
		return Result{}, err
	}
	ts, ok := l.store.(store.TxStore[Tx])
	if !ok {
		var tx Tx
		return Result{}, fmt.Errorf("%w: %T with %T", ErrNotTransactional, l.store, tx)
	}
	c := l.callConfig(opts)
	if c.correlation == "" {
		c.correlation = newCorrelationID()
	}
	start := time.Now()
	if l.observer != nil {
		ctx = l.opStart(ctx, key.s, c, start)
		defer func() { l.opEnd(ctx, c, start, err) }()
	}
	var fnErr error
	called := false
	cr, val, err := ts.InTx(ctx, l.claimRequest(key.s, c), c.retention, func(ctx context.Context, tx Tx) ([]byte, error) {
		called = true
		v, err := fn(ctx, tx)
		fnErr = err
		return v, err
	})
	if err != nil {
		if called && fnErr != nil {
			l.logOutcome(ctx, slog.LevelInfo, "rolled-back", c, cr.Record, slog.String("reason", fnErr.Error()))
			return Result{}, fnErr
		}
		return Result{}, l.storeError(ctx, "claim-tx", key.s, c, cr.Record, err)
	}
	if !cr.Acquired {
		return l.found(ctx, key.s, c, cr)
	}
	rec := cr.Record
	c.takeover = cr.Takeover
	l.logOutcome(ctx, slog.LevelInfo, "executed", c, rec, slog.Bool("takeover", cr.Takeover), slog.Bool("transactional", true), slog.Duration("took", time.Since(start)))
	return Result{Value: val, Attempt: rec.Attempt, Fence: rec.Fence, Takeover: cr.Takeover}, nil
}
