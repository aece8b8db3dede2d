package idem

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/store"
)

// Ledger runs operations once per key on a [store.Store]. It is safe for
// concurrent use; make one per store and share it.
type Ledger struct {
	store      store.Store
	defaults   callConfig
	log        *slog.Logger
	owner      string
	hashedKeys bool
	observer   Observer
	cache      *resultCache
	// claims and completes coalesce concurrent calls' store writes
	// (WithCoalescing); nil sends each call's own.
	claims    *batcher[store.ClaimRequest, store.ClaimResult]
	completes *batcher[store.FinishRequest, error]
}

// Result is what [Ledger.Do] returns for an operation that is done.
type Result struct {
	// Value is the operation's result: fresh from fn, or replayed from the
	// store or cache. A replayed Value may be shared: do not modify it.
	Value []byte
	// Replayed is true when fn did not run because the key was already
	// completed ("skipped, already done").
	Replayed bool
	// Attempt and Fence identify the attempt that produced Value.
	Attempt int
	Fence   int64
	// Takeover is true when this call took over a lapsed attempt: the
	// earlier attempt may have done part or all of the effect.
	Takeover bool
	// Reconciled is true when a Reconcile hook found the lapsed attempt's
	// effect done and Value is what it returned (fn did not run).
	Reconciled bool
}

// New returns a Ledger on store. Defaults: lease [DefaultLease], retention
// [DefaultRetention], policy [AtLeastOnce], no cache, [slog.Default], owner
// "hostname:pid".
func New(s store.Store, opts ...Option) *Ledger {
	c := config{call: callConfig{lease: DefaultLease, retention: DefaultRetention, policy: AtLeastOnce}}
	for _, o := range opts {
		o.applyLedger(&c)
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	if c.owner == "" {
		host, _ := os.Hostname()
		c.owner = host + ":" + strconv.Itoa(os.Getpid())
	}
	l := &Ledger{store: s, defaults: c.call, log: c.logger, owner: c.owner, hashedKeys: c.hashedKeys, observer: c.observer}
	if c.cacheSize > 0 {
		l.cache = newResultCache(c.cacheSize)
	}
	if c.coalesce > 1 {
		from := c.coalesceFrom
		if from < 1 {
			from = DefaultCoalescingFrom
		}
		l.coalesce(c.coalesce, from)
	}
	return l
}

// coalesce sets up the batchers of [WithCoalescing] for what the store can
// batch.
func (l *Ledger) coalesce(size, from int) {
	if bc, ok := l.store.(store.BatchClaimer); ok {
		l.claims = &batcher[store.ClaimRequest, store.ClaimResult]{
			size:     size,
			flights:  coalescingFlights,
			from:     from,
			minBatch: coalesceMinBatch,
			bound: func(rs []store.ClaimRequest) time.Duration {
				var lease time.Duration
				for _, r := range rs {
					lease = max(lease, r.Lease)
				}
				return finishTimeout(lease)
			},
			one:    l.store.Claim,
			many:   bc.ClaimBatch,
			orphan: l.releaseOrphan,
		}
	}
	if bf, ok := l.store.(store.BatchFinisher); ok {
		l.completes = &batcher[store.FinishRequest, error]{
			size:     size,
			flights:  coalescingFlights,
			from:     from,
			minBatch: coalesceMinBatch,
			bound:    func([]store.FinishRequest) time.Duration { return finishTimeout(0) },
			one: func(ctx context.Context, r store.FinishRequest) (error, error) {
				err := l.store.Finish(ctx, r)
				if errors.Is(err, ErrLeaseLost) || errors.Is(err, store.ErrNotFound) {
					return err, nil // the attempt's answer, not the store's failure
				}
				return nil, err
			},
			many:   bf.FinishBatch,
			orphan: func(store.FinishRequest, error) {},
		}
	}
}

// claim claims for one call, in a batch with others' under WithCoalescing.
func (l *Ledger) claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	var (
		cr  store.ClaimResult
		err error
	)
	if l.claims == nil {
		cr, err = l.store.Claim(ctx, req)
	} else {
		cr, err = l.claims.do(ctx, req)
		if err == nil && cr.Err != nil {
			return store.ClaimResult{}, cr.Err // this key's own failure (a corrupt record)
		}
	}
	if err == nil && ctx.Err() != nil {
		// The caller left while its claim was on its way (a coalesced
		// answer reached the batcher before the caller did; a store
		// answered after the context ended): fn must not start on a
		// context that is over (under AtMostOnce its error would leave the
		// key indeterminate though nothing was tried).
		l.releaseOrphan(req, cr)
		return store.ClaimResult{}, context.Cause(ctx)
	}
	return cr, err
}

// Store returns the ledger's store.
func (l *Ledger) Store() store.Store { return l.store }

// Owner returns the name this ledger claims keys under.
func (l *Ledger) Owner() string { return l.owner }

// Lease returns the lease a call gets unless it passes [WithLease].
func (l *Ledger) Lease() time.Duration { return l.defaults.lease }

// Retention returns the retention a call gets unless it passes
// [WithRetention].
func (l *Ledger) Retention() time.Duration { return l.defaults.retention }

// FinishTimeout returns how long [Ledger.Do], called with opts, may still
// take once fn has returned, with a store that honours its context: a
// heartbeat under way ends (its extension is bounded by a third of the
// lease), then the writes that end the attempt (complete, release, fail or
// abandon, after a read when the lease ran out here, and their retries
// while the store cannot answer) share one timeout of the call's lease, at
// least 5 s. A claim that failed is followed by reads (and an undo) within
// the same timeout. Past it, Do has returned or its store
// ignores its context. Packages that keep something alive for a call (a
// queue delivery kept invisible) keep it this long past fn's end.
func (l *Ledger) FinishTimeout(opts ...CallOption) time.Duration {
	lease := l.defaults.lease
	if len(opts) > 0 || l.defaults.leaseCap > 0 {
		lease = l.callConfig(opts).lease // a queue consumer asks once a message: the usual case allocates nothing
	}
	return heartbeatInterval(lease) + finishTimeout(lease)
}

// Do runs fn once for key and records its result, so that every later call
// for the key gets the same result without running fn:
//
//   - the key is new (absent, expired or released): fn runs under a lease,
//     which is extended while fn runs; its result is recorded and returned.
//     A released key runs under this call's fingerprint, whatever the
//     last attempt's was: that attempt ended and gave the key back.
//   - the key is completed: the stored result is returned, Replayed=true.
//   - another attempt holds the key: [ErrInProgress]; retry later.
//   - an earlier attempt lapsed (it crashed): under AtLeastOnce this call
//     takes over and runs fn (Takeover=true); under AtMostOnce it returns
//     [ErrIndeterminate]. A Reconcile hook decides instead, under either.
//     Only the same request takes over (see the mismatch below).
//   - the key failed permanently: a [*FailedError] with the stored reason.
//   - the key was used with a different [Fingerprint]: [ErrMismatch], in
//     any state it is found in (a lapsed attempt included), before any
//     other answer; fn and the hook do not run and the record is left as
//     it is. A call without a fingerprint, or a record stored without
//     one, is never a mismatch.
//
// When fn returns an error, Do returns it unchanged after recording what it
// means: a [Permanent] error fails the key; under AtLeastOnce any other error
// releases it for a retry; under AtMostOnce it leaves the key indeterminate
// unless wrapped in [NotDone]. A panic in fn is treated like an error, then
// re-panics. If the store refuses a heartbeat (another attempt took the
// key), fn's context is cancelled and Do returns [ErrLeaseLost] without
// recording anything. If heartbeats cannot reach the store before the lease
// runs out, fn's context is cancelled too, and what fn returns is recorded
// only if the store still shows this attempt holding the key (else
// ErrLeaseLost).
//
// A store error is wrapped in a [*StoreError] and returned: never read as an
// outcome. Before it returns one, Do undoes a claim that landed without its
// answer (fn did not run) and sends a write that ends the attempt again,
// within [Ledger.FinishTimeout]; only a store out of reach for that whole
// window leaves the key to its lease and policy. If ctx ends before the
// claim is answered, fn does not run and Do returns ctx's error (wrapped
// likewise). docs/design.md ("Guarantees under crashes and store faults")
// goes through each case.
//
// With an [Observer] attached ([WithObserver]), the call is an OpStart
// event (fn and the store get the context it returns) and one OpEnd; an
// invalid key returns before either.
func (l *Ledger) Do(ctx context.Context, key OperationKey, fn func(ctx context.Context) ([]byte, error), opts ...CallOption) (Result, error) {
	if err := key.Err(); err != nil {
		return Result{}, err
	}
	if l.cache != nil && !hasClaimed(opts) {
		if res, ok, err := l.fromCache(ctx, key.s, opts); ok || err != nil {
			return res, err
		}
	}
	return l.do(ctx, key, fn, opts)
}

// do is Do past the cache. It is a function of its own so that a cache
// hit does not pay for its defer.
func (l *Ledger) do(ctx context.Context, key OperationKey, fn func(ctx context.Context) ([]byte, error), opts []CallOption) (_ Result, err error) {
	start := time.Now()
	c := l.callConfig(opts)
	if c.claimed != nil {
		// Claimed on the call's behalf (WithClaimed): its request says
		// what the record was claimed under.
		req := c.claimed.Request
		c.correlation, c.policy, c.fingerprint, c.lease = req.Correlation, req.Policy, req.Fingerprint, req.Lease
		if !c.claimed.Sent.IsZero() {
			start = c.claimed.Sent
		}
	} else if c.correlation == "" {
		c.correlation = newCorrelationID()
	}
	if l.observer != nil {
		ctx = l.opStart(ctx, key.s, c, start)
		defer func() { l.opEnd(ctx, c, start, err) }() // also when fn panics
	}
	var cr store.ClaimResult
	if c.claimed != nil {
		if _, cr, err = l.claimedClaim(ctx, key.s, c); errors.Is(err, ErrLeaseLost) {
			return Result{}, err // not run: the claim waited out its lease
		} else if err != nil {
			return Result{}, l.storeError(ctx, "claim", key.s, c, Record{}, err)
		}
	} else {
		req := l.claimRequest(key.s, c)
		cr, err = l.claim(ctx, req)
		if err != nil {
			serr := l.storeError(ctx, "claim", key.s, c, Record{}, err)
			l.recoverClaim(ctx, c, req, err)
			return Result{}, serr
		}
	}
	if !cr.Acquired {
		return l.found(ctx, key.s, c, cr)
	}
	rec := cr.Record
	if cr.Takeover {
		c.takeover = true
		l.logTakeover(ctx, c, rec)
	}
	var reconciled bool
	work := fn
	if c.reconcile != nil && (cr.Takeover || releasedWithError(rec)) {
		work = func(ctx context.Context) ([]byte, error) {
			v, done, err := reconcile(ctx, c.reconcile, lapsedOf(rec))
			if err != nil {
				return nil, abandonError{err: fmt.Errorf("idem: reconcile %q: %w", rec.Key, err), notRun: true}
			}
			if done {
				reconciled = true
				return v, nil
			}
			return fn(ctx)
		}
	}
	val, err := l.run(ctx, c, rec, start, work, &reconciled)
	if err != nil {
		return Result{}, err
	}
	res := Result{Value: val, Attempt: rec.Attempt, Fence: rec.Fence, Takeover: cr.Takeover, Reconciled: reconciled}
	if reconciled {
		res.Fence++ // recorded by Resolve, which bumps the fence
	}
	if l.cache != nil {
		// A copy: the caller owns the fresh Value and may change it.
		l.cache.put(rec.Key, cacheEntry{value: append([]byte(nil), val...), fingerprint: c.fingerprint, attempt: res.Attempt, fence: res.Fence, expires: start.Add(c.retention)})
	}
	outcome, logged := "executed", rec
	if reconciled {
		outcome, logged.Fence = "reconciled", res.Fence
	}
	l.logOutcome(ctx, slog.LevelInfo, outcome, c, logged, slog.Bool("takeover", cr.Takeover), slog.Duration("took", time.Since(start)))
	return res, nil
}

func (l *Ledger) claimRequest(key string, c *callConfig) store.ClaimRequest {
	return store.ClaimRequest{
		Key:         key,
		AttemptID:   store.NewAttemptID(),
		Owner:       l.owner,
		Correlation: c.correlation,
		Policy:      c.policy,
		Lease:       c.lease,
		Retention:   c.retention,
		Fingerprint: c.fingerprint,
		TakeLapsed:  c.reconcile != nil,
	}
}

// callConfig returns the ledger's defaults with opts applied.
func (l *Ledger) callConfig(opts []CallOption) *callConfig {
	var c *callConfig
	if l.observer != nil {
		oc := new(observedCall)
		c = &oc.call
		*c = l.defaults
		c.obs = &oc.op
	} else {
		c = new(callConfig)
		*c = l.defaults
	}
	for _, o := range opts {
		o.applyCall(c)
	}
	if c.leaseCap > 0 {
		c.lease = min(c.lease, c.leaseCap)
		c.leaseEnd = time.Now().Add(c.leaseCap)
	}
	return c
}

// fromCache answers from the local cache. With no options, no Observer
// and debug logging off, a hit allocates nothing; a no-op Observer adds
// nothing.
func (l *Ledger) fromCache(ctx context.Context, key string, opts []CallOption) (Result, bool, error) {
	now := time.Now()
	e, ok := l.cache.get(key, now)
	if !ok {
		return Result{}, false, nil
	}
	logging := l.logger(ctx).Enabled(ctx, slog.LevelDebug)
	if len(opts) == 0 && !logging && l.observer == nil {
		return Result{Value: e.value, Replayed: true, Attempt: e.attempt, Fence: e.fence}, true, nil
	}
	return l.replayCached(ctx, key, e, opts, logging, now)
}

// replayCached is fromCache's answer for a call with options, debug
// logging or an Observer: apart, so that the plain hit stays small.
func (l *Ledger) replayCached(ctx context.Context, key string, e cacheEntry, opts []CallOption, logging bool, now time.Time) (Result, bool, error) {
	res := Result{Value: e.value, Replayed: true, Attempt: e.attempt, Fence: e.fence}
	c := &l.defaults // read only: the call's outcome is not recorded in it (see logNote)
	if len(opts) > 0 {
		c = l.callConfig(opts)
	}
	var ev Event
	if l.observer != nil {
		k, hashed := l.ObservedKey(key)
		ev = Event{Kind: OpStart, Key: k, KeyHashed: hashed, Policy: c.policy, Correlation: c.correlation, Started: now}
		if next := l.observer.Observe(ctx, ev); next != nil {
			ctx = next
		}
	}
	rec := Record{Key: key, Fence: e.fence, Attempt: e.attempt}
	var err error
	ev.Outcome = "replayed"
	if c.fingerprint != "" && e.fingerprint != "" && c.fingerprint != e.fingerprint {
		res, err, ev.Outcome = Result{}, &MismatchError{Key: key, Status: StatusCompleted}, "mismatch"
		l.logNote(ctx, slog.LevelWarn, "mismatch", c, rec, slog.String("status", string(StatusCompleted)))
	} else if logging {
		l.logNote(ctx, slog.LevelDebug, "replayed", c, rec, slog.String("msg_detail", "skipped, already done (cache)"))
	}
	if l.observer != nil {
		ev.Kind, ev.Fence, ev.Attempt, ev.Err, ev.Duration = OpEnd, e.fence, e.attempt, err, time.Since(now)
		l.observer.Observe(ctx, ev)
	}
	return res, err == nil, err
}

// found turns a claim that was not acquired into the caller's answer
// ([store.ClaimResult.Answer]), and logs it.
func (l *Ledger) found(ctx context.Context, key string, c *callConfig, cr store.ClaimResult) (Result, error) {
	rec := cr.Record
	answer, err := cr.Answer(c.fingerprint)
	switch answer {
	case store.AnswerDuplicate:
		if l.cache != nil {
			l.cache.put(key, cacheEntry{value: rec.Result, fingerprint: rec.Fingerprint, attempt: rec.Attempt, fence: rec.Fence,
				expires: time.Now().Add(rec.ExpiresAt.Sub(cr.Now))})
		}
		l.logOutcome(ctx, slog.LevelDebug, "replayed", c, rec, slog.String("msg_detail", "skipped, already done"))
		return Result{Value: rec.Result, Replayed: true, Attempt: rec.Attempt, Fence: rec.Fence}, nil
	case store.AnswerMismatch:
		// Say what the record is: a key held by an attempt of another
		// request, running or lapsed (a crashed attempt blocks the key
		// until the same request, retention or an operator), reads apart
		// from a key reused after it finished.
		if rec.Status == StatusInProgress {
			l.logOutcome(ctx, slog.LevelWarn, "mismatch", c, rec, slog.String("status", string(rec.Status)),
				slog.String("holder", rec.Owner), slog.Bool("lapsed", rec.Lapsed(cr.Now)))
		} else {
			l.logOutcome(ctx, slog.LevelWarn, "mismatch", c, rec, slog.String("status", string(rec.Status)))
		}
		return Result{}, &MismatchError{Key: key, Status: rec.Status}
	case store.AnswerFailed:
		l.logOutcome(ctx, slog.LevelDebug, "failed", c, rec, slog.String("reason", rec.Reason))
		return Result{}, &FailedError{Key: key, Reason: rec.Reason, Attempt: rec.Attempt, Fence: rec.Fence}
	case store.AnswerIndeterminate:
		ie := indeterminate(rec)
		l.logOutcome(ctx, slog.LevelWarn, "indeterminate", c, rec, slog.String("holder", ie.Owner), slog.String("reason", ie.Reason),
			slog.Int64("lapsed_fence", ie.Fence), slog.Int("lapsed_attempt", ie.Attempt))
		return Result{}, ie
	case store.AnswerBusy:
		retry := max(rec.LeaseUntil.Sub(cr.Now), time.Millisecond)
		l.logOutcome(ctx, slog.LevelDebug, "busy", c, rec, slog.String("holder", rec.Owner), slog.Duration("retry_after", retry))
		busy := &InProgressError{Key: key, Fence: rec.Fence, Attempt: rec.Attempt, Owner: rec.Owner, LeaseUntil: rec.LeaseUntil, RetryAfter: retry}
		if e, ok := rec.EntryOf(rec.AttemptID); ok && !e.Started.IsZero() {
			busy.Started, busy.Running = e.Started, max(cr.Now.Sub(e.Started), 0)
		}
		return Result{}, busy
	}
	if err == nil {
		err = fmt.Errorf("store: a claim of %q answered %v without acquiring it (a store bug)", key, answer)
	}
	return Result{}, l.storeError(ctx, "claim", key, c, rec, err)
}

// indeterminate describes the lapsed attempt of rec (in_progress, lapsed,
// not taken over) that may have done the effect: the newest attempt in the
// journal that ran fn, or may have. Attempts recorded as not run (an
// orphaned takeover the Ledger abandoned, a failed Reconcile hook) are
// passed over: they did nothing, the attempt before them may have.
func indeterminate(rec Record) *IndeterminateError {
	ie := &IndeterminateError{Key: rec.Key, Fence: rec.Fence, Attempt: rec.Attempt, Owner: rec.Owner, Since: rec.LeaseUntil, Reason: rec.Reason}
	for i := len(rec.Journal) - 1; i >= 0; i-- {
		e := rec.Journal[i]
		if e.Decision || e.NotRun() {
			continue
		}
		ie.Fence, ie.Attempt, ie.Owner, ie.Since, ie.Reason = e.Fence, e.Attempt, e.Owner, e.LeaseUntil, e.Reason
		break
	}
	return ie
}

// reconcilePanic carries a panic of a Reconcile hook to run, which then
// abandons the attempt (as after the hook's error) before it re-panics with v.
type reconcilePanic struct{ v any }

// reconcile calls hook, marking a panic in it as the hook's.
func reconcile(ctx context.Context, hook ReconcileFunc, lp Lapsed) (v []byte, done bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			panic(reconcilePanic{p})
		}
	}()
	return hook(ctx, lp)
}

// abandonError marks an error after which nothing is known about the
// effect: the attempt is abandoned (left lapsed) whatever the policy.
// notRun: fn did not run (a Reconcile hook failed), so the attempt is
// recorded as not run.
type abandonError struct {
	err    error
	notRun bool
}

func (e abandonError) Error() string { return e.err.Error() }
func (e abandonError) Unwrap() error { return e.err }

// run calls fn under the claim in rec, with heartbeats, and records what
// happened. It returns fn's value on success.
// When *reconciled is set after fn returns, fn's value came from a Reconcile
// hook and is recorded as a resolution, so the journal tells it apart from a
// run.
//
// claimed is a local time taken before the claim was sent: the store's lease
// ends no earlier than claimed+lease.
func (l *Ledger) run(ctx context.Context, c *callConfig, rec Record, claimed time.Time, fn func(context.Context) ([]byte, error), reconciled *bool) ([]byte, error) {
	hb := l.newHeartbeat(ctx, c, rec, claimed)
	// fn's context carries its attempt (AttemptFromContext) in the
	// heartbeat, which is allocated anyway.
	runCtx, cancel := context.WithCancelCause(&hb.attempt)
	defer cancel(nil)
	hb.start(cancel)
	// If fn ends its goroutine (runtime.Goexit, t.Fatal) the heartbeat must
	// stop, so the lease lapses as after a crash.
	defer hb.stop()
	val, fnErr, panicked, panicVal := call(runCtx, fn)
	lost, refused := hb.stop()
	// A Reconcile hook that panics decided nothing, as one that errs: the
	// lapsed attempt stays lapsed, whatever the policy.
	rp, inHook := panicVal.(reconcilePanic)
	if inHook {
		panicVal = rp.v
	}

	// Writes that end the attempt must happen even when the caller's
	// context is done: the effect may have happened.
	fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout(c.lease))
	defer fcancel()
	key, fence := rec.Key, rec.Fence
	ending := func(outcome store.Outcome, reason string) store.FinishRequest {
		return store.FinishRequest{Key: key, Fence: fence, AttemptID: rec.AttemptID, Outcome: outcome, Reason: reason, Retention: c.retention}
	}

	if lost != nil && !refused && l.stillHeld(fctx, rec) {
		// The lease ran out here, while the store could not be reached (or
		// the call's lease cap ended it), but the store still shows this
		// attempt holding the key: record fn's outcome under its fence,
		// which the store refuses if another attempt took it meanwhile. fn
		// was cancelled: its error says so.
		l.logNote(ctx, slog.LevelWarn, "lease-ran-out", c, rec, slog.Any("error", lost),
			slog.String("msg_detail", "fn was cancelled; the store still shows this attempt, so its outcome is recorded under its fence"))
		if fnErr != nil {
			fnErr = fmt.Errorf("%w (fn was cancelled: %v)", fnErr, lost)
		}
		lost = nil
	}
	if lost != nil {
		why := "ran-out"
		if refused {
			why = "refused"
		}
		l.observeLeaseLost(ctx, c, rec, why, lost)
		l.logOutcome(ctx, slog.LevelWarn, "lease-lost", c, rec, slog.Any("error", lost),
			slog.String("msg_detail", "fn may have done its effect; nothing recorded, the key's new holder decides"))
		err := fmt.Errorf("idem: %q attempt %d (fence %d): %w", key, rec.Attempt, fence, lost)
		if panicked {
			panic(panicVal)
		}
		if fnErr != nil {
			return nil, errors.Join(err, fnErr)
		}
		return nil, err
	}

	if panicked {
		reason := fmt.Sprintf("panic: %v", panicVal)
		if inHook {
			reason = store.NotRunReason(fmt.Sprintf("the Reconcile hook panicked: %v", panicVal))
		}
		outcome := store.OutcomeReleased
		if c.policy == AtMostOnce || inHook {
			outcome = store.OutcomeAbandoned
		}
		if serr := l.end(fctx, ending(outcome, reason)); serr != nil {
			_ = l.storeError(ctx, storeOp(outcome), key, c, rec, serr)
		} else {
			l.logOutcome(ctx, slog.LevelError, string(outcome), c, rec, slog.String("reason", reason))
		}
		panic(panicVal)
	}

	if fnErr == nil {
		var err error
		if *reconciled {
			// Decided only while this attempt holds the key.
			r := store.ResolveRequest{Key: key, AttemptID: rec.AttemptID, Done: true, Result: val, Retention: c.retention,
				Reason: "reconciled: the lapsed attempt's effect was found done", By: l.owner + " (reconcile)"}
			err = l.write(fctx, key, rec.AttemptID, store.OutcomeResolvedDone, func(ctx context.Context) error {
				_, err := l.store.Resolve(ctx, r)
				return err
			})
		} else {
			done := ending(store.OutcomeCompleted, "")
			done.Result = val
			if c.claimed != nil && c.claimed.Complete != nil {
				complete := c.claimed.Complete
				err = l.write(fctx, key, rec.AttemptID, store.OutcomeCompleted, func(ctx context.Context) error { return complete(ctx, done) })
			} else {
				err = l.end(fctx, done)
			}
		}
		if err != nil {
			if errors.Is(err, ErrLeaseLost) || errors.Is(err, store.ErrNotFound) {
				l.observeLeaseLost(ctx, c, rec, "taken-over", err)
				l.logOutcome(ctx, slog.LevelWarn, "lease-lost", c, rec,
					slog.String("msg_detail", "fn finished but the key was taken over before its result was recorded; the effect may repeat"))
				return nil, fmt.Errorf("idem: %q attempt %d (fence %d) finished after losing its lease: %w", key, rec.Attempt, fence, ErrLeaseLost)
			}
			return nil, l.storeError(ctx, "complete", key, c, rec, err)
		}
		return val, nil
	}

	reason := fnErr.Error()
	var (
		op store.Outcome
		pe *PermanentError
		nd *NotDoneError
		ab abandonError
	)
	switch {
	case errors.As(fnErr, &ab):
		if ab.notRun {
			reason = store.NotRunReason(reason)
		}
		op = store.OutcomeAbandoned
	case errors.As(fnErr, &pe):
		op = store.OutcomeFailed
	case c.policy == AtLeastOnce || errors.As(fnErr, &nd):
		op = store.OutcomeReleased
	default:
		op = store.OutcomeAbandoned
	}
	if serr := l.end(fctx, ending(op, reason)); serr != nil {
		if errors.Is(serr, ErrLeaseLost) {
			l.observeLeaseLost(ctx, c, rec, "taken-over", serr)
			l.logOutcome(ctx, slog.LevelWarn, "lease-lost", c, rec, slog.String("reason", reason))
			return nil, errors.Join(fnErr, fmt.Errorf("idem: %q attempt %d (fence %d): %w", key, rec.Attempt, fence, ErrLeaseLost))
		}
		return nil, errors.Join(fnErr, l.storeError(ctx, storeOp(op), key, c, rec, serr))
	}
	level := slog.LevelInfo
	if op == store.OutcomeAbandoned {
		level = slog.LevelWarn
	}
	l.logOutcome(ctx, level, string(op), c, rec, slog.String("reason", reason))
	return nil, fnErr
}

// stillHeld reports whether the store still shows rec's attempt holding
// its key: in progress under the same attempt id and fence. A store error
// counts as no.
func (l *Ledger) stillHeld(ctx context.Context, rec Record) bool {
	cur, err := l.store.Get(ctx, rec.Key)
	return err == nil && cur.Status == StatusInProgress && cur.AttemptID == rec.AttemptID && cur.Fence == rec.Fence
}

// storeOp names the store.Store call that records an outcome, as StoreError.Op
// documents it.
func storeOp(outcome store.Outcome) string {
	switch outcome {
	case store.OutcomeCompleted:
		return "complete"
	case store.OutcomeReleased:
		return "release"
	case store.OutcomeFailed:
		return "fail"
	case store.OutcomeAbandoned:
		return "abandon"
	}
	return string(outcome)
}

// finishTimeout bounds the writes that end an attempt after fn returns
// (see [Ledger.FinishTimeout]).
func finishTimeout(lease time.Duration) time.Duration { return max(lease, 5*time.Second) }

// heartbeatInterval is how often a lease is extended while fn runs, and the
// bound of one extension.
func heartbeatInterval(lease time.Duration) time.Duration { return max(lease/3, time.Millisecond) }

// call runs fn, catching a panic so that the attempt can be recorded.
func call(ctx context.Context, fn func(context.Context) ([]byte, error)) (val []byte, err error, panicked bool, pv any) {
	defer func() {
		if r := recover(); r != nil {
			panicked, pv = true, r
		}
	}()
	val, err = fn(ctx)
	return val, err, false, nil
}

// heartbeat extends a lease while fn runs. It is a timer, not a goroutine:
// most fns end before the first extension is due, and then it costs a
// timer set and stopped.
type heartbeat struct {
	// attempt is the parent of fn's context: the call's context, which
	// it carries the attempt in.
	attempt  attemptContext
	l        *Ledger
	ctx      context.Context // for the store calls and logs: never cancelled
	c        *callConfig
	rec      Record
	interval time.Duration
	cancel   context.CancelCauseFunc
	// deadline is the lease as this process must assume it: the last
	// grant's request time plus the lease (the store granted it no
	// earlier). After it another attempt may own the key: fn is cancelled,
	// by a beat whose extension failed or by the watchdog, which fires at
	// the deadline unless an extension moved it (a store call that hangs
	// past its context must not keep fn running). Used by beats only,
	// which run one at a time (under run).
	deadline time.Time
	watchdog *time.Timer // started by the first beat

	timer   *time.Timer
	run     sync.Mutex // held by a beat; stop waits for it
	stopped atomic.Bool
	lost    atomic.Pointer[error]
	refused atomic.Bool // the store answered ErrLeaseLost: another attempt holds the key
	once    sync.Once
}

func (l *Ledger) newHeartbeat(ctx context.Context, c *callConfig, rec Record, claimed time.Time) *heartbeat {
	h := &heartbeat{l: l, ctx: context.WithoutCancel(ctx), c: c, rec: rec, interval: heartbeatInterval(c.lease), deadline: claimed.Add(c.lease)}
	h.attempt = attemptContext{Context: ctx, h: h}
	return h
}

// start sets the first beat; cancel cancels fn's context.
func (h *heartbeat) start(cancel context.CancelCauseFunc) {
	h.cancel = cancel
	h.run.Lock() // a first beat waits for h.timer
	h.timer = time.AfterFunc(h.interval, h.beat)
	h.run.Unlock()
}

// beat extends the lease once and sets the timer for the next, unless the
// lease is lost or the heartbeat stopped.
func (h *heartbeat) beat() {
	h.run.Lock()
	defer h.run.Unlock()
	if h.stopped.Load() || h.lost.Load() != nil {
		return // a lost lease is not extended again, even while fn runs on
	}
	if h.watchdog == nil {
		h.watchdog = time.AfterFunc(time.Until(h.deadline), h.expire)
	}
	lease := h.c.lease
	if !h.c.leaseEnd.IsZero() {
		// WithLeaseAtMost: not past the call's end; the watchdog then
		// cancels fn when the lease granted last runs out.
		if lease = min(lease, time.Until(h.c.leaseEnd)); lease <= 0 {
			return
		}
	}
	asked := time.Now()
	// An extension may take the beat's interval, but not past the lease
	// this process can count on: when the store cannot answer by then, fn
	// is cancelled at once, not a beat later.
	ectx, ecancel := context.WithDeadline(h.ctx, minTime(asked.Add(h.interval), h.deadline))
	err := h.extend(ectx, lease)
	ecancel()
	next := asked.Add(h.interval) // beats keep their cadence, however long an extension took
	switch {
	case err == nil:
		h.deadline = asked.Add(lease)
		h.watchdog.Reset(time.Until(h.deadline))
		h.l.observeLeaseExtended(h.ctx, h.c, h.rec, h.deadline)
	case errors.Is(err, ErrLeaseLost):
		h.refused.Store(true)
		h.fail(ErrLeaseLost)
		return
	default:
		h.l.observeStoreFailed(h.ctx, "extend", h.c, h.rec, err)
		h.l.logNote(h.ctx, slog.LevelWarn, "heartbeat-failed", h.c, h.rec, slog.Any("error", err))
		if !time.Now().Before(h.deadline) {
			h.fail(fmt.Errorf("%w: the lease ran out while the store could not be reached: %w", ErrLeaseLost, err))
			return
		}
		// Try again no later than when the lease runs out.
		next = minTime(next, h.deadline)
	}
	if !h.stopped.Load() {
		h.timer.Reset(max(time.Until(next), 0))
	}
}

// extend asks the store for the extension. A panic in the store is a failed
// extension: the beat runs on a timer's goroutine, where no caller could
// recover it, so it would end the process.
func (h *heartbeat) extend(ctx context.Context, lease time.Duration) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the store panicked: %v", p)
		}
	}()
	_, err = h.l.store.Extend(ctx, store.ExtendRequest{Key: h.rec.Key, Fence: h.rec.Fence, AttemptID: h.rec.AttemptID, Lease: lease})
	return err
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// expire cancels fn when the lease ran out with no extension granted.
func (h *heartbeat) expire() {
	if h.stopped.Load() {
		return
	}
	h.fail(fmt.Errorf("%w: the lease ran out before the store granted an extension", ErrLeaseLost))
}

// fail records the first loss of the lease and cancels fn.
func (h *heartbeat) fail(err error) {
	if h.lost.CompareAndSwap(nil, &err) {
		h.cancel(err)
	}
}

// stop ends the heartbeat, waiting for a beat under way, and reports
// whether the lease was lost, and whether the store said so (refused) or
// it ran out here.
func (h *heartbeat) stop() (lost error, refused bool) {
	h.once.Do(func() {
		h.stopped.Store(true)
		h.timer.Stop()
		h.run.Lock() // a beat under way finishes first
		if h.watchdog != nil {
			h.watchdog.Stop()
		}
		h.run.Unlock()
	})
	if p := h.lost.Load(); p != nil {
		return *p, h.refused.Load()
	}
	return nil, false
}

// lapsedOf describes, for a Reconcile hook, the attempt before the one rec
// holds that may have done the effect: the one that lapsed (or released
// the key with an error).
func lapsedOf(rec Record) Lapsed {
	e, ok := lastRun(rec)
	if !ok {
		// The journal does not reach it (it keeps store.MaxJournal entries).
		return Lapsed{Key: rec.Key, Fence: rec.Fence - 1, Attempt: rec.Attempt - 1, Reason: rec.Reason, Outcome: store.OutcomeLapsed}
	}
	lp := Lapsed{Key: rec.Key, Fence: e.Fence, Attempt: e.Attempt, Owner: e.Owner, Correlation: e.Correlation,
		Started: e.Started, Reason: e.Reason, Outcome: e.Outcome}
	if lp.Outcome == "" {
		lp.Outcome = store.OutcomeLapsed
	}
	return lp
}

// lastRun returns the newest journal entry before rec's own claim whose
// attempt ran fn, or may have: the attempts recorded as not run (a caller
// that left before its claim was answered, a Reconcile hook that failed)
// are passed over. ok is false when there is none in the journal, or only
// before a claim that began the record anew after an earlier record's
// retention passed.
func lastRun(rec Record) (e store.JournalEntry, ok bool) {
	j := rec.Journal
	for i := len(j) - 2; i >= 0; i-- {
		if j[i+1].AfterExpiry {
			return store.JournalEntry{}, false // the earlier attempts belong to a record whose retention passed
		}
		if !j[i].NotRun() {
			return j[i], true
		}
	}
	return store.JournalEntry{}, false
}

// releasedWithError reports whether the last attempt before the one rec
// holds that ran fn released the key with an error: it failed, perhaps
// after its effect (the "throw after the send" of a handler), so a
// Reconcile hook is asked before fn runs again.
func releasedWithError(rec Record) bool {
	e, ok := lastRun(rec)
	return ok && e.Outcome == store.OutcomeReleased && e.Reason != ""
}

func newCorrelationID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
