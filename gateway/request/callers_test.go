package request

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// goid is the calling goroutine's id, from its stack's first line.
func goid() string {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	return string(bytes.Fields(b)[1])
}

// TestCallersKeepTheirGoroutines: a call after another has ended runs on
// the same goroutine (whose stack has grown already), a call while another
// runs gets one of its own, and the kept ones end when idle too long or at
// stop.
func TestCallersKeepTheirGoroutines(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newCallers()
	defer c.stop()
	ids := make(chan string, 1)
	c.run(func() { ids <- goid() })
	first := <-ids
	waitIdle(t, c, 1)
	c.run(func() { ids <- goid() })
	if again := <-ids; again != first {
		t.Errorf("the second call ran on goroutine %s, not on the kept %s", again, first)
	}

	// Two calls at once: the second does not wait for the first.
	waitIdle(t, c, 1)
	release := make(chan struct{})
	c.run(func() { <-release })
	c.run(func() { ids <- goid() })
	select {
	case <-ids:
	case <-time.After(10 * time.Second):
		t.Fatal("a call waited for another call to end")
	}
	close(release)
	waitIdle(t, c, 2)
	c.stop()
	waitIdle(t, c, 0)
	// After stop a call still runs, on a goroutine that then ends.
	c.run(func() { ids <- goid() })
	<-ids
}

// TestCallersIdleEnd: a kept goroutine ends after idleFor, and no more
// than maxIdle are kept.
func TestCallersIdleEnd(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := newCallers()
	c.idleFor, c.maxIdle = time.Millisecond, 1
	release := make(chan struct{})
	started := make(chan struct{}, 3)
	for range 3 {
		c.run(func() { started <- struct{}{}; <-release })
	}
	for range 3 {
		<-started
	}
	close(release)
	// At most one is kept, and it ends once idle for idleFor.
	waitIdle(t, c, 0)
}

// waitIdle waits until n kept goroutines are parked waiting for a call
// (counted from the goroutines' stacks: the idle count is raised just
// before a goroutine parks).
func waitIdle(t *testing.T, c *callers, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		parked := 0
		buf := make([]byte, 1<<20)
		for _, g := range bytes.Split(buf[:runtime.Stack(buf, true)], []byte("\n\n")) {
			if bytes.Contains(g, []byte("[select")) && bytes.Contains(g, []byte("(*callers).serve")) {
				parked++
			}
		}
		if parked == n && c.idle.Load() == int32(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines parked (%d counted idle), want %d", parked, c.idle.Load(), n)
		}
		runtime.Gosched()
	}
}
