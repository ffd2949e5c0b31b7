package badgerstore

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
)

// BenchmarkKeyedParallel is the store's share of keyed requests from 16
// concurrent clients, each with a new key and a 4 KiB record (Claim, then
// Commit), as e2e/load's keyed leg drives it; it reports the p99 and
// p99.9 of one Claim+Commit beside the mean, and the process's CPU time
// per op (Badger's goroutines and the kernel's work for them included).
// With writeback off (the default), the value log's rotations (one per
// 16 MiB: run 20000x or more to see several) make the p99.9.
func BenchmarkKeyedParallel(b *testing.B) {
	for _, wb := range []struct {
		name  string
		every time.Duration
	}{{"writeback=off", 0}, {"writeback=100ms", 100 * time.Millisecond}, {"writeback=20ms", 20 * time.Millisecond}} {
		b.Run(wb.name, func(b *testing.B) { benchKeyedParallel(b, wb.every) })
	}
}

func benchKeyedParallel(b *testing.B, writeback time.Duration) {
	s, err := Open(Options{Dir: b.TempDir(), WritebackInterval: writeback})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	rec := storetest.JSONRecord()
	rec.Body = incompressible(4096)
	var seq atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	b.ReportAllocs()
	b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0))) // 16 clients
	cpu0 := processCPU()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			k := cache.Key{Endpoint: chatEP, ID: fmt.Sprintf("bench-%d", seq.Add(1))}
			start := time.Now()
			c, err := s.Claim(ctx, k, "fp", lease)
			if err != nil || c.Status != cache.Claimed {
				b.Error(c.Status, err)
				return
			}
			if err := s.Commit(ctx, k, c.Owner, rec, ttl); err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, time.Since(start))
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	b.ReportMetric(float64(b.N)/float64(max(1, s.commits.flushes.Load())), "commits/txn")
	if len(lat) > 0 {
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		b.ReportMetric(float64(lat[len(lat)*999/1000].Microseconds()), "p99.9-µs")
	}
}

// processCPU is the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
