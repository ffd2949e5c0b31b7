package sim

import (
	"sync"
	"time"
)

// Clock is the stores' clock in a simulation: real time plus an offset the
// simulation moves forward (Advance) to make every lease run out at once.
// Its After fires on real time or when an Advance passes it, whichever is
// first, so a store's Wait wakes when a jump expires the lease it waits on.
type Clock struct {
	mu       sync.Mutex
	offset   time.Duration
	timers   map[*clockTimer]struct{}
	advances int
}

type clockTimer struct {
	at time.Time
	ch chan time.Time
}

// NewClock returns a clock at real time.
func NewClock() *Clock { return &Clock{timers: map[*clockTimer]struct{}{}} }

// Now is real time plus the offset.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

// After is time.After on this clock.
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	t := &clockTimer{at: time.Now().Add(c.offset + d), ch: make(chan time.Time, 1)}
	c.timers[t] = struct{}{}
	c.mu.Unlock()
	time.AfterFunc(d, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.fire(t)
	})
	return t.ch
}

// fire sends once on t's channel; c.mu is held.
func (c *Clock) fire(t *clockTimer) {
	if _, ok := c.timers[t]; !ok {
		return
	}
	delete(c.timers, t)
	t.ch <- time.Now().Add(c.offset)
}

// Advance moves the clock forward by d and fires the timers it passes.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
	c.advances++
	now := time.Now().Add(c.offset)
	for t := range c.timers {
		if !t.at.After(now) {
			c.fire(t)
		}
	}
}

// Advances is how many times the clock has been moved.
func (c *Clock) Advances() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.advances
}
