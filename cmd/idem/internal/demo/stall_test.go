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
	// A lease of 600 ms, not 300: at 300 ms attempts that did not crash
	// lapsed on a loaded machine. The timeout is then at least twice the
	// visibility (5/3 of the lease), 2 s, and 600 orders take longer.
	const lease = 600 * time.Millisecond
	timeout := 2 * (lease * 5 / 3)
	start := time.Now()
	sum, err := Run(context.Background(), Config{Store: memstore.New(), Orders: 600, SendTime: 60 * time.Millisecond,
		Lease: lease, Timeout: timeout})
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
