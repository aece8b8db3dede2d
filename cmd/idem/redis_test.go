package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/redisstore"
)

// TestRedisURL runs the operator's commands on a redis:// store that a
// worker wrote: inspect, ls --stuck, release, resolve and sweep go through
// the scheme with the worker's key prefix.
func TestRedisURL(t *testing.T) {
	raw := os.Getenv("IDEM_TEST_REDIS")
	if raw == "" {
		t.Skip("set IDEM_TEST_REDIS=redis://127.0.0.1:6379/0 to run the command tests on Redis")
	}
	ctx := context.Background()
	var b [6]byte
	rand.Read(b[:])
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("IDEM_TEST_REDIS is not a URL: %v", err)
	}
	q := u.Query()
	q.Set(redisstore.ParamPrefix, "idemcmd-"+hex.EncodeToString(b[:])+":")
	u.RawQuery = q.Encode()
	storeURL := u.String()

	s, err := redisstore.Open(ctx, storeURL)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	defer func() {
		for _, k := range []string{"receipt:1:7", "receipt:2:7"} {
			_ = s.Delete(context.Background(), k)
		}
	}()
	res, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "receipt:1:7", Owner: "w1", Lease: time.Minute, Retention: time.Hour})
	if err != nil || !res.Acquired {
		t.Fatalf("claim: %v %+v", err, res)
	}
	if err := s.Finish(ctx, store.FinishRequest{Key: "receipt:1:7", Fence: res.Record.Fence, AttemptID: res.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("ses-1"), Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// A crashed AtMostOnce attempt: claimed with a lease already over.
	stuck, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "receipt:2:7", Owner: "w2", Policy: idem.AtMostOnce, Lease: time.Millisecond, Retention: time.Hour})
	if err != nil || !stuck.Acquired {
		t.Fatalf("claim: %v %+v", err, stuck)
	}
	time.Sleep(20 * time.Millisecond)

	idemRun(ctx, "--store", storeURL, "inspect", "receipt:1:7").expect(t, 0, `"ses-1" (5 bytes)`, "status       completed")
	idemRun(ctx, "--store", storeURL, "inspect", "nope").expectErr(t, 3, "no record")
	idemRun(ctx, "--store", storeURL, "ls", "--stuck").expect(t, 0, "receipt:2:7")
	idemRun(ctx, "--store", storeURL, "resolve", "receipt:2:7", "--done", "--reason", "found in the provider's log").expect(t, 0, "receipt:2:7")
	if rec, err := s.Get(ctx, "receipt:2:7"); err != nil || rec.Status != idem.StatusCompleted {
		t.Fatalf("after idem resolve --done: %+v, %v; want completed", rec.Status, err)
	}
	idemRun(ctx, "--store", "redis://127.0.0.1:1/0?dial_timeout=200ms", "ls").expectErr(t, 1, "redis://127.0.0.1:1/0")
}
