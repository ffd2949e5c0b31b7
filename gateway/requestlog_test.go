package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// requestLines returns the "request" log lines written so far.
func (h *harness) requestLines() []map[string]any {
	var out []map[string]any
	for _, l := range strings.Split(h.logs.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "request" {
			out = append(out, m)
		}
	}
	return out
}

// waitRequestLine waits (bounded) for a request line that match accepts:
// the line is written when the handler returns, which for an aborted
// response may be just after the client saw the cut.
func (h *harness) waitRequestLine(match func(map[string]any) bool) map[string]any {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, l := range h.requestLines() {
			if match(l) {
				return l
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.t.Fatalf("no matching request log line; logs:\n%s", h.logs.String())
	return nil
}

func (h *harness) metricsText() string {
	h.t.Helper()
	return string(h.admin(http.MethodGet, "/metrics").body)
}

// An aborted response (headers sent, body cut) gets its log line and is
// counted; it used to vanish from both.
func TestAbortedRequestIsLoggedAndCounted(t *testing.T) {
	h, _ := upstreamHarness(t, func(w http.ResponseWriter, r *http.Request) {
		cutAfter(w, "application/json", "5000", `{"id":"x","choices":[{"message":{"content":"`+strings.Repeat("a", 2000))
	}, func(c *config.Config) { c.Idempotency.MaxRecordBytes = 1000 })
	res, err := h.send(context.Background(), http.MethodPost, "/v1/chat/completions", chatBody, nil)
	if err == nil {
		_, _ = io.ReadAll(res.Body)
		res.Body.Close()
	}
	l := h.waitRequestLine(func(m map[string]any) bool { return m["aborted"] == true })
	if l["path"] != "/v1/chat/completions" || l["upstream"] != "primary" || l["level"] != "WARN" {
		t.Fatalf("aborted line: %v", l)
	}
	if m := h.metricsText(); !strings.Contains(m, `llmgate_requests_total{endpoint="chat_completions",model="gpt-4o-mini",outcome="success",status="200",upstream="primary"} 1`) {
		t.Fatalf("aborted request not counted:\n%s", grepLines(m, "llmgate_requests_total"))
	}
}

// panickyStore panics inside the request path, like a bug would.
type panickyStore struct{ Store }

func (panickyStore) Claim(context.Context, cache.Key, string, time.Duration) (cache.Claim, error) {
	panic("store bug")
}

// A panicking request answers 500 with no stack trace, and gets its log
// line and count.
func TestPanickingRequestIsLoggedAndCounted(t *testing.T) {
	h := newHarnessStore(t, nil, func(s Store) Store { return panickyStore{s} }, fakeprovider.Options{})
	r := h.chat(chatBody, map[string]string{"Idempotency-Key": "k-panic"})
	e := wantOpenAIError(t, r, http.StatusInternalServerError)
	if e["code"] != "internal_error" || strings.Contains(string(r.body), "store bug") {
		t.Fatalf("panic answer: %s", r.body)
	}
	l := h.waitRequestLine(func(m map[string]any) bool { return m["status"] == float64(500) })
	if l["class"] != "gateway_error" || l["path"] != "/v1/chat/completions" {
		t.Fatalf("panic line: %v", l)
	}
	if m := h.metricsText(); !strings.Contains(m, `outcome="gateway_error",status="500",upstream="primary"} 1`) {
		t.Fatalf("panicking request not counted:\n%s", grepLines(m, "llmgate_requests_total"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
