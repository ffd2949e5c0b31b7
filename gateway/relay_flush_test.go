package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"net/http/httptest"

	"github.com/llmgate/llmgate/config"
)

// TestRelayFlushesBeforeWaitingOnUpstream: each event the upstream has sent
// reaches the client before the relay waits for the next one. The upstream
// sends a role chunk and a content chunk, then waits until the test has read
// the content chunk from the gateway before it sends the rest; a gateway
// that held events until some later write would leave the test waiting. A
// keyed stream holds only its tail (from the finish_reason chunk on), so its
// content chunks flow the same way.
func TestRelayFlushesBeforeWaitingOnUpstream(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		t.Run(fmt.Sprintf("keyed=%v", keyed), func(t *testing.T) {
			seen := make(chan struct{})
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				chunk := func(delta, finish string) {
					fmt.Fprintf(w, `data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`+"\n\n", delta, finish)
				}
				chunk(`{"role":"assistant","content":""}`, "null")
				chunk(`{"content":"first"}`, "null")
				w.(http.Flusher).Flush()
				select {
				case <-seen:
				case <-r.Context().Done():
					return
				}
				chunk(`{}`, `"stop"`)
				fmt.Fprint(w, "data: [DONE]\n\n")
			}))
			defer up.Close()
			h := newHarness(t, func(c *config.Config) { c.Upstreams[0].BaseURL = up.URL + "/v1" })
			req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(streamBody))
			req.Header.Set("Content-Type", "application/json")
			if keyed {
				req.Header.Set("Idempotency-Key", "flush-before-wait")
			}
			resp, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			got := make(chan error, 1)
			go func() {
				br := bufio.NewReader(resp.Body)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						got <- err
						return
					}
					if strings.Contains(line, `"content":"first"`) {
						got <- nil
						return
					}
				}
			}()
			select {
			case err := <-got:
				if err != nil {
					t.Fatalf("stream ended before the content chunk: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the content chunk did not reach the client while the upstream waited for it to")
			}
			close(seen)
		})
	}
}

// flushCounter is a client that counts the flushes that reach it.
type flushCounter struct {
	*httptest.ResponseRecorder
	flushes int
}

func (f *flushCounter) Flush() {
	f.flushes++
	f.ResponseRecorder.Flush()
}

// TestRelayFlushesOncePerUpstreamRead: the events one read of the upstream
// brings go to the client with one flush, not one each (a flush is a write
// to the client's socket, the stream relay's largest cost). The upstream
// sends a whole 10-event stream in one write; the client gets it with one
// flush, keyed too: a keyed stream's held tail, released after the commit,
// goes out with the response's end (its final chunk and trailers), not with
// a flush of its own. Before, every event was flushed on its own.
func TestRelayFlushesOncePerUpstreamRead(t *testing.T) {
	var stream strings.Builder
	for i := range 8 {
		fmt.Fprintf(&stream, `data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"w%d "},"finish_reason":null}]}`+"\n\n", i)
	}
	stream.WriteString(`data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n")
	stream.WriteString("data: [DONE]\n\n")
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, stream.String())
	}))
	defer up.Close()
	h := newHarness(t, func(c *config.Config) { c.Upstreams[0].BaseURL = up.URL + "/v1" })
	for _, c := range []struct {
		key        string
		maxFlushes int
	}{{"", 1}, {"flush-once-per-read", 1}} {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(streamBody))
		req.Header.Set("Content-Type", "application/json")
		if c.key != "" {
			req.Header.Set("Idempotency-Key", c.key)
		}
		w := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
		h.gw.Handler().ServeHTTP(w, req)
		if w.Code != http.StatusOK || w.Body.String() != stream.String() {
			t.Fatalf("key %q: status %d, body not the upstream's:\n%s", c.key, w.Code, w.Body)
		}
		if w.flushes < 1 || w.flushes > c.maxFlushes {
			t.Errorf("key %q: %d flushes for one upstream read of 10 events, want 1 to %d", c.key, w.flushes, c.maxFlushes)
		}
	}
}
