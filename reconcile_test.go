package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

// leaveDuringClaim is a memstore whose next Claim succeeds but ends the
// caller's context (cancel) while the claim is on its way: the caller left.
type leaveDuringClaim struct {
	*memstore.Store
	cancel context.CancelFunc
}

func (s *leaveDuringClaim) Claim(ctx context.Context, req store.ClaimRequest) (store.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, req)
	if s.cancel != nil {
		s.cancel()
		s.cancel = nil
	}
	return res, err
}

// leave makes the next claim's caller leave, and returns its context.
func (s *leaveDuringClaim) leave() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	return ctx
}

// askedAbout is a Reconcile hook that finds nothing done and keeps what it
// was asked about.
func askedAbout(asked **idem.Lapsed) idem.CallOption {
	return idem.WithReconcile(func(_ context.Context, lp idem.Lapsed) ([]byte, bool, error) {
		*asked = &lp
		return nil, false, nil
	})
}

func quiet() idem.Option { return idem.WithLogger(slog.New(slog.DiscardHandler)) }

// An attempt that released its key with an error (it may have sent), then a
// call whose caller left while its claim was on its way (the ledger releases
// that claim: fn never ran). The next call's Reconcile hook is asked about
// the first attempt, not about the one that never ran.
func TestReconcileAsksPastAnOrphanedClaim(t *testing.T) {
	s := &leaveDuringClaim{Store: memstore.New()}
	l := idem.New(s, quiet())
	key := idem.Key("receipt", 1)
	ctx := context.Background()
	if _, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { return nil, errors.New("sent, then the db write failed") },
		idem.WithCorrelationID("msg-A1")); err == nil {
		t.Fatal("A1: no error")
	}
	ran := false
	if _, err := l.Do(s.leave(), key, func(context.Context) ([]byte, error) { ran = true; return nil, nil },
		idem.WithCorrelationID("msg-A2")); !errors.Is(err, context.Canceled) || ran {
		t.Fatalf("A2: %v, fn ran %v; want context.Canceled and fn not run", err, ran)
	}
	var asked *idem.Lapsed
	if _, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { return []byte("sent again"), nil },
		idem.WithCorrelationID("msg-A3"), askedAbout(&asked)); err != nil {
		t.Fatal(err)
	}
	if asked == nil || asked.Correlation != "msg-A1" || asked.Attempt != 1 || asked.Reason != "sent, then the db write failed" {
		t.Fatalf("A3's hook was asked about %+v; want A1 (attempt 1, msg-A1, its reason), the attempt that may have sent", asked)
	}
}

// A fresh key whose first claim was orphaned (fn never ran) is not a key
// released with an error: the next call's hook is not asked.
func TestReconcileNotAskedAfterAnOrphanedFreshClaim(t *testing.T) {
	s := &leaveDuringClaim{Store: memstore.New()}
	l := idem.New(s, quiet())
	key := idem.Key("receipt", 2)
	if _, err := l.Do(s.leave(), key, func(context.Context) ([]byte, error) { return nil, nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("orphan: %v", err)
	}
	var asked *idem.Lapsed
	if _, err := l.Do(context.Background(), key, func(context.Context) ([]byte, error) { return nil, nil }, askedAbout(&asked)); err != nil {
		t.Fatal(err)
	}
	if asked != nil {
		t.Fatalf("the hook was asked about %+v, an attempt that never ran", asked)
	}
}

// A takeover whose caller left while its claim was on its way is left
// lapsed (fn never ran); the next takeover's hook is asked about the attempt
// that lapsed first, with that attempt's fields only.
func TestReconcileAsksPastAnOrphanedTakeover(t *testing.T) {
	s := &leaveDuringClaim{Store: memstore.New()}
	l := idem.New(s, idem.WithPolicy(idem.AtMostOnce), quiet())
	key := idem.Key("charge", 3)
	ctx := context.Background()
	if _, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { return nil, errors.New("timeout after the charge request") },
		idem.WithCorrelationID("msg-A1")); err == nil {
		t.Fatal("A1: no error")
	}
	var a2 *idem.Lapsed
	if _, err := l.Do(s.leave(), key, func(context.Context) ([]byte, error) { return nil, nil },
		idem.WithCorrelationID("msg-A2"), askedAbout(&a2)); !errors.Is(err, context.Canceled) || a2 != nil {
		t.Fatalf("A2: %v (hook asked: %v); want context.Canceled, hook not asked", err, a2 != nil)
	}
	var a3 *idem.Lapsed
	res, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { return []byte("charged"), nil },
		idem.WithCorrelationID("msg-A3"), askedAbout(&a3))
	if err != nil || !res.Takeover {
		t.Fatalf("A3: %+v, %v; want a takeover", res, err)
	}
	if a3 == nil || a3.Correlation != "msg-A1" || a3.Attempt != 1 || a3.Reason != "timeout after the charge request" {
		t.Fatalf("A3's hook was asked about %+v; want A1 (attempt 1, msg-A1, its reason), the attempt that may have charged", a3)
	}
}

// A Reconcile hook that fails (the provider's search is down) leaves the key
// lapsed; the next call's hook is asked about the attempt that may have done
// the effect, not about the one whose hook failed. With the provider-key
// pattern (key and fence as the provider's idempotency key) the wrong fence
// would find nothing and charge again.
func TestReconcileAsksPastAFailedHook(t *testing.T) {
	for _, fail := range []string{"error", "panic"} {
		t.Run(fail, func(t *testing.T) {
			l := idem.New(memstore.New(), idem.WithPolicy(idem.AtMostOnce), quiet())
			key := idem.Key("charge", 4)
			ctx := context.Background()
			if _, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { return nil, errors.New("timeout after the charge request") },
				idem.WithCorrelationID("msg-A1")); err == nil {
				t.Fatal("A1: no error")
			}
			hook := idem.WithReconcile(func(context.Context, idem.Lapsed) ([]byte, bool, error) {
				if fail == "panic" {
					panic("hook bug")
				}
				return nil, false, errors.New("provider 503")
			})
			func() {
				defer func() { _ = recover() }()
				if _, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { return nil, nil }, idem.WithCorrelationID("msg-A2"), hook); err == nil {
					t.Error("A2: no error")
				}
			}()
			var asked *idem.Lapsed
			if _, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { return []byte("charged"), nil },
				idem.WithCorrelationID("msg-A3"), askedAbout(&asked)); err != nil {
				t.Fatal(err)
			}
			if asked == nil || asked.Attempt != 1 || asked.Correlation != "msg-A1" {
				t.Fatalf("A3's hook was asked about %+v; want attempt 1 (msg-A1), the attempt that may have charged", asked)
			}
		})
	}
}

// A reconciled call's log line carries the fence its Result does (the
// resolution's, one more than the claim's), as the store records it.
func TestReconciledLogFence(t *testing.T) {
	var buf bytes.Buffer
	l := idem.New(memstore.New(), idem.WithPolicy(idem.AtMostOnce), idem.WithLogger(slog.New(slog.NewJSONHandler(&buf, nil))))
	key := idem.Key("charge", 6)
	ctx := context.Background()
	_, _ = l.Do(ctx, key, func(context.Context) ([]byte, error) { return nil, errors.New("timeout") })
	buf.Reset()
	res, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { return nil, nil },
		idem.WithReconcile(func(context.Context, idem.Lapsed) ([]byte, bool, error) { return []byte("ch_1"), true, nil }))
	if err != nil || !res.Reconciled {
		t.Fatal(res, err)
	}
	rec, err := l.Store().Get(ctx, key.String())
	if err != nil || rec.Fence != res.Fence {
		t.Fatalf("stored %+v, %v; Result.Fence %d", rec, err, res.Fence)
	}
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		if m["outcome"] == "reconciled" {
			if f, _ := m["fence"].(float64); int64(f) != res.Fence {
				t.Fatalf("log line fence %v, Result.Fence %d", m["fence"], res.Fence)
			}
			return
		}
	}
	t.Fatalf("no reconciled line in %s", buf.String())
}
