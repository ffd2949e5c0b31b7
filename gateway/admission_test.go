package gateway

import (
	"errors"
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
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway/admission"
)

// TestAdmissionBoundsBodiesInFlight (issue 15): 16 requests with 1 MiB
// bodies under limits.max_inflight_bytes of 3.5 MiB. The first three are
// read and forwarded (the upstream holds them); the other thirteen are
// read only as far as the half MiB left lets them — bodies are reserved
// as they arrive (BROKE-1) — wait for more, and get 503
// gateway_overloaded with Retry-After when their wait (an injected timer)
// runs out; the three then answer 200. The bytes reserved never pass the
// bound, and the heap grows by about the bound, not sixteen bodies.
// (The three go first: in a simultaneous burst, which bodies complete
// depends on how their bytes interleave.)
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
	}, nil, fakeprovider.Options{}, func(o *Options) {
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
		if i == admitted-1 {
			for range admitted {
				<-arrived
			}
			if got := h.gw.admit.InUse(); got != int64(admitted*len(body)) {
				t.Errorf("bytes reserved %d with %d admitted, want %d", got, admitted, admitted*len(body))
			}
		}
	}
	first := <-timers // one of the thirteen waits for room ...
	if got := h.gw.admit.InUse(); got > bound {
		t.Fatalf("bytes reserved %d, over the bound %d", got, bound)
	}
	growth := heapInuse() - heap0
	t.Logf("heap in use grew by %.1f MiB with %d bodies of 1 MiB sent, %d admitted", float64(growth)/(1<<20), n, admitted)
	if growth > 2*bound {
		t.Errorf("heap grew by %d bytes: more than twice the bound (%d)", growth, bound)
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() { // ... and every wait runs out
		for {
			select {
			case c := <-timers:
				c <- time.Time{}
			case <-stop:
				return
			}
		}
	}()
	first <- time.Time{}
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

// TestSlowBodyHoldsOnlyWhatItSent (BROKE-1): two connections that declare
// 32 MiB bodies and trickle them hold, under limits.max_inflight_bytes,
// only about what they sent — not their declared lengths, which would fill
// the 64 MiB bound until server.read_body_timeout — and another tenant's
// small chat is admitted at once.
func TestSlowBodyHoldsOnlyWhatItSent(t *testing.T) {
	const declared = 32 << 20
	h := newHarnessOptions(t, func(c *config.Config) {
		c.Limits.MaxBodyBytes = declared
		c.Limits.MaxInflightBytes = 2 * declared
		c.Clients = []config.Client{{Name: "mallory", Key: "key-mallory"}, {Name: "alice", Key: "key-alice"}}
	}, nil, fakeprovider.Options{}, func(o *Options) {
		o.AdmissionAfter = func(time.Duration) <-chan time.Time { // any wait ends at once: a refusal
			c := make(chan time.Time, 1)
			c <- time.Time{}
			return c
		}
	})
	for range 2 {
		w, _ := h.trickle("/v1/chat/completions", "application/json", "key-mallory", declared)
		if _, err := w.Write([]byte(`{"model":"gpt-4o-mini","messages":[`)); err != nil {
			t.Fatal(err)
		}
	}
	h.waitInUse(2 * (64 << 10)) // both handlers are reading: each reserved its first chunk
	if got := h.gw.admit.InUse(); got > 2*(256<<10) {
		t.Errorf("two bodies that sent 36 bytes each hold %d bytes under limits.max_inflight_bytes", got)
	}
	small := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"` + strings.Repeat("x", 4<<10) + `"}]}`
	if r := h.chat(small, map[string]string{"Authorization": "Bearer key-alice"}); r.status != http.StatusOK {
		t.Errorf("alice's 4 KiB chat while mallory trickles: %d %s", r.status, r.body)
	}
}

// TestClientShare: one client may hold at most half of
// limits.max_inflight_bytes (but one whole body): once four of mallory's
// bodies hold 4 MiB of an 8 MiB bound, her fifth is refused at once with
// 503 gateway_overloaded, while alice's chat is admitted.
func TestClientShare(t *testing.T) {
	h := newHarnessOptions(t, func(c *config.Config) {
		c.Limits.MaxBodyBytes = 1 << 20
		c.Limits.MaxInflightBytes = 8 << 20
		c.Clients = []config.Client{{Name: "mallory", Key: "key-mallory"}, {Name: "alice", Key: "key-alice"}}
	}, nil, fakeprovider.Options{}, nil)
	for range 4 { // each grows its buffer to 1 MiB: 64, 128, 256, 512 KiB, 1 MiB
		w, _ := h.trickle("/v1/chat/completions", "application/json", "key-mallory", 1<<20)
		if _, err := w.Write(make([]byte, 600<<10)); err != nil {
			t.Fatal(err)
		}
	}
	h.waitInUse(4 << 20)
	fifth, status := h.trickle("/v1/chat/completions", "application/json", "key-mallory", 1<<20)
	go fifth.Write([]byte("{")) // fails once the gateway has answered
	// A deadline, not a synchronisation: the refusal comes at once.
	select {
	case got := <-status:
		if got != http.StatusServiceUnavailable {
			t.Errorf("mallory's fifth body past her share: status %d, want 503", got)
		}
	case <-time.After(requestLimit / 3):
		t.Fatalf("mallory's fifth body past her share was admitted (%d bytes reserved)", h.gw.admit.InUse())
	}
	if got := h.gw.admit.InUse(); got > 4<<20 {
		t.Errorf("mallory holds %d bytes, over her share of 4 MiB", got)
	}
	small := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
	if r := h.chat(small, map[string]string{"Authorization": "Bearer key-alice"}); r.status != http.StatusOK {
		t.Errorf("alice's chat while mallory holds her share: %d %s", r.status, r.body)
	}
}

// TestClientShareLeavesOneWholeBody: with limits.max_inflight_bytes at
// twice limits.max_body_bytes (the default's rule), one client holding
// all it may — a chunked body stalled at the limit, waiting to send the
// byte past it — leaves another room for a body of the largest size. A
// body's reservation counted the byte read past its limit (or past its
// declared length, to see its end), so the first held max + 1 bytes and
// the second needed max + 1: 2 bytes too many, and its 503 broke the
// share's promise.
func TestClientShareLeavesOneWholeBody(t *testing.T) {
	const max = 1 << 20
	h := newHarnessOptions(t, func(c *config.Config) {
		c.Limits.MaxBodyBytes = max
		c.Limits.MaxInflightBytes = 2 * max
		c.Limits.AdmissionWait = config.Duration(100 * time.Millisecond)
		c.Clients = []config.Client{{Name: "mallory", Key: "key-mallory"}, {Name: "alice", Key: "key-alice"}}
	}, nil, fakeprovider.Options{}, nil)
	w, _ := h.trickle("/v1/chat/completions", "application/json", "key-mallory", -1) // chunked
	if _, err := w.Write(make([]byte, max)); err != nil {
		t.Fatal(err)
	}
	h.waitInUse(max)
	head := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"`
	tail := `"}]}`
	whole := head + strings.Repeat("a", max-len(head)-len(tail)) + tail
	if r := h.chat(whole, map[string]string{"Authorization": "Bearer key-alice"}); r.status != http.StatusOK {
		t.Errorf("alice's body of the largest size while mallory holds her share: %d %.300s", r.status, r.body)
	}
	if got := h.gw.admit.InUse(); got > max {
		t.Errorf("mallory's stalled body holds %d bytes, over the %d it sent", got, max)
	}
	// Alice's chunked bodies: the largest size is read to its end, one
	// byte more is refused.
	chunked := func(body string) int {
		req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions", struct{ io.Reader }{strings.NewReader(body)})
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer key-alice")
		res, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if len(res.TransferEncoding) == 0 && req.ContentLength > 0 {
			t.Fatal("the request was not chunked")
		}
		return res.StatusCode
	}
	if got := chunked(whole); got != http.StatusOK {
		t.Errorf("alice's chunked body of the largest size: %d", got)
	}
	if got := chunked(whole + " "); got != http.StatusRequestEntityTooLarge {
		t.Errorf("alice's chunked body one byte over: %d, want 413", got)
	}
}

// trickle starts a POST to path that declares length body bytes and sends
// what the test writes to the returned pipe; the test's end closes it.
// The channel gets the answer's status (0: no answer).
func (h *harness) trickle(path, contentType, key string, length int64) (*io.PipeWriter, <-chan int) {
	pr, pw := io.Pipe()
	h.t.Cleanup(func() { pw.CloseWithError(errors.New("test over")) })
	req, err := http.NewRequest(http.MethodPost, h.srv.URL+path, pr)
	if err != nil {
		h.t.Fatal(err)
	}
	req.ContentLength = length
	req.Header.Set("Content-Type", contentType)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	status := make(chan int, 1)
	go func() {
		res, err := testClient.Do(req)
		if err != nil {
			status <- 0
			return
		}
		res.Body.Close()
		status <- res.StatusCode
	}()
	return pw, status
}

// waitInUse waits until at least n bytes are reserved under
// limits.max_inflight_bytes: requests whose bodies the test controls have
// reached the reading of them.
func (h *harness) waitInUse(n int64) {
	h.t.Helper()
	waitBound(h.t, h.gw.admit, func(got int64) bool { return got >= n })
}

// waitBound waits until ok holds of the bytes reserved under b: a
// condition polled, with a deadline.
func waitBound(t *testing.T, b *admission.Bound, ok func(int64) bool) {
	t.Helper()
	for end := time.Now().Add(requestLimit); !ok(b.InUse()); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("bytes reserved: %d, still not as awaited", b.InUse())
		}
	}
}

// TestSpoolBoundsTotalBytes (L1): the bytes spooled to disk across
// requests are bounded by passthrough.spool_max_total_bytes, reserved as
// they are written: while a slow upload holds 48 KiB of a 64 KiB bound, a
// 32 KiB upload gets 503 gateway_overloaded with Retry-After (its wait, an
// injected timer, ends at once); when the slow one ends its bytes are
// given back and the same upload is accepted.
func TestSpoolBoundsTotalBytes(t *testing.T) {
	rec := newRecorder(t, nil)
	h := newHarnessOptions(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = rec.srv.URL + "/v1"
		c.Passthrough.SpoolDir = t.TempDir()
		c.Passthrough.MemoryBodyBytes = 1 << 10
		c.Passthrough.SpoolMaxTotalBytes = 64 << 10
	}, nil, fakeprovider.Options{}, func(o *Options) {
		o.AdmissionAfter = func(time.Duration) <-chan time.Time {
			c := make(chan time.Time, 1)
			c <- time.Time{}
			return c
		}
	})
	slow, _ := h.trickle("/v1/files", "application/octet-stream", "", 1<<20)
	if _, err := slow.Write(make([]byte, 48<<10)); err != nil {
		t.Fatal(err)
	}
	waitBound(t, h.gw.spooled, func(got int64) bool { return got >= 48<<10 })
	r := h.sendRaw(http.MethodPost, "/v1/files", "application/octet-stream", make([]byte, 32<<10), nil)
	if e := wantOpenAIError(t, r, http.StatusServiceUnavailable); e["code"] != "gateway_overloaded" ||
		r.header.Get("Retry-After") == "" || !strings.Contains(fmt.Sprint(e["message"]), "passthrough.spool_max_total_bytes") {
		t.Errorf("upload past the spool bound: %d %s", r.status, r.body)
	}
	slow.CloseWithError(errors.New("client gone"))
	waitBound(t, h.gw.spooled, func(got int64) bool { return got == 0 })
	if r := h.sendRaw(http.MethodPost, "/v1/files", "application/octet-stream", make([]byte, 32<<10), nil); r.status != http.StatusOK {
		t.Errorf("upload after the slow one ended: %d %s", r.status, r.body)
	}
	if got := h.gw.spooled.InUse(); got != 0 {
		t.Errorf("bytes spooled after every request ended: %d", got)
	}
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
	}, nil, fakeprovider.Options{}, nil)
	body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"` + strings.Repeat("x", 1<<20) + `"}]}`
	// The client's deadline is what is under test: the call outlives it.
	r := h.chat(body, map[string]string{"Idempotency-Key": "detach-1", DeadlineHeader: "100ms"})
	if r.status != http.StatusGatewayTimeout {
		t.Fatalf("at the client's deadline: %d %s", r.status, r.body)
	}
	// The buffer a body is read into is reserved whole: at least the body,
	// at most twice it (it grows by doubling).
	if got := h.gw.admit.InUse(); got < int64(len(body)) || got > 2*int64(len(body)) {
		t.Errorf("the detached call holds its %d-byte body, but %d bytes are reserved", len(body), got)
	}
	releaseAll()
	h.gw.requests.WaitCalls() // the detached call commits and ends
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
	}, nil, fakeprovider.Options{}, func(o *Options) {
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
	}, nil, fakeprovider.Options{}, nil)
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

// TestSpoolClientShare: one client may hold at most half of
// passthrough.spool_max_total_bytes on disk (but one whole body of the
// largest a route takes): while two of mallory's slow uploads hold 30 KiB
// of a 64 KiB bound, her third upload is refused at once with 503
// gateway_overloaded naming the setting, while alice's upload of the same
// size is accepted; when mallory's uploads end, her share is hers again.
func TestSpoolClientShare(t *testing.T) {
	rec := newRecorder(t, nil)
	h := newHarnessOptions(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = rec.srv.URL + "/v1"
		c.Limits.MaxBodyBytes = 16 << 10
		c.Passthrough.SpoolDir = t.TempDir()
		c.Passthrough.MemoryBodyBytes = 1 << 10
		c.Passthrough.SpoolMaxTotalBytes = 64 << 10
		c.Passthrough.Routes = []config.Route{{Prefix: "/v1/files", MaxBodyBytes: 16 << 10}, {Prefix: "/v1/uploads", MaxBodyBytes: 16 << 10}}
		// Their own upstream keys: a binary body under a shared key is refused (its objects cannot be checked).
		own := func(k string) map[string]string { return map[string]string{c.Upstreams[0].Name: k} }
		c.Clients = []config.Client{{Name: "mallory", Key: "key-mallory", UpstreamAPIKeys: own("sk-mallory")},
			{Name: "alice", Key: "key-alice", UpstreamAPIKeys: own("sk-alice")}}
	}, nil, fakeprovider.Options{}, func(o *Options) {
		o.AdmissionAfter = func(time.Duration) <-chan time.Time { // a wait that does not fit ends at once
			c := make(chan time.Time, 1)
			c <- time.Time{}
			return c
		}
	})
	var slow []*io.PipeWriter
	for i := range 2 {
		w, _ := h.trickle("/v1/files", "application/octet-stream", "key-mallory", 16<<10)
		if _, err := w.Write(make([]byte, 15<<10)); err != nil {
			t.Fatal(err)
		}
		waitBound(t, h.gw.spooled, func(got int64) bool { return got >= int64(i+1)*(15<<10) })
		slow = append(slow, w)
	}
	upload := func(key string) result {
		return h.sendRaw(http.MethodPost, "/v1/files", "application/octet-stream", make([]byte, 8<<10), map[string]string{"Authorization": "Bearer " + key})
	}
	r := upload("key-mallory")
	if e := wantOpenAIError(t, r, http.StatusServiceUnavailable); e["code"] != "gateway_overloaded" ||
		!strings.Contains(fmt.Sprint(e["message"]), "passthrough.spool_max_total_bytes") {
		t.Errorf("mallory's upload past her share of the spool: %d %s", r.status, r.body)
	}
	if r := upload("key-alice"); r.status != http.StatusOK {
		t.Errorf("alice's upload while mallory holds her share: %d %s", r.status, r.body)
	}
	for _, w := range slow {
		w.CloseWithError(errors.New("client gone"))
	}
	waitBound(t, h.gw.spooled, func(got int64) bool { return got == 0 })
	if r := upload("key-mallory"); r.status != http.StatusOK {
		t.Errorf("mallory's upload after her slow ones ended: %d %s", r.status, r.body)
	}
}

// TestUploadOverMemoryShareGoesToDisk: a non-JSON passthrough body is held
// in memory up to passthrough.memory_body_bytes (1 MiB), counted under
// limits.max_inflight_bytes; where a client's share of that bound is
// smaller (here 512 KiB), a lone 700 KB upload must still go through —
// to the spool file, as a larger body would — not get 503
// gateway_overloaded with nothing else in flight.
func TestUploadOverMemoryShareGoesToDisk(t *testing.T) {
	ct, body := multipartBody(t, "rev1", [][2]string{{"purpose", "batch"}}, make([]byte, 700<<10))
	rec := newRecorder(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"file-1","object":"file"}`))
	})
	h := newHarnessOptions(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = rec.srv.URL + "/v1"
		c.Passthrough.SpoolDir = t.TempDir()
		c.Limits.MaxBodyBytes = 512 << 10
		c.Limits.MaxInflightBytes = 1 << 20
		c.Clients = []config.Client{{Name: "alice", Key: "key-alice"}}
	}, nil, fakeprovider.Options{}, nil)
	r := h.sendRaw(http.MethodPost, "/v1/files", ct, body, map[string]string{"Authorization": "Bearer key-alice"})
	if r.status != http.StatusOK {
		t.Fatalf("a lone upload of %d bytes: %d %.300s", len(body), r.status, r.body)
	}
	if s := rec.seen(); len(s) != 1 || len(s[0].body) != len(body) {
		t.Fatalf("the upstream saw %d requests, want the upload whole", len(s))
	}
	if got := h.gw.admit.InUse(); got != 0 {
		t.Errorf("%d bytes still reserved in memory after the upload", got)
	}
}
