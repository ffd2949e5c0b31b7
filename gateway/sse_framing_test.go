package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
)

// Each event reaches the client whole as soon as the upstream has sent it,
// whatever the upstream's line endings, even with a data line of exactly
// the SSE reader's buffer size; the stream ends at [DONE] though the
// upstream holds the connection open, and a keyed stream is committed as
// the events it was and replayed byte for byte.
func TestStreamFramingLineEndings(t *testing.T) {
	const bufferSize = 32 << 10
	head, foot := `data: {"choices":[{"index":0,"delta":{"content":"`, `"}}]}`
	long := head + strings.Repeat("x", bufferSize-len(head)-len(foot)) + foot
	for _, tc := range []struct{ name, nl string }{{"LF", "\n"}, {"CRLF", "\r\n"}, {"CR", "\r"}} {
		t.Run(tc.name, func(t *testing.T) {
			first := head + "hi" + foot + tc.nl + tc.nl + long + tc.nl + tc.nl
			done := "data: [DONE]" + tc.nl + tc.nl
			release := make(chan struct{})
			free := sync.OnceFunc(func() { close(release) })
			h, calls := upstreamHarness(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(200)
				_, _ = io.WriteString(w, first)
				w.(http.Flusher).Flush()
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
				_, _ = io.WriteString(w, done)
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			}, func(c *config.Config) { c.Limits.StreamIdleTimeout = config.Duration(3 * time.Second) })
			t.Cleanup(free)

			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			res, err := h.send(ctx, http.MethodPost, "/v1/chat/completions", streamBody, key("framing"))
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			// Both events, blank lines included, while the upstream waits.
			got := make([]byte, len(first))
			if n, err := io.ReadFull(res.Body, got); err != nil || string(got) != first {
				t.Fatalf("before [DONE]: %v after %d bytes; got ...%q, want ...%q", err, n, tail(got[:n]), tail([]byte(first)))
			}
			free()
			rest, err := io.ReadAll(res.Body)
			if err != nil || string(rest) != done {
				t.Fatalf("after the two events: %q, %v; want %q", rest, err, done)
			}

			again := h.chat(streamBody, key("framing"))
			if again.header.Get("Idempotent-Replayed") != "true" || string(again.body) != first+done || calls.Load() != 1 {
				t.Fatalf("replay: replayed=%q, same=%v, calls %d", again.header.Get("Idempotent-Replayed"), string(again.body) == first+done, calls.Load())
			}
			var rec struct {
				Records []struct {
					Events int `json:"events"`
				} `json:"records"`
			}
			r := h.admin(http.MethodGet, "/admin/idempotency/framing")
			if err := json.Unmarshal(r.body, &rec); err != nil || len(rec.Records) != 1 || rec.Records[0].Events != 3 {
				t.Fatalf("record: %v %s", err, r.body)
			}
		})
	}
}

func tail(b []byte) []byte {
	if len(b) > 40 {
		return b[len(b)-40:]
	}
	return b
}
