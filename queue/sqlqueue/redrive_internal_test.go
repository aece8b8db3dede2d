package sqlqueue

import (
	"errors"
	"slices"
	"testing"
)

// TestRedriveSteps checks the steps Redrive takes on both databases: at
// most redriveChunk a step, no more than limit in all, until a step moves
// fewer than it asked for or fails.
func TestRedriveSteps(t *testing.T) {
	boom := errors.New("boom")
	for _, c := range []struct {
		name      string
		limit     int
		dead      int   // dead letters waiting
		failAt    int   // the step that fails (1-based; 0: none)
		wantSteps []int // the sizes asked for
		wantTotal int
	}{
		{"all_none", 0, 0, 0, []int{1000}, 0},
		{"all_some", 0, 3, 0, []int{1000}, 3},
		{"all_exactly_one_step", 0, 1000, 0, []int{1000, 1000}, 1000},
		{"all_several_steps", 0, 2500, 0, []int{1000, 1000, 1000}, 2500},
		{"limit_below_step", 2, 5, 0, []int{2}, 2},
		{"limit_over_steps", 2100, 5000, 0, []int{1000, 1000, 100}, 2100},
		{"limit_over_dead", 2100, 1500, 0, []int{1000, 1000}, 1500},
		{"negative_limit_is_all", -1, 1200, 0, []int{1000, 1000}, 1200},
		{"fails_after_a_step", 0, 2500, 2, []int{1000, 1000}, 1000},
	} {
		left := c.dead
		var steps []int
		total, err := redrive(c.limit, func(n int) (int, error) {
			steps = append(steps, n)
			if len(steps) == c.failAt {
				return 0, boom
			}
			moved := min(n, left)
			left -= moved
			return moved, nil
		})
		if !slices.Equal(steps, c.wantSteps) || total != c.wantTotal || (c.failAt > 0) != errors.Is(err, boom) {
			t.Errorf("%s: steps %v, total %d, err %v; want steps %v, total %d, failing %v",
				c.name, steps, total, err, c.wantSteps, c.wantTotal, c.failAt > 0)
		}
	}
}
