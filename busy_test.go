package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store/memstore"
)

// A busy answer says when the holder started and how long it has run, so a
// caller can space its retries by it.
func TestInProgressErrorSaysHowLongTheHolderHasRun(t *testing.T) {
	ctx := context.Background()
	l := idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler)))
	key := idem.Key("busy", "running")
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := l.Do(ctx, key, func(context.Context) ([]byte, error) {
			close(started)
			<-release
			return nil, nil
		})
		done <- err
	}()
	<-started
	const held = 50 * time.Millisecond
	time.Sleep(held)
	_, err := l.Do(ctx, key, func(context.Context) ([]byte, error) { return nil, errors.New("ran while busy") })
	close(release)
	var busy *idem.InProgressError
	if !errors.As(err, &busy) {
		t.Fatalf("second call: %v, want an *InProgressError", err)
	}
	if busy.Started.IsZero() {
		t.Fatalf("Started is zero: %+v", busy)
	}
	if busy.Running < held || busy.Running > 10*time.Second {
		t.Fatalf("Running %v, want about %v", busy.Running, held)
	}
	if got := busy.LeaseUntil.Sub(busy.Started); got < busy.RetryAfter {
		t.Fatalf("lease from start %v shorter than RetryAfter %v", got, busy.RetryAfter)
	}
	if err := <-done; err != nil {
		t.Fatalf("holder: %v", err)
	}
}
