package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
)

// TestPassthroughAudioStreamed: a binary answer (speech audio) reaches the
// client as it arrives: the client reads the first chunk while the fake
// has not yet written the last (it waits for the client to have it).
func TestPassthroughAudioStreamed(t *testing.T) {
	gotFirst := make(chan struct{})
	rec := newRecorder(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "audio/mpeg")
		w.Write(bytes.Repeat([]byte{0xFF, 0xFB}, 1000))
		w.(http.Flusher).Flush()
		select {
		case <-gotFirst:
		case <-r.Context().Done():
			return
		case <-time.After(5 * time.Second):
			return // the client never got the first chunk: no LAST, the test fails
		}
		w.Write([]byte("LAST"))
	})
	h := passHarness(t, rec, nil)
	ctx, cancel := context.WithTimeout(context.Background(), requestLimit)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", h.srv.URL+"/v1/audio/speech", bytes.NewReader([]byte(`{"model":"tts-1","input":"hi","voice":"alloy"}`)))
	req.Header.Set("Content-Type", "application/json")
	res, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.Header.Get("Content-Type") != "audio/mpeg" {
		t.Fatalf("Content-Type %q", res.Header.Get("Content-Type"))
	}
	first := make([]byte, 2000)
	if _, err := io.ReadFull(res.Body, first); err != nil {
		t.Fatalf("reading the first chunk before the last was written: %v", err)
	}
	close(gotFirst)
	rest, err := io.ReadAll(res.Body)
	if err != nil || string(rest) != "LAST" || !bytes.Equal(first, bytes.Repeat([]byte{0xFF, 0xFB}, 1000)) {
		t.Fatalf("rest %q, err %v", rest, err)
	}
}

// TestPassthroughSpooledRetry: a body spooled to disk is resent from the
// file on a retry, byte for byte.
func TestPassthroughSpooledRetry(t *testing.T) {
	var calls atomic.Int32
	rec := newRecorder(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		fmt.Fprint(w, `{"id":"file-9"}`)
	})
	h := passHarness(t, rec, func(c *config.Config) { c.Passthrough.MemoryBodyBytes = 1024 })
	file := make([]byte, 300<<10)
	for i := range file {
		file[i] = byte(i * 7)
	}
	ct, body := multipartBody(t, "spool", [][2]string{{"purpose", "batch"}}, file)
	r := h.sendRaw("POST", "/v1/files", ct, body, nil)
	seen := rec.seen()
	if r.status != 200 || len(seen) != 2 {
		t.Fatalf("%d %s after %d attempts, want 200 after 2", r.status, r.body, len(seen))
	}
	for i, s := range seen {
		if !bytes.Equal(s.body, body) {
			t.Errorf("attempt %d sent %d bytes, not the %d the client sent", i+1, len(s.body), len(body))
		}
	}
}

// TestPassthroughOnceBody: a body declaring more than
// passthrough.spool_max_bytes streams to the upstream once: a 5xx is not
// retried; with an Idempotency-Key it is refused before any upstream call.
func TestPassthroughOnceBody(t *testing.T) {
	rec := newRecorder(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusServiceUnavailable) })
	h := passHarness(t, rec, func(c *config.Config) { c.Passthrough.SpoolMaxBytes = 1000 })
	ct, body := multipartBody(t, "once", nil, make([]byte, 5000))
	r := h.sendRaw("POST", "/v1/files", ct, body, nil)
	if r.status != http.StatusServiceUnavailable || len(rec.seen()) != 1 || !bytes.Equal(rec.seen()[0].body, body) {
		t.Fatalf("once body: %d after %d attempts, want the 503 after 1", r.status, len(rec.seen()))
	}
	r = h.sendRaw("POST", "/v1/files", ct, body, map[string]string{"Idempotency-Key": "k"})
	wantOpenAIError(t, r, http.StatusRequestEntityTooLarge)
	if len(rec.seen()) != 1 {
		t.Fatal("a keyed once body reached the upstream")
	}
}

// TestPassthroughUploadBoundedMemory uploads 64 MiB through a keyed
// /v1/files: the body is spooled and fingerprinted as it streams, so the
// gateway's heap grows far less than the body. The fake hashes what it
// receives without holding it.
func TestPassthroughUploadBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("64 MiB upload")
	}
	const size = 64 << 20
	var gotSum atomic.Value
	up := newTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := sha256.New()
		io.Copy(s, r.Body)
		gotSum.Store(fmt.Sprintf("%x", s.Sum(nil)))
		fmt.Fprint(w, `{"id":"file-big"}`)
	}))
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = up + "/v1"
		c.Passthrough.SpoolDir = t.TempDir()
	})
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	sent := sha256.New()
	go func() {
		_ = mw.WriteField("purpose", "batch")
		fw, _ := mw.CreateFormFile("file", "big.jsonl")
		chunk := bytes.Repeat([]byte("0123456789abcdef"), 4096)
		for n := 0; n < size; n += len(chunk) {
			fw.Write(chunk)
		}
		mw.Close()
		pw.Close()
	}()
	req, _ := http.NewRequest("POST", h.srv.URL+"/v1/files", io.TeeReader(pr, sent))
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Idempotency-Key", "big-upload")

	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	res, err := testClient.Do(req)
	close(stop)
	<-sampled
	if err != nil {
		t.Fatal(err)
	}
	body := readAllBody(t, res)
	if res.StatusCode != 200 || string(body) != `{"id":"file-big"}` {
		t.Fatalf("%d %s", res.StatusCode, body)
	}
	if want := fmt.Sprintf("%x", sent.Sum(nil)); gotSum.Load() != want {
		t.Fatalf("upstream received other bytes than the client sent")
	}
	growth := int64(peak.Load()) - int64(base.HeapInuse)
	t.Logf("heap in use grew by %.1f MiB during a %d MiB upload", float64(growth)/(1<<20), size>>20)
	if growth > size/4 {
		t.Fatalf("heap grew by %d bytes for a %d-byte upload: the body is held in memory", growth, size)
	}
}

// TestPassthroughKeyedSpooledOutlivesHandler: a keyed upload whose client
// stops waiting (X-Llmgate-Deadline) while the upstream is still reading
// the body runs on: the spooled body stays open until the call ends, the
// upstream receives it whole, and the answer is committed for the
// client's retry to replay.
func TestPassthroughKeyedSpooledOutlivesHandler(t *testing.T) {
	if testing.Short() {
		t.Skip("16 MiB upload")
	}
	release, finished := make(chan struct{}), make(chan struct{})
	var got atomic.Value
	up := newTestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		head := make([]byte, 1024)
		io.ReadFull(r.Body, head)
		select { // the rest is read only after the client has given up
		case <-release:
		case <-r.Context().Done():
			return
		}
		rest, _ := io.ReadAll(r.Body)
		got.Store(append(head, rest...))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"file-late"}`)
		close(finished)
	}))
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = up + "/v1"
		c.Upstreams[0].Timeout = config.Duration(requestLimit) // the attempt includes the upload
		c.Passthrough.SpoolDir = t.TempDir()
	})
	file := bytes.Repeat([]byte("0123456789abcdef"), 1<<20) // 16 MiB: more than the socket buffers take
	ct, body := multipartBody(t, "late", [][2]string{{"purpose", "batch"}}, file)
	r := h.sendRaw("POST", "/v1/files", ct, body, map[string]string{"Idempotency-Key": "late-upload", DeadlineHeader: "5s"}) // long enough for the body to reach the gateway first
	wantOpenAIError(t, r, http.StatusGatewayTimeout)
	if got := h.gw.spooled.InUse(); got != int64(len(body)) { // the running call keeps its spool reserved (L1)
		t.Errorf("spooled bytes reserved after the handler returned: %d, want the body's %d", got, len(body))
	}
	close(release)
	select { // the call runs on without its client and ends; its retry then replays
	case <-finished:
	case <-time.After(requestLimit):
		t.Fatal("the upstream never received the whole body")
	}
	again := h.sendRaw("POST", "/v1/files", ct, body, map[string]string{"Idempotency-Key": "late-upload"})
	if again.status != 200 || string(again.body) != `{"id":"file-late"}` || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %s replayed=%q\n%s", again.status, again.body, again.header.Get("Idempotent-Replayed"), h.logs.String())
	}
	if b, _ := got.Load().([]byte); !bytes.Equal(b, body) {
		t.Fatalf("upstream received %d bytes, not the %d the client sent", len(b), len(body))
	}
	waitBound(t, h.gw.spooled, func(n int64) bool { return n == 0 }) // given back when the call ended
}
