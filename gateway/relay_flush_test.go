package gateway

import (
	"bufio"
	"fmt"
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
