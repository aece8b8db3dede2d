package dynamostore

import (
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/modeltest"
)

// TestModel compares the store with the store package's state machine on random
// operations, at exact times (see internal/modeltest).
func TestModel(t *testing.T) {
	testEndpoint(t)
	for _, rf := range []bool{false, true} {
		for seed := range uint64(3) {
			t.Run(fmt.Sprint(rf, seed), func(t *testing.T) {
				clock := idemtest.NewClock(time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC))
				s := New(testClient(t), newTable(t), WithClock(clock.Now), WithReadFirst(rf))
				modeltest.Run(t, modeltest.Config{Store: s, Advance: clock.Advance, Exact: true, Sweep: true}, seed, 200)
			})
		}
	}
}
