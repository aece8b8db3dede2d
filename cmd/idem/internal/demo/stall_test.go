package demo

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/store/memstore"
)

// Timeout bounds a run that makes no progress, not a long one that does:
// `idem demo --orders 20000` must not fail for taking more than a minute.
func TestRunTakesLongerThanItsTimeoutWhileItProgresses(t *testing.T) {
	timeout := time.Second
	start := time.Now()
	sum, err := Run(context.Background(), Config{Store: memstore.New(), Orders: 400, SendTime: 60 * time.Millisecond,
		Lease: 300 * time.Millisecond, Timeout: timeout})
	if err != nil {
		t.Fatalf("after %v: %v", time.Since(start), err)
	}
	if took := time.Since(start); took < timeout {
		t.Skipf("the run took %v, less than its timeout: nothing shown", took)
	}
	if err := sum.Check(); err != nil {
		t.Error(err)
	}
}
