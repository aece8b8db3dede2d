package queue

import (
	"math"
	"testing"
	"time"
)

// The retry delay stays between half the cap and the cap however many
// receives a message had, even when the cap is so large that doubling the
// base would overflow a Duration (WithBackoff(base, math.MaxInt64) for "no
// cap", a poison message under WithMaxReceives(0)). An overflow made the
// delay negative and rand.N panic, taking the process down.
func TestBackoffDoesNotOverflow(t *testing.T) {
	for _, tc := range []struct{ base, max time.Duration }{
		{time.Second, math.MaxInt64},
		{time.Second, math.MaxInt64/2 + 1},
		{time.Millisecond, 200 * 365 * 24 * time.Hour},
		{time.Second, 5 * time.Minute},
	} {
		c := &Consumer{cfg: defaultConfig()}
		WithBackoff(tc.base, tc.max)(&c.cfg)
		for n := 0; n <= 200; n++ {
			var d time.Duration
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("backoff(%d) with base %v, max %v panicked: %v", n, tc.base, tc.max, p)
					}
				}()
				d = c.backoff(n)
			}()
			if d <= 0 || d > tc.max {
				t.Fatalf("backoff(%d) with base %v, max %v = %v, want in (0, max]", n, tc.base, tc.max, d)
			}
			if n > 64 && d < tc.max/2 {
				t.Fatalf("backoff(%d) with base %v, max %v = %v, want at least half the cap", n, tc.base, tc.max, d)
			}
		}
	}
}
