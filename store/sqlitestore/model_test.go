package sqlitestore

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/modeltest"
)

// TestModel compares the store with the store package's state machine on
// random operations, at exact times (see internal/modeltest), with
// implicit journals on and off.
func TestModel(t *testing.T) {
	for _, implicit := range []bool{true, false} {
		for seed := range uint64(4) {
			t.Run(fmt.Sprint("implicit=", implicit, "/", seed), func(t *testing.T) {
				t.Parallel()
				// The store keeps microseconds: a clock at that precision
				// compares exactly.
				clock := idemtest.NewClock(time.Date(2025, 3, 1, 12, 0, 0, 123456000, time.UTC))
				s, err := Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"),
					WithClock(clock.Now), WithImplicitJournal(implicit))
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				modeltest.Run(t, modeltest.Config{Store: s, Advance: clock.Advance, Exact: true, Sweep: true}, seed, 400)
			})
		}
	}
}
