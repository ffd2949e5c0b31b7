package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// goMetrics are the Go runtime's figures the gateway serves on /metrics
// (prometheus' Go collector with the GC and CPU-class runtime metrics).
type goMetrics struct {
	HeapGoal   float64 // go_gc_heap_goal_bytes: the heap size the next GC aims at
	HeapAlloc  float64 // go_memstats_heap_alloc_bytes
	MemLimit   float64 // go_gc_gomemlimit_bytes: the runtime's soft limit
	Sys        float64 // go_memstats_sys_bytes: everything the runtime mapped
	GCCycles   float64 // go_gc_cycles_total_gc_cycles_total
	GCCPU      float64 // go_cpu_classes_gc_total_cpu_seconds_total
	TotalCPU   float64 // go_cpu_classes_total_cpu_seconds_total (GOMAXPROCS × wall)
	Goroutines float64 // go_goroutines
}

// scrapeGo reads the gateway's /metrics with the admin token.
func scrapeGo(ctx context.Context, c *http.Client, url, token string) (goMetrics, error) {
	var m goMetrics
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return m, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := c.Do(req)
	if err != nil {
		return m, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return m, fmt.Errorf("GET /metrics: status %d", res.StatusCode)
	}
	fields := map[string]*float64{
		"go_gc_heap_goal_bytes": &m.HeapGoal, "go_memstats_heap_alloc_bytes": &m.HeapAlloc,
		"go_gc_gomemlimit_bytes": &m.MemLimit, "go_memstats_sys_bytes": &m.Sys,
		"go_gc_cycles_total_gc_cycles_total": &m.GCCycles, "go_goroutines": &m.Goroutines,
		"go_cpu_classes_gc_total_cpu_seconds_total": &m.GCCPU, "go_cpu_classes_total_cpu_seconds_total": &m.TotalCPU,
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if p := fields[name]; ok && p != nil {
			*p, _ = strconv.ParseFloat(strings.TrimSpace(val), 64)
		}
	}
	return m, sc.Err()
}

// GCUsage is the gateway's Go runtime during one leg.
type GCUsage struct {
	Cycles int `json:"gc_cycles"`
	// CPUFraction is the share of the process's available CPU time
	// (GOMAXPROCS × wall) that GC took, as the runtime estimates it.
	CPUFraction     float64 `json:"gc_cpu_fraction"`
	HeapGoalMaxMiB  float64 `json:"heap_goal_max_mib"` // sampled every second
	HeapAllocMaxMiB float64 `json:"heap_alloc_max_mib"`
	MemLimitMiB     float64 `json:"gomemlimit_mib"` // 0: none
}

// gcWatch samples a gateway's /metrics every second.
type gcWatch struct {
	first, last goMetrics
	goalMax     float64
	allocMax    float64
	ok          bool
	cancel      context.CancelFunc
	done        chan struct{}
}

// startGC starts sampling c's /metrics, or returns nil for a process
// that serves none.
func startGC(c *child) *gcWatch {
	if c.metricsURL == "" {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &gcWatch{cancel: cancel, done: make(chan struct{})}
	hc := &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second}
	first, err := scrapeGo(ctx, hc, c.metricsURL, c.adminToken)
	g.first, g.last, g.ok = first, first, err == nil
	g.goalMax, g.allocMax = first.HeapGoal, first.HeapAlloc
	go func() {
		defer close(g.done)
		defer hc.CloseIdleConnections()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			m, err := scrapeGo(context.Background(), hc, c.metricsURL, c.adminToken)
			if err != nil {
				continue
			}
			g.last, g.goalMax, g.allocMax = m, max(g.goalMax, m.HeapGoal), max(g.allocMax, m.HeapAlloc)
		}
	}()
	return g
}

func (g *gcWatch) stop() *GCUsage {
	if g == nil {
		return nil
	}
	g.cancel()
	<-g.done
	if !g.ok {
		return nil
	}
	u := &GCUsage{
		Cycles:          int(g.last.GCCycles - g.first.GCCycles),
		HeapGoalMaxMiB:  g.goalMax / (1 << 20),
		HeapAllocMaxMiB: g.allocMax / (1 << 20),
		MemLimitMiB:     g.last.MemLimit / (1 << 20),
	}
	if d := g.last.TotalCPU - g.first.TotalCPU; d > 0 {
		u.CPUFraction = (g.last.GCCPU - g.first.GCCPU) / d
	}
	if u.MemLimitMiB >= 1<<40 { // math.MaxInt64: no limit
		u.MemLimitMiB = 0
	}
	return u
}

// DirSize is a directory's size: the bytes its files say they hold, and
// the bytes the filesystem allocated (Badger's files are sparse).
type DirSize struct {
	Files        int     `json:"files"`
	ApparentMiB  float64 `json:"apparent_mib"`
	AllocatedMiB float64 `json:"allocated_mib"`
}

func dirSize(dir string) DirSize {
	var d DirSize
	var apparent, blocks int64
	_ = filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return nil
		}
		fi, err := e.Info()
		if err != nil {
			return nil
		}
		d.Files++
		apparent += fi.Size()
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			blocks += st.Blocks
		}
		return nil
	})
	d.ApparentMiB = float64(apparent) / (1 << 20)
	d.AllocatedMiB = float64(blocks*512) / (1 << 20)
	return d
}

// TimePoint is one sample of the gateway's memory over a sustained run.
type TimePoint struct {
	Seconds     float64 `json:"t_s"`
	Leg         string  `json:"leg"`
	RSSMiB      float64 `json:"rss_mib"`
	AnonMiB     float64 `json:"anon_mib"`
	FileMiB     float64 `json:"file_mib"`
	CgroupMiB   float64 `json:"cgroup_usage_mib,omitempty"` // memory.current of the gateway's cgroup
	HeapGoalMiB float64 `json:"heap_goal_mib,omitempty"`
}

// timeline samples the gateway's RSS (and its cgroup's usage, and heap
// goal) every `every` until stop.
type timeline struct {
	mu     sync.Mutex
	points []TimePoint
	leg    string
	cancel context.CancelFunc
	done   chan struct{}
}

func startTimeline(gw *child, cg func() float64, start time.Time, every time.Duration) *timeline {
	ctx, cancel := context.WithCancel(context.Background())
	tl := &timeline{cancel: cancel, done: make(chan struct{})}
	hc := &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second}
	go func() {
		defer close(tl.done)
		defer hc.CloseIdleConnections()
		t := time.NewTicker(every)
		defer t.Stop()
		for ctx.Err() == nil {
			st, err := readProc(gw.pid())
			if err == nil {
				p := TimePoint{Seconds: time.Since(start).Seconds(), RSSMiB: mib(st.RSSKiB), AnonMiB: mib(st.AnonKiB), FileMiB: mib(st.FileKiB)}
				if cg != nil {
					p.CgroupMiB = cg()
				}
				if m, err := scrapeGo(ctx, hc, gw.metricsURL, gw.adminToken); err == nil {
					p.HeapGoalMiB = m.HeapGoal / (1 << 20)
				}
				tl.mu.Lock()
				p.Leg = tl.leg
				tl.points = append(tl.points, p)
				tl.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-t.C:
			}
		}
	}()
	return tl
}

func (tl *timeline) setLeg(name string) {
	tl.mu.Lock()
	tl.leg = name
	tl.mu.Unlock()
}

func (tl *timeline) stop() []TimePoint {
	tl.cancel()
	<-tl.done
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return tl.points
}

// profile fetches one of the gateway's Go profiles over a leg, from
// /admin/debug/pprof/ with the admin token, into a file.
type profile struct{ done chan struct{} }

// startProfile asks for -pprof's kind (profile: CPU; trace: execution
// trace) for d, written to out/<leg>.<kind>; nil when -pprof is off or c
// is not the gateway.
func startProfile(s settings, c *child, leg string, d time.Duration) *profile {
	if s.Pprof == "" || c == nil || c.metricsURL == "" {
		return nil
	}
	p := &profile{done: make(chan struct{})}
	secs := max(1, int(d.Seconds()))
	url := fmt.Sprintf("%s/admin/debug/pprof/%s?seconds=%d", c.URL, s.Pprof, secs)
	name := filepath.Join(s.Out, strings.NewReplacer(" ", "_", "=", "", "/", "_").Replace(leg)+"."+s.Pprof)
	go func() {
		defer close(p.done)
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			return
		}
		req.Header.Set("Authorization", "Bearer "+c.adminToken)
		hc := &http.Client{Timeout: d + time.Minute}
		res, err := hc.Do(req)
		if err != nil {
			return
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err == nil && res.StatusCode == http.StatusOK {
			_ = os.MkdirAll(s.Out, 0o755)
			_ = os.WriteFile(name, b, 0o644)
		}
	}()
	return p
}

func (p *profile) wait() {
	if p != nil {
		<-p.done
	}
}
