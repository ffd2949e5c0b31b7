package request

import (
	"sync"
	"sync/atomic"
	"time"
)

// callers runs keyed calls whose client set a deadline (X-Llmgate-Deadline:
// the handler returns at it, the call runs on) on goroutines kept between
// calls; the others run on their handler's goroutine (runHere). A keyed
// call's path (proxy, retry loop, attempt, tracing, the upstream's
// transport) is deeper than a new goroutine's first stack, so a call on a
// goroutine of its own grew and copied its stack on every request
// (runtime.newstack: ~7 µs of a keyed request's CPU at 16 clients, the
// load tool's profile); a kept goroutine has grown it already. A call goes
// to an idle goroutine when there is one, else to a new one, so a call
// never waits for another. A goroutine idle for callerIdle, or finding
// maxIdleCallers idle already, ends; every idle one ends at stop.
type callers struct {
	calls    chan func() // unbuffered: a send is taken by an idle goroutine
	quit     chan struct{}
	stopOnce sync.Once
	idle     atomic.Int32
	idleFor  time.Duration
	maxIdle  int32
}

const (
	// callerIdle is how long a kept goroutine waits for the next call: long
	// enough to span the gaps of steady traffic, short enough that the
	// goroutines of a burst do not outlast it by much.
	callerIdle = 5 * time.Second
	// maxIdleCallers bounds the goroutines kept idle (each holds a stack of
	// a few KiB), whatever burst made them.
	maxIdleCallers = 256
)

func newCallers() *callers {
	return &callers{calls: make(chan func()), quit: make(chan struct{}), idleFor: callerIdle, maxIdle: maxIdleCallers}
}

// run runs f on a kept goroutine, or on a new one.
func (c *callers) run(f func()) {
	select {
	case c.calls <- f:
	default:
		go c.serve(f)
	}
}

// serve runs f, then the calls handed to it while it is kept.
func (c *callers) serve(f func()) {
	var t *time.Timer
	for {
		f()
		if c.idle.Add(1) > c.maxIdle {
			c.idle.Add(-1)
			return
		}
		if t == nil {
			t = time.NewTimer(c.idleFor)
		} else {
			t.Reset(c.idleFor)
		}
		select {
		case f = <-c.calls:
			c.idle.Add(-1)
		case <-t.C:
			c.idle.Add(-1)
			return
		case <-c.quit:
			c.idle.Add(-1)
			t.Stop()
			return
		}
	}
}

// stop ends the idle goroutines, and each running one when its call ends.
// A call run after stop still runs, on a goroutine that then ends.
func (c *callers) stop() { c.stopOnce.Do(func() { close(c.quit) }) }
