package idem_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/memstore"
)

// A key reused for a different request is a mismatch whatever state its
// record is in: while the first attempt runs (or after it lapsed under
// AtMostOnce), a call with another fingerprint gets ErrMismatch, logged as
// "mismatch", not ErrInProgress (retry later: the retry could only ever be
// refused) nor ErrIndeterminate (the key's outcome is not this request's
// business). A call with the same fingerprint, or none, still gets the busy
// or indeterminate answer.
func TestKeyReusedWhileInProgressIsAMismatch(t *testing.T) {
	ctx := context.Background()
	a, b := idem.Fingerprint([]byte("amount=100")), idem.Fingerprint([]byte("amount=5"))
	noop := func(context.Context) ([]byte, error) { t.Error("fn ran"); return nil, nil }

	wantMismatch := func(t *testing.T, err error, logs *bytes.Buffer) {
		t.Helper()
		var me *idem.MismatchError
		if !errors.Is(err, idem.ErrMismatch) || !errors.As(err, &me) || me.Status != idem.StatusInProgress {
			t.Fatalf("other fingerprint: %v, want a *MismatchError on an in_progress record", err)
		}
		if errors.Is(err, idem.ErrInProgress) || errors.Is(err, idem.ErrIndeterminate) {
			t.Fatalf("other fingerprint: %v is also busy or indeterminate", err)
		}
		if !loggedOutcome(t, logs, "mismatch") {
			t.Fatalf("no mismatch line in %s", logs)
		}
	}

	t.Run("running", func(t *testing.T) {
		var logs bytes.Buffer
		l := idem.New(memstore.New(), idem.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
		key := idem.Key("charge", 1)
		started, release, done := make(chan struct{}), make(chan struct{}), make(chan error)
		go func() {
			_, err := l.Do(ctx, key, func(context.Context) ([]byte, error) {
				close(started)
				<-release
				return []byte("charged 100"), nil
			}, a)
			done <- err
		}()
		<-started
		_, err := l.Do(ctx, key, noop, b)
		wantMismatch(t, err, &logs)
		for _, opts := range [][]idem.CallOption{{a}, nil} {
			if _, err := l.Do(ctx, key, noop, opts...); !errors.Is(err, idem.ErrInProgress) {
				t.Fatalf("same or no fingerprint while running: %v, want ErrInProgress", err)
			}
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})

	t.Run("lapsed-at-most-once", func(t *testing.T) {
		var logs bytes.Buffer
		l := idem.New(memstore.New(), idem.WithPolicy(idem.AtMostOnce), idem.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
		key := idem.Key("charge", 2)
		_, _ = l.Do(ctx, key, func(context.Context) ([]byte, error) { return nil, errors.New("timeout") }, a)
		_, err := l.Do(ctx, key, noop, b)
		wantMismatch(t, err, &logs)
		if _, err := l.Do(ctx, key, noop, a); !errors.Is(err, idem.ErrIndeterminate) {
			t.Fatalf("same fingerprint on the lapsed key: %v, want ErrIndeterminate", err)
		}
	})
}

// After the first attempt lapsed under AtLeastOnce, or with a Reconcile
// hook under either policy, a call with another fingerprint does not take
// the key over (the lapsed attempt may have done its effect; running
// another request's would make two effects under one key): it is a
// mismatch too, and neither fn nor the hook runs. The same request still
// takes the key over.
func TestLapsedKeyIsNotTakenOverByAnotherRequest(t *testing.T) {
	ctx := context.Background()
	sum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	a, b := []byte("amount=100"), []byte("amount=5")
	for _, c := range []struct {
		name      string
		policy    idem.Policy
		reconcile bool
	}{
		{"at-least-once", idem.AtLeastOnce, false},
		{"at-least-once-reconcile", idem.AtLeastOnce, true},
		{"at-most-once-reconcile", idem.AtMostOnce, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var logs bytes.Buffer
			s := memstore.New()
			l := idem.New(s, idem.WithPolicy(c.policy), idem.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
			key := idem.Key("charge", 3)
			// The first request's attempt crashed after its claim: lapsed.
			cr, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: key.String(), Owner: "crashed", Policy: c.policy,
				Lease: time.Minute, Retention: time.Hour, Fingerprint: sum(a)})
			if err != nil || !cr.Acquired {
				t.Fatalf("Claim: %v, acquired %v", err, cr.Acquired)
			}
			if err := s.Finish(ctx, store.FinishRequest{Key: key.String(), Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeAbandoned, Reason: "crashed"}); err != nil {
				t.Fatal(err)
			}
			var opts []idem.CallOption
			hooked := 0
			if c.reconcile {
				opts = append(opts, idem.WithReconcile(func(context.Context, idem.Lapsed) ([]byte, bool, error) {
					hooked++
					return nil, false, nil
				}))
			}
			ran := false
			_, err = l.Do(ctx, key, func(context.Context) ([]byte, error) { ran = true; return []byte("charged 5"), nil },
				append(opts, idem.Fingerprint(b))...)
			var me *idem.MismatchError
			if !errors.Is(err, idem.ErrMismatch) || !errors.As(err, &me) || me.Status != idem.StatusInProgress {
				t.Fatalf("another request on the lapsed key: %v, want a *MismatchError on an in_progress record", err)
			}
			if ran || hooked != 0 {
				t.Fatalf("another request on the lapsed key: fn ran %v, the Reconcile hook ran %d times; want neither", ran, hooked)
			}
			if !loggedOutcome(t, &logs, "mismatch") {
				t.Fatalf("no mismatch line in %s", &logs)
			}
			rec, err := s.Get(ctx, key.String())
			if err != nil || rec.Fence != cr.Record.Fence || rec.Attempt != 1 || rec.Owner != "crashed" || rec.Fingerprint != sum(a) {
				t.Fatalf("after the mismatch: %v, fence %d, attempt %d, owner %q, fingerprint %q; want the lapsed record unchanged",
					err, rec.Fence, rec.Attempt, rec.Owner, rec.Fingerprint)
			}
			// The same request still takes it over.
			res, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { return []byte("charged 100"), nil },
				append(opts, idem.Fingerprint(a))...)
			if err != nil || !res.Takeover || res.Fence != cr.Record.Fence+1 {
				t.Fatalf("the same request on the lapsed key: %+v, %v; want a takeover at fence %d", res, err, cr.Record.Fence+1)
			}
		})
	}
}

// loggedOutcome reports whether a JSON log line has outcome.
func loggedOutcome(t *testing.T, logs *bytes.Buffer, outcome string) bool {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		if m["outcome"] == outcome {
			return true
		}
	}
	return false
}

// loggedLine returns the first JSON log line with outcome, or nil.
func loggedLine(t *testing.T, logs *bytes.Buffer, outcome string) map[string]any {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		if m["outcome"] == outcome {
			return m
		}
	}
	return nil
}

// The mismatch line says what the record is: its status, and for an
// in_progress one its holder and whether its lease has lapsed, so a key
// blocked by a crashed attempt of another request reads apart from a key
// reused while running or after it completed.
func TestMismatchLogSaysWhatTheRecordIs(t *testing.T) {
	ctx := context.Background()
	a, b := idem.Fingerprint([]byte("amount=100")), idem.Fingerprint([]byte("amount=5"))
	noop := func(context.Context) ([]byte, error) { t.Error("fn ran"); return nil, nil }
	check := func(t *testing.T, logs *bytes.Buffer, want map[string]any, absent ...string) {
		t.Helper()
		m := loggedLine(t, logs, "mismatch")
		if m == nil {
			t.Fatalf("no mismatch line in %s", logs)
		}
		for k, v := range want {
			if m[k] != v {
				t.Errorf("mismatch line %s = %v, want %v (%v)", k, m[k], v, m)
			}
		}
		for _, k := range absent {
			if _, ok := m[k]; ok {
				t.Errorf("mismatch line has %s: %v", k, m)
			}
		}
	}
	newLedger := func(s store.Store, logs *bytes.Buffer) *idem.Ledger {
		return idem.New(s, idem.WithOwner("w2"), idem.WithLogger(slog.New(slog.NewJSONHandler(logs, nil))))
	}

	t.Run("completed", func(t *testing.T) {
		var logs bytes.Buffer
		l := newLedger(memstore.New(), &logs)
		key := idem.Key("charge", 1)
		if _, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { return []byte("ok"), nil }, a); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Do(ctx, key, noop, b); !errors.Is(err, idem.ErrMismatch) {
			t.Fatalf("%v, want ErrMismatch", err)
		}
		check(t, &logs, map[string]any{"status": "completed", "owner": "w2"}, "holder", "lapsed")
	})

	for _, c := range []struct {
		name   string
		lapsed bool
	}{{"running", false}, {"lapsed", true}} {
		t.Run(c.name, func(t *testing.T) {
			var logs bytes.Buffer
			s := memstore.New()
			l := newLedger(s, &logs)
			key := idem.Key("charge", 2)
			cr, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: key.String(), Owner: "crashed", Policy: idem.AtLeastOnce,
				Lease: time.Minute, Retention: time.Hour, Fingerprint: "sha256-of-another-request"})
			if err != nil || !cr.Acquired {
				t.Fatalf("Claim: %v, acquired %v", err, cr.Acquired)
			}
			if c.lapsed {
				if err := s.Finish(ctx, store.FinishRequest{Key: key.String(), Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeAbandoned, Reason: "crashed"}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := l.Do(ctx, key, noop, b); !errors.Is(err, idem.ErrMismatch) {
				t.Fatalf("%v, want ErrMismatch", err)
			}
			check(t, &logs, map[string]any{"status": "in_progress", "holder": "crashed", "lapsed": c.lapsed, "owner": "w2"})
		})
	}
}
