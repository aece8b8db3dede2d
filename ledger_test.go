package idem_test

import (
	"context"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store/memstore"
)

// A fn that ends its goroutine (runtime.Goexit, as t.Fatal does) must not
// leave a heartbeat holding the key: the lease lapses as after a crash.
func TestGoexitInFnLetsTheLeaseLapse(t *testing.T) {
	ctx := context.Background()
	lease := 60 * time.Millisecond
	l := idem.New(memstore.New(), idem.WithLease(lease), idem.WithLogger(slog.New(slog.DiscardHandler)))
	key := idem.Key("goexit")
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = l.Do(ctx, key, func(ctx context.Context) ([]byte, error) {
			runtime.Goexit()
			return nil, nil
		})
	}()
	<-done
	time.Sleep(4 * lease)
	res, err := l.Do(ctx, key, func(ctx context.Context) ([]byte, error) { return []byte("ran"), nil })
	if err != nil {
		t.Fatalf("Do after the Goexit attempt's lease: %v (its heartbeat still holds the key?)", err)
	}
	if !res.Takeover || res.Attempt != 2 {
		t.Fatalf("got %+v, want a takeover by attempt 2", res)
	}
}

// The caller owns a fresh Value: changing it must not change what the cache
// replays.
func TestCacheKeepsItsOwnCopyOfAFreshResult(t *testing.T) {
	ctx := context.Background()
	l := idem.New(memstore.New(), idem.WithCache(8), idem.WithLogger(slog.New(slog.DiscardHandler)))
	key := idem.Key("copy")
	res, err := l.Do(ctx, key, func(ctx context.Context) ([]byte, error) { return []byte("hello"), nil })
	if err != nil {
		t.Fatal(err)
	}
	res.Value[0] = 'X'
	again, err := l.Do(ctx, key, func(ctx context.Context) ([]byte, error) { return nil, nil })
	if err != nil || !again.Replayed || string(again.Value) != "hello" {
		t.Fatalf("replay after the caller changed its Value: %q replayed=%v err=%v, want \"hello\"", again.Value, again.Replayed, err)
	}
}
