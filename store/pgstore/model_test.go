package pgstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/modeltest"
)

// TestModel compares the store with the store package's state machine on random
// operations (see internal/modeltest).
//
// With WithImplicitJournal(false) as well: the store then leaves no
// implicit journal (checked at the end) and answers the same.
func TestModel(t *testing.T) {
	testURL(t)
	for _, implicit := range []bool{true, false} {
		for seed := range uint64(6) {
			t.Run(fmt.Sprintf("implicit=%v/%d", implicit, seed), func(t *testing.T) {
				clocks := new(testClocks)
				s := newTestStore(t, clocks, WithImplicitJournal(implicit))
				modeltest.Run(t, modeltest.Config{Store: s, Advance: func(d time.Duration) { clocks.advance(t, d) }, Sweep: true}, seed, 300)
				var rows, implicitRows int
				if err := s.Pool().QueryRow(context.Background(), "SELECT count(*), count(*) FILTER (WHERE journal IS NULL) FROM "+s.Table()).Scan(&rows, &implicitRows); err != nil {
					t.Fatal(err)
				}
				if !implicit && implicitRows > 0 {
					t.Fatalf("%d rows, %d with an implicit journal; WithImplicitJournal(%v)", rows, implicitRows, implicit)
				}
			})
		}
	}
}
