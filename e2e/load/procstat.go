package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat.
// Linux fixes it at 100 for user space on every architecture Go supports.
const clockTicks = 100

// sampleEvery is how often a leg samples its processes' memory.
const sampleEvery = 50 * time.Millisecond

// procStatus is what /proc/PID/status and /proc/PID/stat say about a
// process at one moment.
type procStatus struct {
	RSSKiB  int64
	HWMKiB  int64
	AnonKiB int64 // RssAnon: heap, stacks
	FileKiB int64 // RssFile: mapped files (Badger maps its tables and memtables)
	ShmKiB  int64 // RssShmem: shared memory (tmpfs, shm)
	Threads int
	CPU     time.Duration // user + system
}

func readProc(pid int) (procStatus, error) {
	var st procStatus
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return st, err
	}
	for line := range bytes.Lines(b) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		f := bytes.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil {
			continue
		}
		switch string(k) {
		case "VmRSS":
			st.RSSKiB = n
		case "VmHWM":
			st.HWMKiB = n
		case "RssAnon":
			st.AnonKiB = n
		case "RssFile":
			st.FileKiB = n
		case "RssShmem":
			st.ShmKiB = n
		case "Threads":
			st.Threads = int(n)
		}
	}
	b, err = os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return st, err
	}
	// The command name may hold spaces and parentheses; the fields after
	// the last ')' start with field 3 (state), so utime (14) and stime (15)
	// are at 11 and 12.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return st, errors.New("unparseable /proc/PID/stat")
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 13 {
		return st, errors.New("short /proc/PID/stat")
	}
	ut, err1 := strconv.ParseInt(string(f[11]), 10, 64)
	stt, err2 := strconv.ParseInt(string(f[12]), 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return st, err
	}
	st.CPU = time.Duration(ut+stt) * time.Second / clockTicks
	return st, nil
}

// resetPeak resets the process's VmHWM to its current RSS (Linux ≥ 4.0),
// so the peak read at the end of a leg is the leg's own.
func resetPeak(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}

// ProcUsage is what one process used during a leg.
type ProcUsage struct {
	Process      string  `json:"process"`
	RSSBeforeMiB float64 `json:"rss_before_mib"`
	RSSAfterMiB  float64 `json:"rss_after_mib"`
	PeakRSSMiB   float64 `json:"peak_rss_mib"`
	PeakFrom     string  `json:"peak_from"`      // "VmHWM" (reset at the leg's start) or "samples" (every 50ms)
	PeakAnonMiB  float64 `json:"peak_anon_mib"`  // RssAnon, sampled every 50ms
	PeakFileMiB  float64 `json:"peak_file_mib"`  // RssFile, sampled every 50ms
	AnonAfterMiB float64 `json:"anon_after_mib"` // RssAnon at the end
	FileAfterMiB float64 `json:"file_after_mib"` // RssFile at the end
	ShmAfterMiB  float64 `json:"shmem_after_mib"`
	// GC is the gateway's Go runtime during the leg, from its /metrics
	// (nil for the floor, which serves none).
	GC            *GCUsage `json:"gc,omitempty"`
	CPUSeconds    float64  `json:"cpu_seconds"`
	ThreadsBefore int      `json:"threads_before"`
	ThreadsAfter  int      `json:"threads_after"`
	ThreadsPeak   int      `json:"threads_peak"`
}

// watch samples one process every 50ms from start until stop.
type watch struct {
	c      *child
	before procStatus
	hwmOK  bool

	mu       sync.Mutex
	peakRSS  int64
	peakAnon int64
	peakFile int64
	peakThr  int
	gc       *gcWatch
	done     chan struct{}
	finished chan struct{}
}

func startWatch(c *child) *watch {
	w := &watch{c: c, done: make(chan struct{}), finished: make(chan struct{})}
	w.hwmOK = resetPeak(c.pid()) == nil
	w.before, _ = readProc(c.pid())
	w.peakRSS, w.peakAnon, w.peakFile, w.peakThr = w.before.RSSKiB, w.before.AnonKiB, w.before.FileKiB, w.before.Threads
	w.gc = startGC(c)
	go func() {
		defer close(w.finished)
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		// Bounded: a day of samples.
		for range 24 * time.Hour / sampleEvery {
			select {
			case <-w.done:
				return
			case <-t.C:
			}
			st, err := readProc(c.pid())
			if err != nil {
				continue
			}
			w.mu.Lock()
			w.peakRSS = max(w.peakRSS, st.RSSKiB)
			w.peakAnon = max(w.peakAnon, st.AnonKiB)
			w.peakFile = max(w.peakFile, st.FileKiB)
			w.peakThr = max(w.peakThr, st.Threads)
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *watch) stop() *ProcUsage {
	close(w.done)
	<-w.finished
	after, err := readProc(w.c.pid())
	if err != nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	peak, from := max(w.peakRSS, after.RSSKiB), "samples"
	if w.hwmOK && after.HWMKiB > 0 {
		peak, from = max(peak, after.HWMKiB), "VmHWM"
	}
	return &ProcUsage{
		Process:       w.c.name,
		RSSBeforeMiB:  mib(w.before.RSSKiB),
		RSSAfterMiB:   mib(after.RSSKiB),
		PeakRSSMiB:    mib(peak),
		PeakFrom:      from,
		PeakAnonMiB:   mib(max(w.peakAnon, after.AnonKiB)),
		PeakFileMiB:   mib(max(w.peakFile, after.FileKiB)),
		AnonAfterMiB:  mib(after.AnonKiB),
		FileAfterMiB:  mib(after.FileKiB),
		ShmAfterMiB:   mib(after.ShmKiB),
		GC:            w.gc.stop(),
		CPUSeconds:    (after.CPU - w.before.CPU).Seconds(),
		ThreadsBefore: w.before.Threads,
		ThreadsAfter:  after.Threads,
		ThreadsPeak:   max(w.peakThr, after.Threads),
	}
}

func mib(kib int64) float64 { return float64(kib) / 1024 }

// machineCPU is the CPU time all processes have spent in user and system
// mode since boot, from /proc/stat.
func machineCPU() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 4 || string(f[0]) != "cpu" {
		return 0, errors.New("unparseable /proc/stat")
	}
	var ticks int64
	for _, v := range f[1:4] { // user, nice, system
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// foreign measures the CPU time other processes on the machine (other
// than this tool and its children) take during a leg: a leg measured while
// something else competes for the CPUs is not a clean measurement, and the
// report says so.
type foreign struct {
	pids            []int
	machine0, ours0 time.Duration
	ok              bool
}

func ourCPU(pids []int) (time.Duration, error) {
	var sum time.Duration
	for _, pid := range pids {
		st, err := readProc(pid)
		if err != nil {
			return 0, err
		}
		sum += st.CPU
	}
	return sum, nil
}

func startForeign(pids []int) *foreign {
	f := &foreign{pids: pids}
	var err1, err2 error
	f.machine0, err1 = machineCPU()
	f.ours0, err2 = ourCPU(pids)
	f.ok = err1 == nil && err2 == nil
	return f
}

// stop returns the other processes' CPU seconds since start, or -1 if
// they could not be read.
func (f *foreign) stop() float64 {
	m, err1 := machineCPU()
	o, err2 := ourCPU(f.pids)
	if !f.ok || err1 != nil || err2 != nil {
		return -1
	}
	return max(0, ((m - f.machine0) - (o - f.ours0)).Seconds())
}

// loadAvg is the first field of /proc/loadavg, or "?".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := bytes.Fields(b); len(f) > 0 {
		return string(f[0])
	}
	return "?"
}
