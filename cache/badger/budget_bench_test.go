package badgerstore

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
)

// BenchmarkBurst4K is the store's share of issue 15's sustained keyed load:
// 16 clients commit 60,000 records of 4 KiB under random keys. It reports
// the throughput (records/s), the CPU spent per record (user+system, all
// of Badger's goroutines included), the peak of the heap in use while the
// burst ran (sampled every 5 ms through runtime/metrics, which does not
// stop the world) and the heap in use just after it, after a GC.
//
//	go test -run '^$' -bench Burst4K -benchtime 1x -count 3 ./cache/badger
//
// LLMGATE_BENCH_BUDGET (bytes) sets Options.MemoryBudget.
func BenchmarkBurst4K(b *testing.B) {
	const clients, records = 16, 60_000
	rec := storetest.JSONRecord()
	rec.Body = incompressible(4 << 10)
	for b.Loop() {
		s, err := Open(benchOptions(b))
		if err != nil {
			b.Fatal(err)
		}
		stop, peak := sampleHeap()
		cpu0, t0 := cpuTime(), time.Now()
		var wg sync.WaitGroup
		for range clients {
			wg.Go(func() {
				var id [12]byte
				for range records / clients {
					rand.Read(id[:])
					k := cache.Key{Endpoint: chatEP, ID: hex.EncodeToString(id[:])}
					c, err := s.Claim(ctx, k, "fp", lease)
					if err != nil {
						b.Error(err)
						return
					}
					if err := s.Commit(ctx, k, c.Owner, rec, ttl); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		elapsed, cpu := time.Since(t0), cpuTime()-cpu0
		stop()
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		writeHeapProfile(b)
		b.ReportMetric(records/elapsed.Seconds(), "records/s")
		b.ReportMetric(float64(cpu.Microseconds())/records, "cpu-µs/record")
		b.ReportMetric(float64(*peak)/(1<<20), "peak-heap-MiB")
		b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// sampleHeap samples the heap in use (objects + unused spans' fragments:
// runtime/metrics' heap classes other than released and free) every 5 ms
// until stop, keeping the peak.
func sampleHeap() (stop func(), peak *uint64) {
	peak = new(uint64)
	done, finished := make(chan struct{}), make(chan struct{})
	samples := []metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
	}
	go func() {
		defer close(finished)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(samples)
			if v := samples[0].Value.Uint64() + samples[1].Value.Uint64(); v > *peak {
				*peak = v
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(done); <-finished }, peak
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchOptions(b *testing.B) Options {
	o := Options{Dir: b.TempDir()}
	if v := os.Getenv("LLMGATE_BENCH_BUDGET"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			b.Fatalf("LLMGATE_BENCH_BUDGET: %v", err)
		}
		o.MemoryBudget = n
	}
	return o
}

// writeHeapProfile writes the heap profile to LLMGATE_BENCH_HEAPPROFILE, if
// set: what holds the heap just after the burst.
func writeHeapProfile(b *testing.B) {
	path := os.Getenv("LLMGATE_BENCH_HEAPPROFILE")
	if path == "" {
		return
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		b.Fatal(err)
	}
}
