package gateway

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
)

// TestStreamIdleTimeoutBoundsATricklingEvent: limits.stream_idle_timeout
// bounds how long the gateway waits for the next event, not for the next
// byte. An upstream that trickles one event a byte at a time, each byte
// well within the idle limit but the event as a whole far past it (a
// stuck upstream sending keep-alive bytes that never make an event, a
// proxy dribbling a response), must have its stream ended as stalled.
// Since the idle timer was moved around each read of the upstream
// (upstreamReads), every byte reset it, and nothing but the retry
// deadline bounded such a stream.
func TestStreamIdleTimeoutBoundsATricklingEvent(t *testing.T) {
	const idle = 200 * time.Millisecond
	first := `data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"role":"assistant","content":"first"},"finish_reason":null}]}` + "\n\n"
	trickled := `data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"second"},"finish_reason":null}]}` + "\n\n"
	end := `data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n"
	cancelled := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		fmt.Fprint(w, first)
		fl.Flush()
		// One byte every idle/4: the event takes ~40 × idle to arrive.
		tick := time.NewTicker(idle / 4)
		defer tick.Stop()
		for i := range len(trickled) {
			select {
			case <-tick.C:
			case <-r.Context().Done():
				close(cancelled)
				return
			}
			fmt.Fprint(w, trickled[i:i+1])
			fl.Flush()
		}
		fmt.Fprint(w, end)
	}))
	defer up.Close()
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = up.URL + "/v1"
		c.Limits.StreamIdleTimeout = config.Duration(idle)
	})
	r := h.chat(streamBody, nil)
	if !strings.Contains(string(r.body), "stalled") {
		t.Fatalf("a stream whose event trickled in for ~40 × stream_idle_timeout was not ended as stalled; the client got:\n%s", r.body)
	}
	if strings.Contains(string(r.body), `"content":"second"`) {
		t.Fatalf("the trickled event was relayed: %s", r.body)
	}
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream's request was not cancelled after the stream was ended as stalled")
	}
}
