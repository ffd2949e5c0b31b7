package gateway

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
)

// blockingClient is a client whose write of the event containing block
// stalls until unblock is closed or wait has passed (a client that stops
// reading for a while).
type blockingClient struct {
	*httptest.ResponseRecorder
	block   string
	unblock <-chan struct{}
	wait    time.Duration
	once    sync.Once
	// taken is closed once the stalled write has gone through.
	taken chan struct{}
}

func (b *blockingClient) Write(p []byte) (int, error) {
	if strings.Contains(string(p), b.block) {
		b.once.Do(func() {
			select {
			case <-b.unblock:
			case <-time.After(b.wait):
			}
			close(b.taken)
		})
	}
	return b.ResponseRecorder.Write(p)
}

// TestRelaySlowClientIsNotAnAttemptTimeout: once the stream is being
// relayed, time spent writing to a slow client is not the upstream's: the
// attempt's timeout (upstreams[].timeout, which bounds the wait for the
// first event) must not go on running while events the upstream already
// sent are written. The upstream sends two events in one write and waits;
// the client stalls on the second for longer than the attempt's timeout.
// The attempt timer firing would cancel the upstream call (seen by the
// upstream as its request's context ending, which also lets the client go
// on at once) and end the stream as stalled.
func TestRelaySlowClientIsNotAnAttemptTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	chunk := func(delta, finish string) string {
		return fmt.Sprintf(`data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`+"\n\n", delta, finish)
	}
	head := chunk(`{"role":"assistant","content":""}`, "null") + chunk(`{"content":"first"}`, "null")
	tail := chunk(`{}`, `"stop"`) + "data: [DONE]\n\n"
	cancelled, taken := make(chan struct{}), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, head) // one write: both events arrive in one read
		w.(http.Flusher).Flush()
		select {
		case <-taken: // the client has taken the second event
		case <-r.Context().Done():
			close(cancelled)
			return
		}
		fmt.Fprint(w, tail)
	}))
	defer up.Close()
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = up.URL + "/v1"
		c.Upstreams[0].Timeout = config.Duration(timeout)
	})
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(streamBody))
	req.Header.Set("Content-Type", "application/json")
	w := &blockingClient{ResponseRecorder: httptest.NewRecorder(), block: `"content":"first"`, unblock: cancelled,
		wait: 4 * timeout, taken: taken}
	h.gw.Handler().ServeHTTP(w, req)
	if got := w.Body.String(); got != head+tail {
		select {
		case <-cancelled:
			t.Errorf("the upstream call was cancelled while the client was slow")
		default:
		}
		t.Fatalf("client got:\n%s\nwant the upstream's stream whole", got)
	}
}
