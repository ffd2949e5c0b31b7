// Package timeline keeps the last hour of what the operator's page charts,
// per upstream, in one-minute buckets: requests by outcome class, p50 and
// p99 latency, retries, dead letters recorded and the time the breaker
// spent in each state; and, for the whole process, the idempotency store's
// size. It lives in this process's memory only: each replica keeps its
// own, and a restart starts empty. Prometheus (/metrics) is the place for
// anything longer or fleet-wide.
//
// # Layout and memory
//
// Each upstream has a ring of Buckets cells (default 60). The cell for the
// minute m (minutes since the Unix epoch) is cells[m mod Buckets] and
// records m; a cell holding an older minute is stale and is cleared the
// first time the minute that replaces it is written. So the ring rolls over
// lazily, on the injected clock, with no goroutine and no timer: a reader
// asks for the minutes [now-Buckets+1, now] and takes a cell only if it
// holds the minute asked for. A write for a minute older than what its
// cell holds (the clock stepped back by more than the window) is dropped.
//
// A cell is a fixed-size struct of 904 bytes (a latency histogram of 194
// uint32 counters, one counter per outcome class, retries, dead letters,
// three state durations), all allocated when the Timeline is made:
//
//	Buckets × upstreams × 904 B  +  Buckets × 64 B (store samples)
//
// 60 × 10 upstreams ≈ 0.5 MiB; MemoryBytes says it exactly. Upstreams not
// named in Options.Upstreams are not kept, and unknown outcome classes
// count as "other", so nothing a client sends can grow it.
//
// # Percentiles
//
// Latency goes into a fixed log-scale histogram per cell: bucket k covers
// [64 µs·γ^k, 64 µs·γ^(k+1)) with γ = 2^(1/8), up to 2^30 µs (about 17.9
// minutes), plus one bucket below and one above. A percentile is the
// nearest-rank sample's bucket, reported at the point 2γ/(γ+1) of its
// lower bound, so it is within (γ-1)/(γ+1) < 4.4% of that sample's true
// value, whatever the distribution. Below 64 µs it reads 64 µs (an upper
// bound); past the top it reads the top (a lower bound).
package timeline

import (
	"math"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/gateway/outcome"
)

// Options configure a Timeline. The zero value keeps no upstreams.
type Options struct {
	// Upstreams are the upstreams kept; what is reported for any other
	// name is dropped.
	Upstreams []string
	// Buckets is how many buckets are kept. If <= 0, 60.
	Buckets int
	// Width is the time one bucket covers. If <= 0, one minute.
	Width time.Duration
	// Now is the clock: it decides which bucket a report lands in and when
	// the ring rolls over. If nil, time.Now.
	Now func() time.Time
}

// classNames are the outcome classes a bucket counts, in the order the
// page stacks them: every class a request can end with (outcome.Classes,
// group by group), then "other" for any class not in the list.
var classNames = func() []string {
	var out []string
	for _, c := range outcome.Classes() {
		out = append(out, string(c))
	}
	out = append(out, Other)
	if len(out) != numClasses {
		panic("timeline: numClasses is not the number of outcome classes + 1")
	}
	return out
}()

// numClasses is how many counters a cell has: len(outcome.Classes()) + 1.
const numClasses = 21

// Classes returns the outcome classes a bucket counts, in the order the
// page stacks them.
func Classes() []string { return slices.Clone(classNames) }

// Other is the class an unlisted class is counted as.
const Other = "other"

var classIndex = func() map[string]int {
	m := make(map[string]int, numClasses)
	for i, c := range classNames {
		m[c] = i
	}
	return m
}()

// states are the breaker states a cell times, indexed by stateIndex.
var states = [...]breaker.State{breaker.Closed, breaker.HalfOpen, breaker.Open}

func stateIndex(s breaker.State) int {
	switch s {
	case breaker.HalfOpen:
		return 1
	case breaker.Open:
		return 2
	}
	return 0
}

// Timeline is the ring. Its methods are safe for concurrent use.
type Timeline struct {
	n     int
	width time.Duration
	now   func() time.Time
	names []string
	ups   map[string]*upstream // fixed at New: read without a lock

	storeMu sync.Mutex
	store   []storeCell
}

type upstream struct {
	mu    sync.Mutex
	cells []cell
	// state is the breaker's state since since; the time up to since is
	// already in the cells.
	state breaker.State
	since time.Time
}

// cell is one upstream's bucket.
type cell struct {
	minute      int64 // the bucket it holds; see the package doc
	classes     [numClasses]uint32
	retries     uint32
	deadLetters uint32
	inState     [len(states)]time.Duration
	lat         histogram
}

type storeCell struct {
	minute int64
	stats  cache.Stats
}

// New makes the ring for o.Upstreams, each breaker closed as of now.
func New(o Options) *Timeline {
	t := &Timeline{n: o.Buckets, width: o.Width, now: o.Now, ups: make(map[string]*upstream, len(o.Upstreams))}
	if t.n <= 0 {
		t.n = 60
	}
	if t.width <= 0 {
		t.width = time.Minute
	}
	if t.now == nil {
		t.now = time.Now
	}
	now := t.now()
	for _, name := range o.Upstreams {
		if _, dup := t.ups[name]; dup {
			continue
		}
		t.names = append(t.names, name)
		u := &upstream{cells: make([]cell, t.n), state: breaker.Closed, since: now}
		for i := range u.cells {
			u.cells[i].minute = math.MinInt64
		}
		t.ups[name] = u
	}
	t.store = make([]storeCell, t.n)
	for i := range t.store {
		t.store[i].minute = math.MinInt64
	}
	return t
}

// MemoryBytes is what the ring's cells take, fixed at New: the bound in
// the package doc.
func (t *Timeline) MemoryBytes() int {
	return t.n*len(t.ups)*int(unsafe.Sizeof(cell{})) + t.n*int(unsafe.Sizeof(storeCell{}))
}

// bucketOf is the index of the bucket holding at (floor division, so a
// clock before 1970 still works).
func (t *Timeline) bucketOf(at time.Time) int64 {
	ns, w := at.UnixNano(), int64(t.width)
	b := ns / w
	if ns%w < 0 {
		b--
	}
	return b
}

func (t *Timeline) startOf(b int64) time.Time { return time.Unix(0, b*int64(t.width)).UTC() }

func (t *Timeline) slot(b int64) int {
	i := int(b % int64(t.n))
	if i < 0 {
		i += t.n
	}
	return i
}

// cellFor returns the cell for bucket b to write, clearing it if it held
// an older bucket, or nil if it holds a newer one (b is out of the window).
// u.mu must be held.
func (t *Timeline) cellFor(u *upstream, b int64) *cell {
	c := &u.cells[t.slot(b)]
	switch {
	case c.minute == b:
		return c
	case c.minute > b:
		return nil
	}
	*c = cell{minute: b}
	return c
}

// Request records a request's end on upstream: its outcome class, its
// duration, and how many retries it took there.
func (t *Timeline) Request(upstream, class string, d time.Duration, retries int) {
	u := t.ups[upstream]
	if u == nil {
		return
	}
	ci, ok := classIndex[class]
	if !ok {
		ci = classIndex[Other]
	}
	b := t.bucketOf(t.now())
	u.mu.Lock()
	defer u.mu.Unlock()
	c := t.cellFor(u, b)
	if c == nil {
		return
	}
	c.classes[ci]++
	if retries > 0 {
		c.retries += uint32(retries)
	}
	c.lat.add(d)
}

// DeadLetter records a dead letter whose last upstream tried was upstream.
func (t *Timeline) DeadLetter(upstream string) {
	u := t.ups[upstream]
	if u == nil {
		return
	}
	b := t.bucketOf(t.now())
	u.mu.Lock()
	defer u.mu.Unlock()
	if c := t.cellFor(u, b); c != nil {
		c.deadLetters++
	}
}

// BreakerState records that upstream's breaker is in state to from now on
// (the breaker registry's OnStateChange).
func (t *Timeline) BreakerState(upstream string, to breaker.State) {
	u := t.ups[upstream]
	if u == nil {
		return
	}
	now := t.now()
	u.mu.Lock()
	defer u.mu.Unlock()
	t.accrue(u, now)
	u.state = to
}

// accrue adds the time from u.since to now, spent in u.state, to the cells
// of the buckets it covers (within the window), and moves u.since to now.
// u.mu must be held.
func (t *Timeline) accrue(u *upstream, now time.Time) {
	if !now.After(u.since) {
		return // the clock stepped back: count nothing, keep since
	}
	from, si := u.since, stateIndex(u.state)
	last := t.bucketOf(now)
	first := max(t.bucketOf(from), last-int64(t.n)+1)
	for b := first; b <= last; b++ {
		lo, hi := t.startOf(b), t.startOf(b+1)
		if from.After(lo) {
			lo = from
		}
		if now.Before(hi) {
			hi = now
		}
		if c := t.cellFor(u, b); c != nil && hi.After(lo) {
			c.inState[si] += hi.Sub(lo)
		}
	}
	u.since = now
}

// StoreSize records a sample of the store's figures; the bucket keeps the
// last one taken in it. (cache.Stats is a scan of the store, so the
// gateway samples it where it reads it anyway: the page and /metrics.)
func (t *Timeline) StoreSize(st cache.Stats) {
	b := t.bucketOf(t.now())
	t.storeMu.Lock()
	defer t.storeMu.Unlock()
	c := &t.store[t.slot(b)]
	if c.minute > b {
		return
	}
	*c = storeCell{minute: b, stats: st}
}

// Snapshot is the window as of its End: every bucket from the oldest to
// the current one, empty buckets included.
type Snapshot struct {
	// Start is the start of the oldest bucket; End is now, inside the
	// newest.
	Start, End time.Time
	Width      time.Duration
	Buckets    int
	Upstreams  []Upstream
	// Store has one entry per bucket, oldest first.
	Store []StoreBucket
}

// Upstream is one upstream's buckets, oldest first.
type Upstream struct {
	Name    string
	State   breaker.State // as of End
	Buckets []Bucket
}

// Bucket is what one upstream did in one bucket.
type Bucket struct {
	Start time.Time
	// Classes counts requests by outcome class, in the order of Classes(),
	// classes with no request left out.
	Classes  []ClassCount
	Requests int
	// P50 and P99 are the request latency percentiles, to the last byte
	// (see the package doc for their error); zero when Requests is 0.
	P50, P99    time.Duration
	Retries     int
	DeadLetters int
	// Closed, HalfOpen and Open are the time the breaker spent in each
	// state within the bucket (up to End for the newest). Before the
	// Timeline was made they are all zero.
	Closed, HalfOpen, Open time.Duration
}

// ClassCount is the number of requests of one class.
type ClassCount struct {
	Class string
	Count int
}

// StoreBucket is the last store sample taken in a bucket.
type StoreBucket struct {
	Start   time.Time
	Sampled bool
	Stats   cache.Stats
}

// Snapshot copies the window out.
func (t *Timeline) Snapshot() Snapshot {
	now := t.now()
	last := t.bucketOf(now)
	first := last - int64(t.n) + 1
	s := Snapshot{Start: t.startOf(first), End: now, Width: t.width, Buckets: t.n}
	for _, name := range t.names {
		s.Upstreams = append(s.Upstreams, t.upstreamSnapshot(name, first, last, now))
	}
	t.storeMu.Lock()
	for b := first; b <= last; b++ {
		sb := StoreBucket{Start: t.startOf(b)}
		if c := t.store[t.slot(b)]; c.minute == b {
			sb.Sampled, sb.Stats = true, c.stats
		}
		s.Store = append(s.Store, sb)
	}
	t.storeMu.Unlock()
	return s
}

func (t *Timeline) upstreamSnapshot(name string, first, last int64, now time.Time) Upstream {
	u := t.ups[name]
	u.mu.Lock()
	defer u.mu.Unlock()
	t.accrue(u, now)
	out := Upstream{Name: name, State: u.state, Buckets: make([]Bucket, 0, t.n)}
	for b := first; b <= last; b++ {
		bk := Bucket{Start: t.startOf(b)}
		if c := &u.cells[t.slot(b)]; c.minute == b {
			for i, n := range c.classes {
				if n > 0 {
					bk.Classes = append(bk.Classes, ClassCount{Class: classNames[i], Count: int(n)})
					bk.Requests += int(n)
				}
			}
			bk.P50, bk.P99 = c.lat.quantile(0.50), c.lat.quantile(0.99)
			bk.Retries, bk.DeadLetters = int(c.retries), int(c.deadLetters)
			bk.Closed, bk.HalfOpen, bk.Open = c.inState[0], c.inState[1], c.inState[2]
		}
		out.Buckets = append(out.Buckets, bk)
	}
	return out
}

// Count is the number of requests of class in b.
func (b Bucket) Count(class string) int {
	i := slices.IndexFunc(b.Classes, func(c ClassCount) bool { return c.Class == class })
	if i < 0 {
		return 0
	}
	return b.Classes[i].Count
}
