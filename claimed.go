package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/store"
)

// Claimed is a claim made for a call of [Ledger.Do] before the call, by
// code that claims many keys at once in a transaction of its own: a queue
// that lives in the store's database claims the keys of the messages it
// hands out in the transaction that receives them (queue/sqlqueue's fused
// path). Pass it to Do with [WithClaimed]; Do then sends no claim and
// answers from Result exactly as from its own (busy, duplicate,
// indeterminate, ...), runs fn under it when it was acquired, with
// heartbeats, and ends the attempt as usual. A claim that waited more than
// two thirds of its lease before Do got it is undone instead of run (Do
// returns an error wrapping [ErrLeaseLost]): its lease might lapse, and
// another delivery take the key over, before a heartbeat could extend it.
type Claimed struct {
	// Request is the claim that was sent: made by [Ledger.ClaimRequest]
	// for the call's key and options.
	Request store.ClaimRequest
	// Result is what the store answered. A Result.Err is this key's own
	// failure (a record that cannot be decoded): Do returns it as a store
	// error.
	Result store.ClaimResult
	// Sent is the local time before the claim was sent: the lease runs
	// from no earlier than Sent, so heartbeats count from it.
	Sent time.Time
	// Complete, when set, records the attempt's completion (a
	// store.FinishRequest with store.OutcomeCompleted and no reason) in
	// place of Store.Finish: the queue writes it in one commit with the
	// message's ack. It must do what Store.Finish does for req (a write
	// conditioned on the attempt holding the key; store.ErrLeaseLost when
	// it does not) and may be called again for the same req when an
	// earlier call's answer was lost, as Store.Finish may. Other outcomes
	// (release, fail, abandon) go to the store as usual.
	Complete func(ctx context.Context, req store.FinishRequest) error
}

// WithClaimed makes [Ledger.Do] run under c, a claim already made for the
// call (see [Claimed]), instead of claiming the key itself. c.Request.Key
// must be the call's key; the call's options must be those the claim
// request was made with (its policy, lease, fingerprint and correlation
// id come from c.Request). The local result cache ([WithCache]) is not
// consulted: the claim has already answered. A nil c is ignored.
func WithClaimed(c *Claimed) CallOption { return claimedOption{c} }

type claimedOption struct{ c *Claimed }

func (o claimedOption) applyCall(cc *callConfig) {
	if o.c != nil {
		cc.claimed = o.c
	}
}

// hasClaimed reports whether opts hold a [WithClaimed] with a claim.
func hasClaimed(opts []CallOption) bool {
	for _, o := range opts {
		if co, ok := o.(claimedOption); ok && co.c != nil {
			return true
		}
	}
	return false
}

// ClaimRequest returns the claim [Ledger.Do] would send for key under
// opts, with a new attempt id: for code that claims on the ledger's
// behalf and then calls Do with [WithClaimed]. A call that sets no
// correlation id ([WithCorrelationID]) gets a random one. It returns the
// key's error for an invalid key.
func (l *Ledger) ClaimRequest(key OperationKey, opts ...CallOption) (store.ClaimRequest, error) {
	if err := key.Err(); err != nil {
		return store.ClaimRequest{}, err
	}
	c := l.callConfig(opts)
	if c.correlation == "" {
		c.correlation = newCorrelationID()
	}
	return l.claimRequest(key.s, c), nil
}

// errClaimedKey is returned by Do for a Claimed made for another key.
var errClaimedKey = errors.New("idem: WithClaimed: the claim is for another key")

// claimedClaim returns the claim that c.claimed carries for key as Do's
// own claim would have answered it: the result, or the claim's error.
func (l *Ledger) claimedClaim(ctx context.Context, key string, c *callConfig) (store.ClaimRequest, store.ClaimResult, error) {
	cl := c.claimed
	req := cl.Request
	if req.Key != key {
		return req, store.ClaimResult{}, errClaimedKey
	}
	if cl.Result.Err != nil {
		return req, store.ClaimResult{}, cl.Result.Err
	}
	if ctx.Err() != nil {
		// As for a claim of its own: fn must not start on a context that
		// is over.
		l.releaseOrphan(req, cl.Result)
		return req, store.ClaimResult{}, context.Cause(ctx)
	}
	if waited := time.Since(cl.Sent); cl.Result.Acquired && !cl.Sent.IsZero() && waited > req.Lease*2/3 {
		// The claim waited (in a consumer's batch) past the point where a
		// heartbeat could still extend it before it lapses: another
		// delivery of the key may take it over while fn runs, so fn must
		// not start under it. Undo it (refused if it was already taken)
		// and let the caller try again.
		l.releaseOrphan(req, cl.Result)
		return req, store.ClaimResult{}, fmt.Errorf("idem: the claim made for %q waited %v of its %v lease before fn could start: %w",
			key, waited.Round(time.Millisecond), req.Lease, ErrLeaseLost)
	}
	return req, cl.Result, nil
}
