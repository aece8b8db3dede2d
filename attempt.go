package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/idemkit/idem/store"
)

// The writes of an attempt whose answer may be lost. Every claim carries an
// attempt id the Ledger made, and every write that ends the attempt names
// it, so a write whose answer was lost (a timeout, a cut connection) can be
// sent again, and a claim whose answer was lost can be found by reading the
// key: neither is left to the lease as after a crash of the process.

// Retry pacing for writes whose answer was lost: the first retry after
// retryFirst, then twice the wait each time up to retryMax, each wait
// drawn between half and all of it. All within the call's finish timeout.
const (
	retryFirst = 20 * time.Millisecond
	retryMax   = time.Second
)

// end records how an attempt ended (req.Outcome), in a batch with other
// calls' completions under WithCoalescing. See write.
func (l *Ledger) end(ctx context.Context, req store.FinishRequest) error {
	return l.write(ctx, req.Key, req.AttemptID, req.Outcome, func(ctx context.Context) error { return l.finishOnce(ctx, req) })
}

// write sends a write that ends the attempt attemptID of key with
// outcome. A write whose answer was lost is sent again with backoff until
// ctx ends (the call's finish timeout): a retry that finds the attempt
// already ended with outcome (its own earlier try landed) is a success.
// It returns nil, ErrLeaseLost (or store.ErrNotFound) when the attempt no
// longer holds the key, or the store's last error when it could not be
// reached for the whole window; the key is then left to its lease.
func (l *Ledger) write(ctx context.Context, key, attemptID string, outcome store.Outcome, try func(context.Context) error) error {
	wait := retryFirst
	uncertain := false // an earlier try failed without saying: it may have landed
	for {
		err := try(ctx)
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrLeaseLost) || errors.Is(err, store.ErrNotFound) {
			if !uncertain {
				return err
			}
			rec, gerr := l.store.Get(ctx, key)
			switch {
			case gerr == nil:
				if e, ok := rec.EntryOf(attemptID); ok && e.Outcome == outcome {
					return nil // the earlier try landed
				}
				return err
			case errors.Is(gerr, store.ErrNotFound):
				return err
			}
			err = gerr // unknown yet: try again
		}
		if !retryable(err) {
			return err
		}
		uncertain = true
		if !sleep(ctx, jitter(wait)) {
			return err
		}
		wait = min(2*wait, retryMax)
	}
}

// finishOnce sends one finishing write: a completion through the batcher
// under WithCoalescing, anything else on its own.
func (l *Ledger) finishOnce(ctx context.Context, req store.FinishRequest) error {
	if l.completes == nil || req.Outcome != store.OutcomeCompleted {
		return l.store.Finish(ctx, req)
	}
	refused, err := l.completes.do(ctx, req)
	if err != nil {
		return err
	}
	return refused
}

// retryable reports whether a store error may be the store failing to
// answer (a write that may or may not have landed, a store out of reach),
// which another try may get past. The store's refusals (closed, a record
// it cannot decode, a request it will never take) are final.
func retryable(err error) bool {
	return !errors.Is(err, ErrClosed) && !errors.Is(err, ErrCorrupt) && !errors.Is(err, store.ErrInvalid)
}

// recoverClaim runs when a claim failed without an answer (cause): the
// claim may have landed all the same (the store committed it and the
// answer was lost, or the caller's context ended after the store took
// it). It reads the key, retrying while the store cannot answer, until the
// call's finish timeout: if the attempt req names holds the key, fn has
// not run, so it undoes the claim (store.UndoClaim's rule: a fresh claim
// is released, a takeover abandoned, both marked as not run). If the store
// stays out of reach, the key is left to its lease, and the log says so.
//
// A claim cut short by the caller's context may still be on its way to
// the store's commit (a statement the server finishes after the client
// left): then the key is read again later, in the background, once after
// a second and once after the finish timeout.
func (l *Ledger) recoverClaim(ctx context.Context, c *callConfig, req store.ClaimRequest, cause error) {
	if !retryable(cause) {
		return // refused before anything was written, or a record it cannot decode
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout(req.Lease))
	defer cancel()
	if l.undoLostClaim(rctx, c, req, cause) || ctx.Err() == nil {
		return
	}
	go func() {
		for _, after := range []time.Duration{time.Second, finishTimeout(req.Lease)} {
			t := time.NewTimer(after)
			<-t.C
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout(req.Lease))
			found := l.undoLostClaim(rctx, c, req, cause)
			cancel()
			if found {
				return
			}
		}
	}()
}

// undoLostClaim undoes req's claim if it holds the key (see
// recoverClaim), retrying while the store cannot answer. It reports
// whether it is done with the key: the claim was found (and undone, or
// could not be), or the store could not be read for the whole of ctx.
func (l *Ledger) undoLostClaim(ctx context.Context, c *callConfig, req store.ClaimRequest, cause error) (done bool) {
	wait := retryFirst
	rec := Record{Key: req.Key, AttemptID: req.AttemptID}
	for {
		found, err := l.undoSafely(ctx, req, "the claim's answer was lost: "+cause.Error())
		switch {
		case err == nil && found:
			l.logNote(ctx, slog.LevelWarn, "claim-undone", c, rec, slog.Any("error", cause),
				slog.String("msg_detail", "the claim landed though its answer was lost; fn did not run, so the claim is undone"))
			return true
		case err == nil:
			return false
		case errors.Is(err, ErrLeaseLost):
			return true // the attempt ended meanwhile (undone by another try, taken over, resolved)
		case !retryable(err):
			l.logNote(ctx, slog.LevelWarn, "claim-lost", c, rec, slog.Any("error", err),
				slog.String("msg_detail", "the claim's answer was lost and it could not be undone: if it landed, the key waits for its lease"))
			return true
		}
		if !sleep(ctx, jitter(wait)) {
			l.logNote(ctx, slog.LevelWarn, "claim-lost", c, rec, slog.Any("error", err),
				slog.String("msg_detail", "the claim's answer was lost and the store stayed out of reach: if it landed, the key waits for its lease"))
			return true
		}
		wait = min(2*wait, retryMax)
	}
}

// undoSafely is store.UndoLostClaim off the caller's goroutine (see
// endSafely): a panic in the store is the undo's failure.
func (l *Ledger) undoSafely(ctx context.Context, req store.ClaimRequest, detail string) (found bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the store panicked: %v", p)
		}
	}()
	return store.UndoLostClaim(ctx, l.store, req, detail)
}

// releaseOrphan ends the attempt of a claim acquired for a caller that had
// left (its context ended while the claim was on its way): fn never ran,
// so the claim is undone (store.UndoClaim's rule). Either way the reason
// marks the attempt as not run, so a later Reconcile hook is asked about
// the attempt before it.
func (l *Ledger) releaseOrphan(req store.ClaimRequest, cr store.ClaimResult) {
	if !cr.Acquired {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), finishTimeout(req.Lease))
	defer cancel()
	if err := l.endSafely(ctx, store.UndoRequest(cr.Record, cr.Takeover, "the caller left before its claim was answered")); err != nil {
		l.log.LogAttrs(ctx, slog.LevelWarn, "idem: releasing an orphaned claim failed; the key waits for its lease",
			l.LogKey(req.Key), slog.Int64("fence", cr.Record.Fence), slog.String("correlation_id", req.Correlation), slog.Any("error", err))
	}
}

// endSafely is end for writes made off the caller's goroutine (a
// coalescing flight's, a background check's), where a panic in the store
// would reach no caller and end the process: a panic is the write's
// failure.
func (l *Ledger) endSafely(ctx context.Context, req store.FinishRequest) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the store panicked: %v", p)
		}
	}()
	return l.end(ctx, req)
}

// jitter returns a wait between d/2 and d.
func jitter(d time.Duration) time.Duration { return d/2 + rand.N(d/2+1) }

// sleep waits d, or until ctx ends: it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
