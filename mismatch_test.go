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
