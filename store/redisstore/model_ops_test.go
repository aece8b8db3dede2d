package redisstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/modeltest"
)

// TestModelOps compares the store with the store package's state machine on random
// operations, batches, deletes, sweeps and lists included (see
// internal/modeltest).
func TestModelOps(t *testing.T) {
	testURL(t)
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			clocks := new(testClocks)
			s := newTestStore(t, clocks)
			modeltest.Run(t, modeltest.Config{Store: s, Advance: func(d time.Duration) { clocks.advance(t, d) }, Sweep: true}, seed, 300)
		})
	}
}
