package retry

import (
	"sync"
	"testing"
	"time"
)

// clock is an injectable Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newClock() *clock { return &clock{t: time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)} }

// retries counts how many of n TryRetry calls b allows.
func retries(b *Budget, n int) int {
	allowed := 0
	for range n {
		if b.TryRetry() {
			allowed++
		}
	}
	return allowed
}

func requests(b *Budget, n int) {
	for range n {
		b.Request()
	}
}

func TestBudgetFloor(t *testing.T) {
	c := newClock()
	// Ratio 0 means the default 0.2, but with no requests only the floor
	// counts: 0.1/s over 10s is one retry.
	b := NewBudget(BudgetOptions{Ratio: 0, MinPerSecond: 0.1, Window: 10 * time.Second, Now: c.Now})
	if !b.TryRetry() {
		t.Fatal("first retry denied")
	}
	if b.TryRetry() {
		t.Fatal("second retry allowed")
	}
	c.Advance(10 * time.Second)
	if !b.TryRetry() {
		t.Error("a retry denied once the window has passed")
	}
}

func TestBudgetRatio(t *testing.T) {
	c := newClock()
	b := NewBudget(BudgetOptions{Ratio: 0.5, MinPerSecond: -1, Window: 10 * time.Second, Now: c.Now})
	if b.TryRetry() {
		t.Fatal("a retry allowed with no requests and no floor")
	}
	requests(b, 10)
	if got := retries(b, 20); got != 5 {
		t.Errorf("10 requests at ratio 0.5 allowed %d retries, want 5", got)
	}
	requests(b, 2)
	if got := retries(b, 20); got != 1 {
		t.Errorf("2 more requests allowed %d more retries, want 1", got)
	}
}

func TestBudgetRatioPlusFloor(t *testing.T) {
	c := newClock()
	b := NewBudget(BudgetOptions{Ratio: 0.1, MinPerSecond: 0.2, Window: 10 * time.Second, Now: c.Now})
	requests(b, 30) // 3 from the ratio, 2 from the floor
	if got := retries(b, 20); got != 5 {
		t.Errorf("allowed %d retries, want 5", got)
	}
}

func TestBudgetWindowSlides(t *testing.T) {
	c := newClock()
	b := NewBudget(BudgetOptions{Ratio: 0.5, MinPerSecond: -1, Window: 10 * time.Second, Now: c.Now})
	requests(b, 4) // t=0: 4 requests
	c.Advance(5 * time.Second)
	requests(b, 4) // t=5s: 4 more
	if got := retries(b, 3); got != 3 {
		t.Fatalf("t=5s: allowed %d of 3 retries, want 3", got)
	}
	// t=10s: the first 4 requests have left the window; 4 remain, which
	// allow 2 retries, and the 3 made at t=5s are still counted.
	c.Advance(5 * time.Second)
	if b.TryRetry() {
		t.Error("t=10s: retry allowed with 3 retries for 4 requests in the window")
	}
	// t=15s: the requests and the retries of t=5s leave too.
	c.Advance(5 * time.Second)
	if b.TryRetry() {
		t.Error("t=15s: retry allowed with no requests in the window")
	}
	requests(b, 2)
	if !b.TryRetry() {
		t.Error("t=15s: retry denied after 2 new requests")
	}
	// A long silence empties everything at once.
	c.Advance(time.Hour)
	if b.TryRetry() {
		t.Error("after 1h: retry allowed with no requests")
	}
}

func TestBudgetClockBackwards(t *testing.T) {
	c := newClock()
	b := NewBudget(BudgetOptions{Ratio: 1, MinPerSecond: -1, Window: 10 * time.Second, Now: c.Now})
	c.Advance(30 * time.Second)
	requests(b, 1)
	c.Advance(-20 * time.Second)
	if !b.TryRetry() {
		t.Error("a clock going back lost the window's requests")
	}
}

func TestBudgetDefaults(t *testing.T) {
	c := newClock()
	b := NewBudget(BudgetOptions{Now: c.Now})
	// 10/s over 10s, plus 0.2 per request.
	requests(b, 50)
	if got := retries(b, 1000); got != 110 {
		t.Errorf("defaults allowed %d retries, want 110", got)
	}
}

func TestBudgetConcurrent(t *testing.T) {
	b := NewBudget(BudgetOptions{Ratio: 0.5, MinPerSecond: -1, Window: time.Hour})
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0
	for range 8 {
		wg.Go(func() {
			requests(b, 100)
			n := retries(b, 100)
			mu.Lock()
			allowed += n
			mu.Unlock()
		})
	}
	wg.Wait()
	if allowed > 400 {
		t.Errorf("800 requests at ratio 0.5 allowed %d retries, want <= 400", allowed)
	}
}

func BenchmarkBudget(b *testing.B) {
	bu := NewBudget(BudgetOptions{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			bu.Request()
			bu.TryRetry()
		}
	})
}

func BenchmarkBackoff(b *testing.B) {
	p := Policy{}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		p.Backoff(i%8, nil)
	}
}

// retriesFor counts how many of n retries of client b allows.
func retriesFor(b *Budget, client string, n int) int {
	allowed := 0
	for range n {
		if b.TryRetryFor(client) {
			allowed++
		}
	}
	return allowed
}

// With ClientShare, one client's retries over the window take at most
// half of what it allows; another client, or a retry of no client, gets
// the rest; a client's share frees as its retries leave the window.
// Without it, a client's retries are not held apart.
func TestBudgetClientShare(t *testing.T) {
	c := newClock()
	b := NewBudget(BudgetOptions{Ratio: 0.5, MinPerSecond: 1, Window: 10 * time.Second, Now: c.Now, ClientShare: true})
	requests(b, 20) // allows 0.5 × 20 + 10 = 20
	if got := retriesFor(b, "flooder", 30); got != 10 {
		t.Fatalf("the flooder got %d retries, want 10 (half of 20)", got)
	}
	if got := retriesFor(b, "victim", 30); got != 10 {
		t.Fatalf("the victim got %d retries after the flood, want the other 10", got)
	}
	c.Advance(10 * time.Second) // everything leaves the window
	requests(b, 4)              // allows 12
	if got := retriesFor(b, "flooder", 30); got != 6 {
		t.Fatalf("a window later the flooder got %d retries, want 6", got)
	}
	if got := retriesFor(b, "", 30); got != 6 {
		t.Fatalf("retries of no client got %d, want the 6 left (held to no share)", got)
	}

	// Buckets, not the whole window: the share frees as retries age out.
	c = newClock()
	b = NewBudget(BudgetOptions{Ratio: 1, MinPerSecond: -1, Window: 10 * time.Second, Now: c.Now, ClientShare: true})
	requests(b, 8) // t=0: allows 8, so 4 a client
	if got := retriesFor(b, "a", 4); got != 4 {
		t.Fatalf("t=0: %d of 4", got)
	}
	c.Advance(5 * time.Second)
	requests(b, 8) // allows 16, so 8 a client, 4 used
	if got := retriesFor(b, "a", 10); got != 4 {
		t.Fatalf("t=5s: %d more, want 4", got)
	}
	c.Advance(5 * time.Second) // t=0's requests and 4 retries leave: allows 8, so 4; 4 used
	if b.TryRetryFor("a") {
		t.Fatal("t=10s: a retry past the share")
	}
	c.Advance(5 * time.Second)
	requests(b, 8) // t=15s: allows 8, t=5s's retries left too
	if got := retriesFor(b, "a", 10); got != 4 {
		t.Fatalf("t=15s: %d, want 4", got)
	}

	// Half an allowance under 2 is still one retry a client (found by
	// review: every client got none while the budget allowed one).
	b = NewBudget(BudgetOptions{Ratio: 0.2, MinPerSecond: 1, Window: time.Second, Now: newClock().Now, ClientShare: true})
	requests(b, 3) // allows 1.6
	if got := retriesFor(b, "a", 3); got != 1 {
		t.Fatalf("an allowance of 1.6 gave a client %d retries, want 1", got)
	}

	b = NewBudget(BudgetOptions{Ratio: 0.5, MinPerSecond: 1, Window: 10 * time.Second, Now: newClock().Now})
	requests(b, 20)
	if got := retriesFor(b, "flooder", 30); got != 20 {
		t.Fatalf("without ClientShare the flooder got %d retries, want all 20", got)
	}
}
