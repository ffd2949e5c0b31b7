package timeline

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/cache"
)

// clock is a test clock that moves only when told to.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// t0 is on a minute boundary.
var t0 = time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)

func newRing(upstreams ...string) (*Timeline, *clock) {
	c := &clock{t: t0}
	return New(Options{Upstreams: upstreams, Now: c.Now}), c
}

// last is the newest n buckets of upstream i, oldest first.
func last(s Snapshot, i, n int) []Bucket {
	b := s.Upstreams[i].Buckets
	return b[len(b)-n:]
}

func TestRollover(t *testing.T) {
	tl, c := newRing("a")
	c.Add(10 * time.Second)
	tl.Request("a", "success", 10*time.Millisecond, 0)
	tl.Request("a", "transient", 30*time.Millisecond, 2)
	c.Add(time.Minute) // 14:01:10
	tl.Request("a", "success", 20*time.Millisecond, 1)
	tl.DeadLetter("a")

	s := tl.Snapshot()
	if len(s.Upstreams) != 1 || len(s.Upstreams[0].Buckets) != 60 {
		t.Fatalf("snapshot shape: %d upstreams, %d buckets", len(s.Upstreams), len(s.Upstreams[0].Buckets))
	}
	if want := t0.Add(-58 * time.Minute); !s.Start.Equal(want) {
		t.Fatalf("window starts %v, want %v", s.Start, want)
	}
	b := last(s, 0, 2)
	if !b[0].Start.Equal(t0) || !b[1].Start.Equal(t0.Add(time.Minute)) {
		t.Fatalf("bucket starts %v, %v", b[0].Start, b[1].Start)
	}
	if b[0].Requests != 2 || b[0].Count("success") != 1 || b[0].Count("transient") != 1 || b[0].Retries != 2 || b[0].DeadLetters != 0 {
		t.Fatalf("14:00 bucket: %+v", b[0])
	}
	if b[1].Requests != 1 || b[1].Count("success") != 1 || b[1].Retries != 1 || b[1].DeadLetters != 1 {
		t.Fatalf("14:01 bucket: %+v", b[1])
	}

	// 59 minutes on, 14:00 is the oldest bucket still shown; one more and
	// it has left the window.
	c.Add(58 * time.Minute) // 14:59:10
	if b := tl.Snapshot().Upstreams[0].Buckets[0]; !b.Start.Equal(t0) || b.Requests != 2 {
		t.Fatalf("oldest bucket at 14:59: %+v", b)
	}
	c.Add(time.Minute) // 15:00:10: its slot is 14:00's
	s = tl.Snapshot()
	if b := s.Upstreams[0].Buckets[0]; !b.Start.Equal(t0.Add(time.Minute)) || b.Requests != 1 {
		t.Fatalf("oldest bucket at 15:00: %+v", b)
	}
	// Writing into the reused slot clears what 14:00 left there.
	tl.Request("a", "canceled", time.Second, 0)
	b = last(tl.Snapshot(), 0, 1)
	if b[0].Requests != 1 || b[0].Count("canceled") != 1 || b[0].Retries != 0 || b[0].Count("transient") != 0 {
		t.Fatalf("15:00 bucket reusing 14:00's slot: %+v", b[0])
	}

	// Hours later, nothing old is shown.
	c.Add(5 * time.Hour)
	for _, b := range tl.Snapshot().Upstreams[0].Buckets {
		if b.Requests != 0 || b.DeadLetters != 0 || b.Retries != 0 {
			t.Fatalf("bucket %v after 5 quiet hours: %+v", b.Start, b)
		}
	}
}

func TestClockSteppedBack(t *testing.T) {
	tl, c := newRing("a")
	c.Add(2 * time.Hour)
	tl.Request("a", "success", time.Millisecond, 0)
	// Back within the window: the report lands in its own bucket.
	c.Add(-10 * time.Minute)
	tl.Request("a", "success", time.Millisecond, 0)
	// Back past the window: the cell it would use holds a newer bucket, so
	// the report is dropped rather than clearing that bucket.
	c.Add(-59 * time.Minute)
	tl.Request("a", "transient", time.Millisecond, 0)
	tl.DeadLetter("a")
	c.Add(69 * time.Minute)
	s := tl.Snapshot()
	got := map[time.Time]int{}
	for _, b := range s.Upstreams[0].Buckets {
		if b.Requests > 0 || b.DeadLetters > 0 {
			got[b.Start] = b.Requests + 100*b.DeadLetters
		}
	}
	want := map[time.Time]int{t0.Add(2 * time.Hour): 1, t0.Add(110 * time.Minute): 1}
	if len(got) != len(want) || got[t0.Add(2*time.Hour)] != 1 || got[t0.Add(110*time.Minute)] != 1 {
		t.Fatalf("buckets with reports: %v, want %v", got, want)
	}
}

func TestClassesAndUpstreamsBounded(t *testing.T) {
	tl, _ := newRing("a", "b", "a")
	tl.Request("a", "no such class", time.Millisecond, 0)
	tl.Request("a", "", time.Millisecond, 0)
	tl.Request("nobody", "success", time.Millisecond, 0)
	tl.DeadLetter("nobody")
	tl.BreakerState("nobody", breaker.Open)
	s := tl.Snapshot()
	if names := []string{s.Upstreams[0].Name, s.Upstreams[1].Name}; len(s.Upstreams) != 2 || !slices.Equal(names, []string{"a", "b"}) {
		t.Fatalf("upstreams %v", s.Upstreams)
	}
	if b := last(s, 0, 1)[0]; b.Requests != 2 || b.Count(Other) != 2 {
		t.Fatalf("unknown classes: %+v", b)
	}
	cls := Classes()
	if len(cls) != numClasses || cls[len(cls)-1] != Other || cls[0] != "success" {
		t.Fatalf("Classes() = %v", cls)
	}
	cls[0] = "changed"
	if Classes()[0] != "success" {
		t.Fatal("Classes() returns the package's own array")
	}
	// The gateway's own classes are counted as themselves, not as other.
	for _, c := range []string{"replayed", "breaker_open", "budget_exceeded", "idempotency_mismatch"} {
		tl.Request("b", c, time.Millisecond, 0)
	}
	b := last(tl.Snapshot(), 1, 1)[0]
	if b.Requests != 4 || b.Count(Other) != 0 || b.Count("replayed") != 1 || b.Count("breaker_open") != 1 {
		t.Fatalf("the gateway's classes: %+v", b)
	}
}

func TestMemoryBound(t *testing.T) {
	if got := unsafe.Sizeof(cell{}); got != 904 {
		t.Errorf("a cell is %d bytes; the package doc says 904", got)
	}
	if got := unsafe.Sizeof(storeCell{}); got != 64 {
		t.Errorf("a store cell is %d bytes; the package doc says 64", got)
	}
	tl := New(Options{Upstreams: []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}})
	if got := tl.MemoryBytes(); got != 60*10*904+60*64 {
		t.Errorf("MemoryBytes = %d for 60 buckets × 10 upstreams", got)
	}
	if got := tl.MemoryBytes(); got > 600<<10 {
		t.Errorf("MemoryBytes = %d, over the 0.5 MiB the doc promises for 10 upstreams", got)
	}
	// Whatever is reported, nothing grows: the cells are all there is.
	c := &clock{t: t0}
	tl = New(Options{Upstreams: []string{"a"}, Now: c.Now, Buckets: 5, Width: time.Second})
	for i := range 10000 {
		c.Add(time.Duration(i%3) * 700 * time.Millisecond)
		tl.Request("a", "success", time.Duration(i)*time.Millisecond, i%4)
		tl.BreakerState("a", []breaker.State{breaker.Closed, breaker.Open, breaker.HalfOpen}[i%3])
	}
	if n := len(tl.ups["a"].cells); n != 5 {
		t.Fatalf("%d cells after 10000 reports, want 5", n)
	}
	if s := tl.Snapshot(); len(s.Upstreams[0].Buckets) != 5 || len(s.Store) != 5 || s.Width != time.Second {
		t.Fatalf("snapshot: %d buckets, %d store, width %v", len(s.Upstreams[0].Buckets), len(s.Store), s.Width)
	}
}

// errorBound is MaxRelativeError plus the rounding of a representative to
// whole nanoseconds: 0.5 ns in 64 µs at the bottom of the scale.
var errorBound = MaxRelativeError + 1e-5

// exactQuantile is the nearest-rank q-quantile of sorted.
func exactQuantile(sorted []time.Duration, q float64) time.Duration {
	r := int(math.Ceil(q * float64(len(sorted))))
	return sorted[max(r, 1)-1]
}

func TestPercentiles(t *testing.T) {
	if MaxRelativeError > 0.044 {
		t.Fatalf("MaxRelativeError = %v; the doc promises < 4.4%%", MaxRelativeError)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	dists := map[string]func() time.Duration{
		// Log-uniform over 100 µs .. 10 min: every bucket of the scale.
		"log-uniform": func() time.Duration {
			return time.Duration(float64(100*time.Microsecond) * math.Pow(6e6, rng.Float64()))
		},
		// Fast JSON answers with a slow tail of streams and retries.
		"bimodal": func() time.Duration {
			if rng.IntN(100) < 3 {
				return time.Duration(2e9 + rng.Int64N(40e9))
			}
			return time.Duration(3e5 + rng.Int64N(2e6))
		},
		"constant": func() time.Duration { return 1234 * time.Millisecond },
	}
	for name, gen := range dists {
		for _, n := range []int{1, 2, 7, 100, 5000} {
			var h histogram
			var xs []time.Duration
			for range n {
				d := gen()
				h.add(d)
				xs = append(xs, d)
			}
			slices.Sort(xs)
			for _, q := range []float64{0.01, 0.5, 0.9, 0.99, 1} {
				got, want := h.quantile(q), exactQuantile(xs, q)
				if rel := math.Abs(float64(got-want)) / float64(want); rel > errorBound {
					t.Errorf("%s n=%d q=%v: %v, exact %v: off by %.2f%%", name, n, q, got, want, 100*rel)
				}
			}
		}
	}
}

func TestPercentileEdges(t *testing.T) {
	var h histogram
	if h.quantile(0.5) != 0 {
		t.Fatal("an empty histogram's p50 is not 0")
	}
	h.add(0)
	h.add(10 * time.Microsecond)
	if got := h.quantile(1); got != histMin {
		t.Fatalf("below the scale reads %v, want %v (an upper bound)", got, histMin)
	}
	h.add(time.Hour)
	if got := h.quantile(1); got != histMax {
		t.Fatalf("past the scale reads %v, want %v (a lower bound)", got, histMax)
	}
	// Each bucket's edges are within the bound of its representative.
	for i := 1; i < histBuckets-1; i++ {
		lo := float64(histMin) * math.Exp2(float64(i-1)/histSub)
		hi := lo * gamma
		v := float64(histValue(i))
		if (v-lo)/lo > errorBound || (hi-v)/hi > errorBound {
			t.Fatalf("bucket %d [%v, %v) reads %v", i, time.Duration(lo), time.Duration(hi), time.Duration(v))
		}
		if got := histIndex(time.Duration(math.Ceil(lo))); got != i {
			t.Fatalf("%v (bucket %d's lower edge) lands in %d", time.Duration(lo), i, got)
		}
	}
	// Through the ring: p50 and p99 of a bucket.
	tl, _ := newRing("a")
	for i := 1; i <= 100; i++ {
		tl.Request("a", "success", time.Duration(i)*time.Millisecond, 0)
	}
	b := last(tl.Snapshot(), 0, 1)[0]
	for _, c := range []struct {
		got, want time.Duration
	}{{b.P50, 50 * time.Millisecond}, {b.P99, 99 * time.Millisecond}} {
		if rel := math.Abs(float64(c.got-c.want)) / float64(c.want); rel > errorBound {
			t.Errorf("percentile %v, want %v ± %.1f%%", c.got, c.want, 100*MaxRelativeError)
		}
	}
}

func TestBreakerTimeInState(t *testing.T) {
	tl, c := newRing("a")
	c.Add(30 * time.Second) // 14:00:30
	tl.BreakerState("a", breaker.Open)
	c.Add(40 * time.Second) // 14:01:10
	tl.BreakerState("a", breaker.HalfOpen)
	c.Add(10 * time.Second) // 14:01:20
	tl.BreakerState("a", breaker.Closed)
	c.Add(65 * time.Second) // 14:02:25
	tl.BreakerState("a", breaker.Open)
	c.Add(5 * time.Second) // 14:02:30
	s := tl.Snapshot()
	if s.Upstreams[0].State != breaker.Open {
		t.Fatalf("state now %s", s.Upstreams[0].State)
	}
	type spent struct{ closed, half, open time.Duration }
	want := []spent{
		{30 * time.Second, 0, 30 * time.Second},
		{40 * time.Second, 10 * time.Second, 10 * time.Second},
		{25 * time.Second, 0, 5 * time.Second}, // up to now
	}
	for i, b := range last(s, 0, 3) {
		if got := (spent{b.Closed, b.HalfOpen, b.Open}); got != want[i] {
			t.Errorf("bucket %v: closed %v, half-open %v, open %v; want %+v", b.Start, b.Closed, b.HalfOpen, b.Open, want[i])
		}
	}
	// A snapshot accrues without double counting.
	if b := last(tl.Snapshot(), 0, 1)[0]; b.Open != 5*time.Second {
		t.Fatalf("second snapshot: open %v, want 5s", b.Open)
	}
	// Open for three hours: every bucket of the window is open throughout
	// (the one in progress up to now), and the accrual touches only the
	// window.
	c.Add(3 * time.Hour)
	s = tl.Snapshot()
	for i, b := range s.Upstreams[0].Buckets {
		want := time.Minute
		if i == len(s.Upstreams[0].Buckets)-1 {
			want = 30 * time.Second
		}
		if b.Open != want || b.Closed != 0 || b.HalfOpen != 0 {
			t.Fatalf("bucket %v after 3 h open: closed %v, half-open %v, open %v", b.Start, b.Closed, b.HalfOpen, b.Open)
		}
	}
}

func TestStoreSamples(t *testing.T) {
	tl, c := newRing()
	tl.StoreSize(cache.Stats{Records: 1})
	tl.StoreSize(cache.Stats{Records: 2})
	c.Add(2 * time.Minute)
	tl.StoreSize(cache.Stats{Records: 5, LSMBytes: 100})
	s := tl.Snapshot()
	st := s.Store[len(s.Store)-3:]
	if !st[0].Sampled || st[0].Stats.Records != 2 || st[1].Sampled || !st[2].Sampled || st[2].Stats.LSMBytes != 100 {
		t.Fatalf("store samples: %+v", st)
	}
	if len(s.Upstreams) != 0 {
		t.Fatalf("upstreams %v", s.Upstreams)
	}
}

// TestParallel is for -race: reports and snapshots from many goroutines.
func TestParallel(t *testing.T) {
	tl, c := newRing("a", "b")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				up := []string{"a", "b"}[(g+i)%2]
				tl.Request(up, "success", time.Duration(i)*time.Microsecond, i%2)
				switch i % 100 {
				case 0:
					tl.BreakerState(up, breaker.Open)
				case 50:
					tl.BreakerState(up, breaker.Closed)
				case 7:
					tl.DeadLetter(up)
				case 9:
					tl.StoreSize(cache.Stats{Records: int64(i)})
				case 11:
					c.Add(time.Second)
				case 13:
					tl.Snapshot()
				}
			}
		})
	}
	wg.Wait()
	total := 0
	for _, u := range tl.Snapshot().Upstreams {
		for _, b := range u.Buckets {
			total += b.Requests
		}
	}
	if total != 8*2000 {
		t.Fatalf("%d requests counted, want %d", total, 8*2000)
	}
}

// BenchmarkRequest is what the ring adds to every /v1 request's log line.
func BenchmarkRequest(b *testing.B) {
	tl := New(Options{Upstreams: []string{"a", "b"}})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			tl.Request("a", "success", time.Duration(i%5000)*time.Microsecond, i%2)
			i++
		}
	})
}

// BenchmarkSnapshot is what the page pays per render, per upstream.
func BenchmarkSnapshot(b *testing.B) {
	c := &clock{t: t0}
	tl := New(Options{Upstreams: []string{"a"}, Now: c.Now})
	for range 60 {
		for i := range 100 {
			tl.Request("a", "success", time.Duration(i)*time.Millisecond, 0)
		}
		c.Add(time.Minute)
	}
	b.ReportAllocs()
	for b.Loop() {
		tl.Snapshot()
	}
}
