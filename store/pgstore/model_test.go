package pgstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/modeltest"
)

// TestModel compares the store with internal/transition on random
// operations (see internal/modeltest).
func TestModel(t *testing.T) {
	testURL(t)
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			clocks := new(testClocks)
			s := newTestStore(t, clocks)
			modeltest.Run(t, modeltest.Config{Store: s, Advance: func(d time.Duration) { clocks.advance(t, d) }, Sweep: true}, seed, 300)
		})
	}
}
