package badgerstore

import (
	"bytes"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
)

// BenchmarkKeyedParallel is the store's share of keyed requests from 16
// concurrent clients, each with a new key and a 4 KiB record (Claim, then
// Commit), as e2e/load's keyed leg drives it; it reports the p99 of one
// Claim+Commit beside the mean.
func BenchmarkKeyedParallel(b *testing.B) {
	s, err := Open(Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	rec := storetest.JSONRecord()
	rec.Body = bytes.Repeat([]byte("x"), 4096)
	var seq atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	b.ReportAllocs()
	b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0))) // 16 clients
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
	if len(lat) > 0 {
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	}
}
