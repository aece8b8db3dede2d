package idemtest

import (
	"sync"
	"testing"
	"time"
)

// Clock is a fake clock for stores under test: time stands still until
// Advance moves it. It is safe for concurrent use. Pass its Now method to a
// store's clock option.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock that reads start until advanced.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Clocks hands out one [Clock] per test, which is what a [Harness] needs:
// the suite runs tests in parallel, and a lease that one test lets lapse
// must not lapse in another. Use Get in Harness.New and Advance as
// Harness.Advance:
//
//	var clocks idemtest.Clocks
//	h := idemtest.Harness{
//		New: func(t testing.TB) store.Store {
//			return memstore.New(memstore.WithClock(clocks.Get(t).Now))
//		},
//		Advance: clocks.Advance,
//	}
//
// The zero value is ready to use. Every clock starts at the same fixed time
// (2030-01-02 03:04:05 UTC), so tests do not depend on the machine's date.
type Clocks struct {
	mu sync.Mutex
	m  map[testing.TB]*Clock
}

// ClockStart is the time every clock from [Clocks] starts at.
var ClockStart = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// Get returns t's clock, making it on first use. It is forgotten when t ends.
func (c *Clocks) Get(t testing.TB) *Clock {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[testing.TB]*Clock)
	}
	if k, ok := c.m[t]; ok {
		return k
	}
	k := NewClock(ClockStart)
	c.m[t] = k
	t.Cleanup(func() {
		c.mu.Lock()
		delete(c.m, t)
		c.mu.Unlock()
	})
	return k
}

// Advance moves t's clock forward by d. Its signature is Harness.Advance's.
func (c *Clocks) Advance(t testing.TB, d time.Duration) { c.Get(t).Advance(d) }
