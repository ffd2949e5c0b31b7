package gateway

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/simupstream"
)

// TestAdmissionBoundsBodiesInFlight (issue 15): a burst of 16 requests
// with 1 MiB bodies under limits.max_inflight_bytes of 3.5 MiB. Three are
// read and forwarded (the upstream holds them); the other thirteen wait
// without their bodies being read, and get 503 gateway_overloaded with
// Retry-After when their wait (an injected timer) runs out; the three
// then answer 200. The bytes reserved never pass the bound, and the heap
// grows by about the three bodies, not sixteen.
func TestAdmissionBoundsBodiesInFlight(t *testing.T) {
	const n, size, admitted = 16, 1 << 20, 3
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"` + strings.Repeat("x", size-70) + `"}]}`
	arrived, release := make(chan struct{}, n), make(chan struct{})
	var received atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		nb, _ := io.Copy(io.Discard, r.Body)
		received.Add(nb)
		arrived <- struct{}{}
		<-release
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
	}))
	t.Cleanup(up.Close)
	releaseAll := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseAll)
	timers := make(chan chan time.Time, n)
	bound := int64(admitted*len(body) + len(body)/2)
	h := newHarnessOptions(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = up.URL + "/v1"
		c.Limits.MaxBodyBytes = 2 << 20
		c.Limits.MaxInflightBytes = bound
	}, nil, simupstream.Options{}, func(o *Options) {
		o.AdmissionAfter = func(time.Duration) <-chan time.Time {
			c := make(chan time.Time, 1)
			timers <- c
			return c
		}
	})
	heap0 := heapInuse()
	results := make([]<-chan asyncResult, n)
	for i := range results {
		hdr := map[string]string{}
		if i%2 == 0 {
			hdr = key(fmt.Sprint("big-", i))
		}
		results[i] = h.chatAsync(body, hdr)
	}
	for range admitted {
		<-arrived
	}
	waiting := make([]chan time.Time, 0, n-admitted)
	for range n - admitted {
		waiting = append(waiting, <-timers)
	}
	if got := h.gw.admit.InUse(); got != int64(admitted*len(body)) || got > bound {
		t.Fatalf("bytes reserved %d with %d admitted, want %d (bound %d)", got, admitted, admitted*len(body), bound)
	}
	growth := heapInuse() - heap0
	t.Logf("heap in use grew by %.1f MiB with %d bodies of 1 MiB sent, %d admitted", float64(growth)/(1<<20), n, admitted)
	if growth > 2*bound {
		t.Errorf("heap grew by %d bytes: more than twice the bound (%d)", growth, bound)
	}
	for _, c := range waiting {
		c <- time.Time{}
	}
	// The waiters are refused while the admitted three are still held.
	done := make(chan asyncResult, n)
	for _, ch := range results {
		go func() { done <- <-ch }()
	}
	for range n - admitted {
		r := h.await(done)
		e := wantOpenAIError(t, r, http.StatusServiceUnavailable)
		if e["code"] != "gateway_overloaded" || e["type"] != "server_error" || r.header.Get("Retry-After") == "" {
			t.Errorf("refusal: %s, Retry-After %q", r.body, r.header.Get("Retry-After"))
		}
	}
	releaseAll()
	for range admitted {
		if r := h.await(done); r.status != http.StatusOK {
			t.Errorf("admitted request: %d %s", r.status, r.body)
		}
	}
	if got := received.Load(); got != int64(admitted*len(body)) {
		t.Errorf("upstream received %d bytes, want the %d admitted bodies whole", got, admitted)
	}
	if got := h.gw.admit.InUse(); got != 0 {
		t.Errorf("bytes reserved after every request ended: %d", got)
	}
	m := h.do(http.MethodGet, "/metrics", "", map[string]string{"Authorization": "Bearer " + adminToken})
	if !strings.Contains(string(m.body), fmt.Sprintf("llmgate_admission_refused_total %d", n-admitted)) ||
		!strings.Contains(string(m.body), "llmgate_admission_inflight_bytes 0") {
		t.Errorf("metrics:\n%s", grepLines(string(m.body), "llmgate_admission"))
	}
}

func heapInuse() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// A keyed call whose client's deadline passed runs on, holding its body
// until it commits: the body's bytes stay reserved under
// limits.max_inflight_bytes until then, not only until the handler
// returns, and are given back when the call ends.
func TestDetachedCallKeepsItsBodyReserved(t *testing.T) {
	release := make(chan struct{})
	releaseAll := sync.OnceFunc(func() { close(release) })
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		<-release
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
	}))
	t.Cleanup(up.Close)
	defer releaseAll() // before the cleanups, which wait for the upstream's handler
	h := newHarnessOptions(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = up.URL + "/v1"
		c.Upstreams[0].Timeout = config.Duration(time.Minute)
		c.Limits.MaxBodyBytes = 2 << 20
		c.Limits.MaxInflightBytes = 64 << 20
	}, nil, simupstream.Options{}, nil)
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"` + strings.Repeat("x", 1<<20) + `"}]}`
	// The client's deadline is what is under test: the call outlives it.
	r := h.chat(body, map[string]string{"Idempotency-Key": "detach-1", DeadlineHeader: "100ms"})
	if r.status != http.StatusGatewayTimeout {
		t.Fatalf("at the client's deadline: %d %s", r.status, r.body)
	}
	if got := h.gw.admit.InUse(); got != int64(len(body)) {
		t.Errorf("the detached call holds its %d-byte body, but %d bytes are reserved", len(body), got)
	}
	releaseAll()
	h.gw.work.wg.Wait() // the detached call commits and ends
	if got := h.gw.admit.InUse(); got != 0 {
		t.Errorf("bytes reserved after the detached call ended: %d", got)
	}
	if r := h.chat(body, key("detach-1")); r.status != http.StatusOK || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the retry: %d %s", r.status, r.body)
	}
}

// TestAdmissionCountsPassthroughBodiesInMemory: a multipart body held in
// memory (under passthrough.memory_body_bytes) counts against
// limits.max_inflight_bytes as a JSON body does. Five uploads of 900 KiB
// under a bound of two and a half: two are read and forwarded, three wait
// unread and are refused with 503 gateway_overloaded when their wait (an
// injected timer) runs out; the two then answer 200.
func TestAdmissionCountsPassthroughBodiesInMemory(t *testing.T) {
	const n, admitted = 5, 2
	ct, body := multipartBody(t, "adm1t", [][2]string{{"purpose", "batch"}}, make([]byte, 900<<10))
	arrived, release := make(chan struct{}, 4*n), make(chan struct{})
	releaseAll := sync.OnceFunc(func() { close(release) })
	defer releaseAll() // before the cleanups, which wait for the upstream's handler
	rec := newRecorder(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		arrived <- struct{}{}
		<-release
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"file-1","object":"file"}`)
	})
	timers := make(chan chan time.Time, n)
	bound := int64(admitted*len(body) + len(body)/2)
	h := newHarnessOptions(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = rec.srv.URL + "/v1"
		c.Passthrough.SpoolDir = t.TempDir()
		c.Limits.MaxBodyBytes = 1 << 20
		c.Limits.MaxInflightBytes = bound
	}, nil, simupstream.Options{}, func(o *Options) {
		o.AdmissionAfter = func(time.Duration) <-chan time.Time {
			c := make(chan time.Time, 1)
			timers <- c
			return c
		}
	})
	done := make(chan asyncResult, n)
	for range n {
		go func() {
			r, err := h.try(http.MethodPost, "/v1/files", string(body), map[string]string{"Content-Type": ct})
			done <- asyncResult{r, err}
		}()
	}
	for range admitted {
		<-arrived
	}
	waiting := make([]chan time.Time, 0, n-admitted)
	for len(waiting) < n-admitted {
		select {
		case c := <-timers:
			waiting = append(waiting, c)
		case <-arrived:
			t.Fatalf("a body past the bound was read and forwarded (%d bytes reserved, bound %d)", h.gw.admit.InUse(), bound)
		}
	}
	if got := h.gw.admit.InUse(); got != int64(admitted*len(body)) {
		t.Errorf("bytes reserved %d with %d admitted, want %d", got, admitted, admitted*len(body))
	}
	for _, c := range waiting {
		c <- time.Time{}
	}
	for range n - admitted {
		r := h.await(done)
		if e := wantOpenAIError(t, r, http.StatusServiceUnavailable); e["code"] != "gateway_overloaded" {
			t.Errorf("refusal: %s", r.body)
		}
	}
	releaseAll()
	for range admitted {
		if r := h.await(done); r.status != http.StatusOK {
			t.Errorf("admitted upload: %d %s", r.status, r.body)
		}
	}
	if got := h.gw.admit.InUse(); got != 0 {
		t.Errorf("bytes reserved after every request ended: %d", got)
	}
}

// A body larger than passthrough.memory_body_bytes moves to the spool
// file: from then on none of it is in memory, and none of it is reserved.
func TestAdmissionSpooledBodyGivesBackItsReservation(t *testing.T) {
	ct, body := multipartBody(t, "sp00l", [][2]string{{"purpose", "batch"}}, make([]byte, 3<<20))
	arrived, release := make(chan struct{}, 4), make(chan struct{})
	releaseAll := sync.OnceFunc(func() { close(release) })
	defer releaseAll() // before the cleanups, which wait for the upstream's handler
	rec := newRecorder(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		arrived <- struct{}{}
		<-release
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"file-1","object":"file"}`)
	})
	h := newHarnessOptions(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = rec.srv.URL + "/v1"
		c.Passthrough.SpoolDir = t.TempDir()
	}, nil, simupstream.Options{}, nil)
	done := make(chan asyncResult, 1)
	go func() {
		r, err := h.try(http.MethodPost, "/v1/files", string(body), map[string]string{"Content-Type": ct})
		done <- asyncResult{r, err}
	}()
	<-arrived
	if got := h.gw.admit.InUse(); got != 0 {
		t.Errorf("a spooled body still has %d bytes reserved", got)
	}
	releaseAll()
	if r := h.await(done); r.status != http.StatusOK {
		t.Errorf("upload: %d %s", r.status, r.body)
	}
}
