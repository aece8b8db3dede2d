package dynamostore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
)

func isTTLUnsupported(err error) bool { return errors.Is(err, ErrTTLUnsupported) }

// harness runs the conformance suite on stores in tables of their own on
// the test endpoint, each test's stores on a clock of the test's own that
// Advance moves. Child processes open a table by name, on the real clock.
func harness(t testing.TB) idemtest.Harness {
	testEndpoint(t)
	clocks := new(idemtest.Clocks)
	return idemtest.Harness{
		New: func(t testing.TB) idem.Store {
			return New(testClient(t), newTable(t), WithClock(clocks.Get(t).Now))
		},
		Advance: clocks.Advance,
		Locator: func(t testing.TB) string { return newTable(t) },
		Open: func(table string) (idem.Store, error) {
			return New(newClient(testEndpointEnv()), table), nil
		},
		Corrupt: func(t testing.TB, s idem.Store, key string) {
			ds := s.(*Store)
			_, err := ds.Client().UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
				TableName:                 aws.String(ds.Table()),
				Key:                       ds.keyOf(key),
				UpdateExpression:          aws.String("SET #s = :bogus"),
				ExpressionAttributeNames:  map[string]string{"#s": attrStatus},
				ExpressionAttributeValues: map[string]types.AttributeValue{":bogus": str("bogus")},
			})
			if err != nil {
				t.Fatalf("corrupting %q: %v", key, err)
			}
		},
		Unreachable: func(t testing.TB) idem.Store {
			// Nothing listens on port 1.
			return New(newClient("http://127.0.0.1:1", func(o *dynamodb.Options) { o.RetryMaxAttempts = 2 }), "unreachable")
		},
		Parallelism: 8,
	}
}

// TestConformance runs the whole suite, with a clock the tests advance,
// and the tests of separate processes (on the real clock).
func TestConformance(t *testing.T) { idemtest.TestStore(t, harness(t)) }

// TestConformanceRealClock runs the suite on the real clock: the suite
// sleeps through short leases and retentions.
func TestConformanceRealClock(t *testing.T) {
	if testing.Short() {
		t.Skip("sleeps through leases; skipped with -short")
	}
	h := harness(t)
	h.New = func(t testing.TB) idem.Store { return New(testClient(t), newTable(t)) }
	h.Advance = nil
	h.Locator, h.Open = nil, nil
	idemtest.TestStore(t, h)
}

var _ = time.Second
