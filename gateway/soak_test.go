package gateway

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// TestSoak runs mixed traffic — JSON and streams, keyed and unkeyed,
// replays, upstream failures, client cancellations — for LLMGATE_SOAK
// (default 3s; CI sets a bounded longer run), then checks that goroutines
// and heap return to their baseline. Skipped with -short.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak test skipped with -short")
	}
	d := 3 * time.Second
	if v := os.Getenv("LLMGATE_SOAK"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("LLMGATE_SOAK: %v", err)
		}
	}
	h := newHarnessStore(t, func(c *config.Config) {
		c.Breaker.ConsecutiveFailures = 1000 // failures are part of the mix, not a reason to stop it
	}, nil, fakeprovider.Options{KeepRequests: -1}) // the fake keeps no request: its memory is not the gateway's

	h.fake.SetDefault(fakeprovider.Step{})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: requestLimit}
	defer client.CloseIdleConnections()

	send := func(body string, hdr map[string]string) int {
		req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(body))
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		res, err := client.Do(req)
		if err != nil {
			return 0
		}
		defer res.Body.Close()
		_, _ = io.Copy(io.Discard, res.Body)
		return res.StatusCode
	}
	// Warm up, then take the baseline.
	send(chatBody, nil)
	send(streamBody, nil)
	client.CloseIdleConnections()
	h.gw.router.Close()
	runtime.GC()
	baseG := runtime.NumGoroutine()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	baseHeap := ms.HeapInuse

	var requests, failures atomic.Int64
	// phase runs mixed traffic for d/2, then lets connections wind down
	// and reports goroutines and heap in use after a GC.
	phase := func(seed uint64) (int, uint64) {
		stop := time.Now().Add(d / 2)
		var wg sync.WaitGroup
		for w := 0; w < 16; w++ {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(seed+uint64(w), 7))
				for i := 0; time.Now().Before(stop); i++ {
					body := chatBody
					if rng.IntN(2) == 0 {
						body = streamBody
					}
					hdr := map[string]string{}
					switch rng.IntN(4) {
					case 0: // fresh key
						hdr["Idempotency-Key"] = fmt.Sprintf("soak-%d-%d-%d", seed, w, i)
					case 1: // a replay of a small set of keys
						hdr["Idempotency-Key"] = fmt.Sprintf("soak-replay-%d", rng.IntN(8))
						body = chatBody
					}
					if rng.IntN(10) == 0 {
						h.fake.Enqueue(fakeprovider.Step{Status: 503}) // a failure somewhere in the mix
					}
					if st := send(body, hdr); st != 200 {
						failures.Add(1)
					}
					requests.Add(1)
				}
			})
		}
		wg.Wait()
		client.CloseIdleConnections()
		h.srv.CloseClientConnections()
		// Idle pooled connections to the upstream are a pool, not a leak:
		// close them so what remains is what would grow without bound.
		h.gw.router.Close()
		deadline := time.Now().Add(10 * time.Second)
		var g int
		for {
			runtime.GC()
			g = runtime.NumGoroutine()
			if g <= baseG+2 || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond) // waiting for connections to wind down, not synchronising
		}
		// Badger compacts in the background, and a compaction holds table
		// builders of tens of MiB while it runs (seen in heap profiles:
		// ristretto z.Calloc under levelsController.subcompact). That is
		// not the gateway's growth: take the lowest heap seen while the
		// store settles, up to 5 s.
		low := uint64(math.MaxUint64)
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
			runtime.GC()
			runtime.ReadMemStats(&ms)
			low = min(low, ms.HeapInuse)
		}
		return g, low
	}
	g1, heap1 := phase(1)
	g2, heap2 := phase(2)
	t.Logf("soak %v: %d requests, %d non-200 (scripted failures); goroutines %d → %d → %d; heap in use %d → %d → %d KiB",
		d, requests.Load(), failures.Load(), baseG, g1, g2, baseHeap>>10, heap1>>10, heap2>>10)
	for _, g := range []int{g1, g2} {
		if g > baseG+2 {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("goroutines grew from %d to %d:\n%s", baseG, g, buf[:n])
		}
	}
	// The store's buffers (memtables, table builders) make the first phase
	// grow the heap; a leak keeps growing it in the second, as much traffic
	// later.
	if heap2 > heap1+heap1/2+16<<20 {
		t.Fatalf("heap kept growing: %d KiB after the first half, %d KiB after the second", heap1>>10, heap2>>10)
	}
	if requests.Load() == 0 || failures.Load() > requests.Load()/2 {
		t.Fatalf("soak did not run as intended: %d requests, %d failures", requests.Load(), failures.Load())
	}
}
