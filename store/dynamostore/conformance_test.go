package dynamostore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/store"
)

func isTTLUnsupported(err error) bool { return errors.Is(err, ErrTTLUnsupported) }

// harness runs the conformance suite on stores in tables of their own on
// the test endpoint, each test's stores on a clock of the test's own that
// Advance moves. Child processes open a table by name, on the real clock.
func harness(t testing.TB) idemtest.Harness {
	testEndpoint(t)
	clocks := new(idemtest.Clocks)
	return idemtest.Harness{
		New: func(t testing.TB) store.Store {
			// dynalite does not return the item with a failed condition,
			// so a claim that writes first costs a duplicate two requests
			// there (the failed PutItem and a GetItem). The suite's
			// 64-goroutine race makes 63,000 duplicate calls: it runs on
			// stores that read first, one request each, which also races
			// that way of claiming. Every other test writes first (the
			// default); store_test.go tests reading first in detail.
			rf := strings.Contains(t.Name(), "/race/do_64_goroutines")
			return New(testClient(t), newTable(t), WithClock(clocks.Get(t).Now), WithReadFirst(rf))
		},
		Advance: clocks.Advance,
		Locator: func(t testing.TB) string { return newTable(t) },
		Open: func(table string) (store.Store, error) {
			return New(newClient(testEndpointEnv()), table), nil
		},
		Corrupt: func(t testing.TB, s store.Store, key string) { corrupt(t, s.(*Store), key) },
		Unreachable: func(t testing.TB) store.Store {
			// Nothing listens on port 1.
			return New(newClient("http://127.0.0.1:1", func(o *dynamodb.Options) { o.RetryMaxAttempts = 2 }), "unreachable")
		},
		Parallelism: 8,
		// dynalite is one Node.js process, and the SDK under -race spends
		// about 1.5 ms a request: an extension waits behind the parallel
		// race test's 64 goroutines. At 1.5 s the one heartbeat after an
		// injected failure (faults/extend_fails_once) missed its lease in
		// a CI run; 3 s leaves it a second.
		HeartbeatLease: 3 * time.Second,
	}
}

// corrupt gives key's record a status no store writes.
func corrupt(t testing.TB, s *Store, key string) {
	t.Helper()
	_, err := s.Client().UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.Table()),
		Key:                       s.keyOf(key),
		UpdateExpression:          aws.String("SET #s = :bogus"),
		ExpressionAttributeNames:  map[string]string{"#s": attrStatus},
		ExpressionAttributeValues: map[string]types.AttributeValue{":bogus": str("bogus")},
	})
	if err != nil {
		t.Fatalf("corrupting %q: %v", key, err)
	}
}

// TestConformance runs the whole suite, with a clock the tests advance,
// and the tests of separate processes (on the real clock).
func TestConformance(t *testing.T) { idemtest.TestStore(t, harness(t)) }

// TestRealClock: without WithClock the store reads time.Now, and a lease
// passes in real time. (The suite runs on test clocks: the store has no
// other clock, so the real one changes nothing but the waiting.)
func TestRealClock(t *testing.T) {
	s := New(testClient(t), newTable(t))
	ctx := context.Background()
	// The second claim must come within the lease: dynalite took more
	// than a second to answer on a loaded machine.
	r := store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Owner: "a", Lease: 3 * time.Second, Retention: time.Hour}
	before := time.Now()
	cr, err := s.Claim(ctx, r)
	if err != nil || !cr.Acquired {
		t.Fatalf("Claim: %+v, %v", cr, err)
	}
	if cr.Now.Before(before) || cr.Now.After(time.Now()) {
		t.Fatalf("claim's Now %v is not the real time (%v)", cr.Now, before)
	}
	if busy, err := s.Claim(ctx, r); err != nil || busy.Acquired {
		t.Fatalf("Claim within the lease: %+v, %v; want busy", busy, err)
	}
	time.Sleep(time.Until(cr.Record.LeaseUntil) + 10*time.Millisecond)
	if tk, err := s.Claim(ctx, r); err != nil || !tk.Acquired || !tk.Takeover {
		t.Fatalf("Claim after the lease passed: %+v, %v; want a takeover", tk, err)
	}
}
