package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
)

// Regression tests for what a read-only review of the reshaped request
// path found; each failed before its fix.

const finishChunk = `{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}`
const helChunk = `{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},"finish_reason":null}]}`

func sseUpstream(events ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range events {
			fmt.Fprintf(w, "data: %s\n\n", ev)
			w.(http.Flusher).Flush()
		}
	}
}

// A keyed stream that is no answer at [DONE] (an error event after the
// finish_reason, or a malformed event) must not end cleanly with its tail
// silently dropped: exactly one error event replaces the tail.
func TestKeyedStreamFailingAtDoneEndsWithOneErrorEvent(t *testing.T) {
	for name, events := range map[string][]string{
		"error after finish": {helChunk, finishChunk, `{"error":{"message":"internal","type":"server_error","code":"server_error"}}`, "[DONE]"},
		"malformed event":    {helChunk, "keep-alive", finishChunk, "[DONE]"},
	} {
		t.Run(name, func(t *testing.T) {
			h, _ := upstreamHarness(t, sseUpstream(events...), nil)
			r := h.chat(streamBody, key("k"))
			if n := strings.Count(string(r.body), `{"error":`); n != 1 || strings.Contains(string(r.body), "[DONE]") {
				t.Fatalf("%d error events: %q", n, r.body)
			}
		})
	}
}

// A stream whose first event is [DONE] has ended: it is not read further.
func TestStreamWhoseFirstEventIsDone(t *testing.T) {
	h, calls := upstreamHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: [DONE]\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // holds the connection open
	}, func(c *config.Config) { c.Limits.StreamIdleTimeout = config.Duration(5 * time.Second) })
	start := time.Now()
	r := h.chat(streamBody, key("done-first"))
	if r.status != 200 || string(r.body) != "data: [DONE]\n\n" || time.Since(start) > 3*time.Second {
		t.Fatalf("%d %q after %v", r.status, r.body, time.Since(start))
	}
	if again := h.chat(streamBody, key("done-first")); again.header.Get("Idempotent-Replayed") != "true" || calls.Load() != 1 {
		t.Fatalf("not committed: replayed=%q calls=%d", again.header.Get("Idempotent-Replayed"), calls.Load())
	}
}

// A client's short deadline that stops the retry loop (the next wait would
// pass it) says nothing about the upstream: it must not open the breaker.
func TestClientDeadlineStoppingRetriesIsNotABreakerFailure(t *testing.T) {
	h, _ := upstreamHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "2")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(429)
		io.WriteString(w, `{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}`)
	}, func(c *config.Config) { c.Breaker.ConsecutiveFailures = 3 })
	for i := range 4 {
		h.chat(chatBody, map[string]string{DeadlineHeader: "1s", "Idempotency-Key": fmt.Sprint("k", i)})
	}
	if got := breakerState(t, h, "primary"); got != "closed" {
		t.Fatalf("breaker %s after short client deadlines", got)
	}
}

// A JSON answer too large to record, cut by the upstream mid-copy, leaves
// the key free at once (not claimed until the lease runs out).
func TestLargeJSONCutReleasesTheKey(t *testing.T) {
	var n atomic.Int32
	h, _ := upstreamHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"`+strings.Repeat("a", 3000))
		w.(http.Flusher).Flush()
		if n.Add(1) == 1 {
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		io.WriteString(w, `"},"finish_reason":"stop"}]}`)
	}, func(c *config.Config) {
		c.Idempotency.MaxRecordBytes = 1024
		c.Idempotency.WaitTimeout = config.Duration(2 * time.Second)
		c.Idempotency.Lease = config.Duration(time.Minute)
		c.Retry.MaxAttempts = 1
	})
	if res, err := h.send(context.Background(), http.MethodPost, "/v1/chat/completions", chatBody, key("big")); err == nil {
		if _, err := io.ReadAll(res.Body); err == nil {
			t.Fatal("a cut answer read as whole")
		}
		res.Body.Close()
	}
	if r := h.chat(chatBody, key("big")); r.status != 200 || len(r.body) < 3000 {
		t.Fatalf("retry: %d %.100s", r.status, r.body)
	}
}

// A JSON answer too large to record, whose client's deadline passes while
// it is copied: the response is cut (never a JSON prefix with an SSE event
// appended), no marker is committed, and the retry runs again.
func TestLargeJSONPastClientDeadlineIsCut(t *testing.T) {
	release := make(chan struct{})
	h, calls := upstreamHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"`+strings.Repeat("a", 3000))
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		io.WriteString(w, `"},"finish_reason":"stop"}]}`)
	}, func(c *config.Config) {
		c.Idempotency.MaxRecordBytes = 1024
		c.Idempotency.WaitTimeout = config.Duration(5 * time.Second)
	})
	res, err := h.send(context.Background(), http.MethodPost, "/v1/chat/completions", chatBody, map[string]string{"Idempotency-Key": "big2", DeadlineHeader: "200ms"})
	if err == nil {
		b, rerr := io.ReadAll(res.Body)
		res.Body.Close()
		if rerr == nil || strings.Contains(string(b), "data: ") {
			t.Fatalf("answer past the client's deadline read as whole (%v): %.80q", rerr, b[max(0, len(b)-80):])
		}
	}
	close(release)
	if r := h.chat(chatBody, key("big2")); r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry: %d replayed=%q %.100s (calls %d)", r.status, r.header.Get("Idempotent-Replayed"), r.body, calls.Load())
	}
}

// During shutdown a transient failure whose retry wait was cut is not the
// upstream's: another replica may serve the retry.
func TestShutdownCutRetryMayBeRetried(t *testing.T) {
	var n atomic.Int32
	h, _ := upstreamHarness(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.WriteHeader(503)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
	}, nil)
	h.gw.BeginShutdown()
	r := h.chat(chatBody, key("sd"))
	if r.status == 200 {
		t.Skip("the retry was not cut")
	}
	if r.header.Get("X-Should-Retry") == "false" {
		t.Fatalf("%d with x-should-retry: false for a failure shutdown cut", r.status)
	}
}

// A stream over the record limit whose client's deadline passed was not
// received whole: no marker; the retry runs again instead of a 410.
func TestOverLimitStreamPastDeadlineIsNotMarked(t *testing.T) {
	gate := make(chan struct{})
	h, _ := upstreamHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		big := `{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 600) + `"},"finish_reason":null}]}`
		for i := range 6 {
			fmt.Fprintf(w, "data: %s\n\n", big)
			w.(http.Flusher).Flush()
			if i == 0 {
				select {
				case <-gate:
				case <-r.Context().Done():
					return
				}
			}
		}
		fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", finishChunk)
	}, func(c *config.Config) { c.Idempotency.MaxRecordBytes = 2048 })
	go func() {
		// Let the stream go on once the client has been told.
		for !strings.Contains(h.logs.String(), `"class":"client_deadline"`) {
			time.Sleep(5 * time.Millisecond)
		}
		close(gate)
	}()
	r := h.chat(streamBody, map[string]string{"Idempotency-Key": "ol", DeadlineHeader: "100ms"})
	if !strings.Contains(string(r.body), "client_deadline_exceeded") {
		t.Fatalf("first: %q", r.body)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		// A retry while the call still runs joins its stream, and is cut
		// once the stream passes the record limit (it is not committed):
		// a read error here is that cut, and the loop retries.
		req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(streamBody))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "ol")
		res, err := testClient.Do(req)
		if err != nil { // cut before its status line went out
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
			continue
		}
		body, readErr := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode == http.StatusGone {
			t.Fatalf("retry got 410 for an answer nobody received: %s", body)
		}
		if res.StatusCode == 200 && readErr == nil || time.Now().After(deadline) {
			break
		}
	}
}

// A keyed stream whose client stopped reading (connected, not closed) must
// not pin the handler past the client's deadline.
func TestStuckReaderDoesNotPinKeyedCall(t *testing.T) {
	h, _ := upstreamHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := `{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 1000) + `"},"finish_reason":null}]}`
		for range 6000 {
			if _, err := fmt.Fprintf(w, "data: %s\n\n", chunk); err != nil {
				return
			}
		}
		fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", finishChunk)
	}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res, err := h.send(ctx, http.MethodPost, "/v1/chat/completions", streamBody, map[string]string{"Idempotency-Key": "stuck", DeadlineHeader: "200ms"})
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close() // never read
	h.waitRequestLine(func(m map[string]any) bool { return m["class"] == "client_deadline" })
}

// A dead-letter replay of a stream that fails again is not a success.
func TestDeadLetterReplayOfFailingStreamIsNotASuccess(t *testing.T) {
	h, _ := upstreamHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: %s\n\n", helChunk)
		w.(http.Flusher).Flush()
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}, nil)
	h.chat(streamBody, key("s-dlq"))
	l := listDLQ(t, h, "")
	if l.Total != 1 {
		t.Fatalf("dead letters: %d", l.Total)
	}
	r := h.admin(http.MethodPost, "/admin/deadletters/"+l.DeadLetters[0].ID+"/replay")
	if r.status != 200 || strings.Contains(string(r.body), `"status":200`) || !strings.Contains(string(r.body), "failed again") {
		t.Fatalf("replay of a stream that failed again: %s", r.body)
	}
}
