package idemtest

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// Op names a [store.Store] method, for [FaultStore].
type Op string

// The Store methods a [FaultStore] counts and can fail. Finish counts
// under the Op of its outcome (OpComplete, OpFail, OpRelease, OpAbandon);
// OpFinish is a Finish with an outcome a store refuses.
const (
	OpClaim    Op = "claim"
	OpComplete Op = "complete"
	OpFail     Op = "fail"
	OpRelease  Op = "release"
	OpAbandon  Op = "abandon"
	OpFinish   Op = "finish"
	OpExtend   Op = "extend"
	OpGet      Op = "get"
	OpList     Op = "list"
	OpResolve  Op = "resolve"
	OpDelete   Op = "delete"
	OpSweep    Op = "sweep"
	OpNow      Op = "now"
)

var allOps = []Op{OpClaim, OpComplete, OpFail, OpRelease, OpAbandon, OpFinish, OpExtend, OpGet, OpList, OpResolve, OpDelete, OpSweep, OpNow}

// Fault is an error (or a delay) a [FaultStore] injects into calls of one
// [Op].
type Fault struct {
	// Err is returned instead of the store's answer. When nil the call goes
	// through to the store, after Delay.
	Err error
	// Delay is waited before the call, as a slow network or disk would;
	// the call's context ending first ends the wait with its error.
	Delay time.Duration
	// After calls the real store first and then returns Err anyway: the
	// write happened but its answer was lost (a timeout after the commit).
	// Otherwise the real store is not called.
	After bool
	// Times is how many calls fail before the fault heals by itself; 0
	// means every call until [FaultStore.Heal].
	Times int
}

// FaultStore wraps a real [store.Store], counts the calls of each method,
// and makes chosen methods fail with an injected error. It is a fake only
// to inject a fault that a real service cannot produce on demand (a
// complete that fails after fn ran, a release that fails after fn's error,
// heartbeats that cannot reach the store): every answer it does not fail
// is the real store's.
//
// Close is passed through and not counted. FaultStore does not implement
// [store.BatchClaimer] or [store.TxStore]. It is safe for concurrent use.
type FaultStore struct {
	store  store.Store
	mu     sync.Mutex
	faults map[Op]*Fault
	calls  map[Op]*atomic.Int64
}

var _ store.Store = (*FaultStore)(nil)

// NewFaultStore returns a FaultStore on s with no faults.
func NewFaultStore(s store.Store) *FaultStore {
	f := &FaultStore{store: s, faults: make(map[Op]*Fault), calls: make(map[Op]*atomic.Int64, len(allOps))}
	for _, op := range allOps {
		f.calls[op] = new(atomic.Int64)
	}
	return f
}

// Unwrap returns the real store.
func (f *FaultStore) Unwrap() store.Store { return f.store }

// Inject makes calls of op fail as fault says, replacing an earlier fault
// on op.
func (f *FaultStore) Inject(op Op, fault Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fc := fault
	f.faults[op] = &fc
}

// Heal removes the fault on op.
func (f *FaultStore) Heal(op Op) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.faults, op)
}

// Calls returns how many times op was called, failed calls included.
func (f *FaultStore) Calls(op Op) int { return int(f.calls[op].Load()) }

// TotalCalls returns how many store calls were made, of every method.
func (f *FaultStore) TotalCalls() int {
	n := 0
	for _, c := range f.calls {
		n += int(c.Load())
	}
	return n
}

// fault counts a call of op and returns the fault to inject into it, if any.
func (f *FaultStore) fault(op Op) *Fault {
	f.calls[op].Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	ft := f.faults[op]
	if ft == nil {
		return nil
	}
	out := *ft
	if ft.Times > 0 {
		if ft.Times--; ft.Times == 0 {
			delete(f.faults, op)
		}
	}
	return &out
}

// run calls real unless op has a fault.
func run(ctx context.Context, f *FaultStore, op Op, real func() error) error {
	ft := f.fault(op)
	if ft == nil {
		return real()
	}
	if ft.Delay > 0 {
		t := time.NewTimer(ft.Delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	if ft.Err == nil {
		return real()
	}
	if ft.After {
		_ = real()
	}
	return ft.Err
}

// Claim implements store.Store.
func (f *FaultStore) Claim(ctx context.Context, req store.ClaimRequest) (res store.ClaimResult, err error) {
	err = run(ctx, f, OpClaim, func() error { res, err = f.store.Claim(ctx, req); return err })
	if err != nil {
		return store.ClaimResult{}, err
	}
	return res, nil
}

// Finish implements store.Store. It counts and fails the call under the
// Op of its outcome: OpComplete, OpFail, OpRelease or OpAbandon.
func (f *FaultStore) Finish(ctx context.Context, req store.FinishRequest) error {
	op := OpFinish
	switch req.Outcome {
	case store.OutcomeCompleted:
		op = OpComplete
	case store.OutcomeFailed:
		op = OpFail
	case store.OutcomeReleased:
		op = OpRelease
	case store.OutcomeAbandoned:
		op = OpAbandon
	}
	return run(ctx, f, op, func() error { return f.store.Finish(ctx, req) })
}

// Extend implements store.Store.
func (f *FaultStore) Extend(ctx context.Context, req store.ExtendRequest) (until time.Time, err error) {
	err = run(ctx, f, OpExtend, func() error { until, err = f.store.Extend(ctx, req); return err })
	if err != nil {
		return time.Time{}, err
	}
	return until, nil
}

// Get implements store.Store.
func (f *FaultStore) Get(ctx context.Context, key string) (rec idem.Record, err error) {
	err = run(ctx, f, OpGet, func() error { rec, err = f.store.Get(ctx, key); return err })
	if err != nil {
		return idem.Record{}, err
	}
	return rec, nil
}

// List implements store.Store.
func (f *FaultStore) List(ctx context.Context, q store.ListQuery) (recs []idem.Record, err error) {
	err = run(ctx, f, OpList, func() error { recs, err = f.store.List(ctx, q); return err })
	if err != nil {
		return nil, err
	}
	return recs, nil
}

// Resolve implements store.Store.
func (f *FaultStore) Resolve(ctx context.Context, r store.ResolveRequest) (rec idem.Record, err error) {
	err = run(ctx, f, OpResolve, func() error { rec, err = f.store.Resolve(ctx, r); return err })
	if err != nil {
		return idem.Record{}, err
	}
	return rec, nil
}

// Delete implements store.Store.
func (f *FaultStore) Delete(ctx context.Context, key string) error {
	return run(ctx, f, OpDelete, func() error { return f.store.Delete(ctx, key) })
}

// Sweep implements store.Store.
func (f *FaultStore) Sweep(ctx context.Context, limit int) (n int, err error) {
	err = run(ctx, f, OpSweep, func() error { n, err = f.store.Sweep(ctx, limit); return err })
	if err != nil {
		return 0, err
	}
	return n, nil
}

// Now implements store.Store.
func (f *FaultStore) Now(ctx context.Context) (t time.Time, err error) {
	err = run(ctx, f, OpNow, func() error { t, err = f.store.Now(ctx); return err })
	if err != nil {
		return time.Time{}, err
	}
	return t, nil
}

// Close implements store.Store: it closes the real store.
func (f *FaultStore) Close() error { return f.store.Close() }
