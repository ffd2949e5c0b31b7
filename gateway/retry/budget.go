package retry

import (
	"sync"
	"time"
)

// budgetBuckets is how many buckets a Budget's window is cut into: the
// window slides in steps of Window/budgetBuckets.
const budgetBuckets = 10

// Budget limits retries process-wide, like Finagle's RetryBudget and
// Envoy's retry budgets: over the last Window, retries may add at most
// Ratio of the requests seen, plus MinPerSecond retries per second that are
// always allowed, so that light traffic is never starved of retries. It
// keeps an outage from multiplying the load on the upstreams by the
// attempts per request: when most requests fail, most get no retry.
//
// Where clients share the gateway (BudgetOptions.ClientShare), one
// client's retries over the window may take at most half of what it
// allows, as every global bound has a per-client share: a tenant whose
// requests fail in a flood leaves the other half to the others'
// transient failures.
//
// It is safe for concurrent use, and each call is O(1): counts live in a
// ring of buckets, with running totals.
type Budget struct {
	ratio   float64
	reserve float64 // MinPerSecond × Window, in retries
	width   time.Duration
	now     func() time.Time
	start   time.Time
	share   bool

	mu                sync.Mutex
	requests, retries window
	// clients are each client's retries over the window (ClientShare),
	// one entry per client that retried: the configured clients.
	clients map[string]*window
}

// window counts events over the Budget's window: a ring of budgetBuckets
// buckets with a running total, at bucket cur (counted from the Budget's
// start). Each is moved on when next counted or read.
type window struct {
	cur     int64
	buckets [budgetBuckets]int64
	total   int64
}

// advance moves the ring to bucket n, emptying the buckets that left the
// window; it touches at most budgetBuckets buckets. A bucket before cur (a
// clock that went back, an injected Now) leaves the ring where it is.
func (w *window) advance(n int64) {
	if n <= w.cur {
		return
	}
	if n-w.cur >= budgetBuckets {
		w.buckets = [budgetBuckets]int64{}
		w.total = 0
	} else {
		for i := w.cur + 1; i <= n; i++ {
			w.total -= w.buckets[i%budgetBuckets]
			w.buckets[i%budgetBuckets] = 0
		}
	}
	w.cur = n
}

// add counts one event in the current bucket.
func (w *window) add() {
	w.buckets[w.cur%budgetBuckets]++
	w.total++
}

// BudgetOptions configures a Budget. The zero value works.
type BudgetOptions struct {
	// Ratio is how many retries per request the window allows. If <= 0,
	// 0.2 is used.
	Ratio float64
	// MinPerSecond is a floor of retries per second allowed whatever the
	// requests. If < 0, 0 is used; if == 0, 10.
	MinPerSecond float64
	// Window is the time over which requests and retries are counted. If
	// <= 0, 10s is used.
	Window time.Duration
	// Now tells the time. If nil, time.Now is used.
	Now func() time.Time
	// ClientShare holds each client's retries (TryRetryFor) to half of
	// what the window allows: set where two or more clients share the
	// gateway.
	ClientShare bool
}

// NewBudget returns a Budget with no requests and no retries recorded.
func NewBudget(o BudgetOptions) *Budget {
	if o.Ratio <= 0 {
		o.Ratio = 0.2
	}
	switch {
	case o.MinPerSecond < 0:
		o.MinPerSecond = 0
	case o.MinPerSecond == 0:
		o.MinPerSecond = 10
	}
	if o.Window <= 0 {
		o.Window = 10 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Budget{
		ratio:   o.Ratio,
		reserve: o.MinPerSecond * o.Window.Seconds(),
		width:   max(o.Window/budgetBuckets, 1),
		now:     o.Now,
		start:   o.Now(),
		share:   o.ClientShare,
	}
}

// Request records one client request (its first attempt).
func (b *Budget) Request() {
	b.mu.Lock()
	b.requests.advance(b.bucket())
	b.requests.add()
	b.mu.Unlock()
}

// TryRetry reserves one retry if the budget allows it, and reports whether
// it did; false means the retry is denied.
func (b *Budget) TryRetry() bool { return b.TryRetryFor("") }

// TryRetryFor is TryRetry for a retry of client's ("" for none: held to
// no share), held to its share when the Budget keeps shares
// (ClientShare).
func (b *Budget) TryRetryFor(client string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.bucket()
	b.requests.advance(n)
	b.retries.advance(n)
	// The small epsilon keeps float rounding (0.1 × 10 s) from denying a
	// retry the options plainly allow.
	allowed := b.ratio*float64(b.requests.total) + b.reserve + 1e-9
	if float64(b.retries.total+1) > allowed {
		return false
	}
	if b.share && client != "" {
		c := b.clients[client]
		if c == nil {
			if b.clients == nil {
				b.clients = map[string]*window{}
			}
			c = new(window)
			b.clients[client] = c
		}
		c.advance(b.retries.cur)
		// At least one: with an allowance under 2, half would leave
		// every client none.
		if float64(c.total+1) > max(allowed/2, 1) {
			return false
		}
		c.add()
	}
	b.retries.add()
	return true
}

// bucket is the bucket now falls in, counted from start (now.Sub(start)
// uses the monotonic clock when both have one).
func (b *Budget) bucket() int64 { return int64(b.now().Sub(b.start) / b.width) }
