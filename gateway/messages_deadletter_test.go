package gateway

import (
	"net/http"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// A keyed Messages request's anthropic-version and anthropic-beta (and
// its query) are part of what its key stands for: its dead letter keeps
// them and the operator's replay sends them, so the answer committed
// under the key is the one the client's retry asked for, replayed to it
// (not a 422 for a different request), and the provider saw them on the
// replay.
func TestMessagesDeadLetterReplayKeepsHeaders(t *testing.T) {
	h := newMessagesHarness(t, func(c *config.Config) { c.Retry.MaxAttempts = 1 })
	h.ant.Enqueue(fakeprovider.AnthropicStep{Status: 529, ErrorType: "overloaded_error"})
	hdr := map[string]string{"Idempotency-Key": "msg-dlq", "Anthropic-Beta": "interleaved-thinking-2025-05-14"}
	if r := h.messages("/v1/messages?beta=true", messagesBody, hdr); r.status != 529 {
		t.Fatalf("failing request: %d %s", r.status, r.body)
	}
	l := listDLQ(t, h.harness, "")
	if l.Total != 1 {
		t.Fatalf("letters: %+v", l)
	}
	r := h.admin(http.MethodPost, "/admin/deadletters/"+l.DeadLetters[0].ID+"/replay")
	if r.status != http.StatusOK || !strings.Contains(string(r.body), `"status":200`) {
		t.Fatalf("replay: %d %s", r.status, r.body)
	}
	reqs := h.ant.Requests()
	last := reqs[len(reqs)-1]
	if last.RawQuery != "beta=true" || last.Header.Get("Anthropic-Beta") != "interleaved-thinking-2025-05-14" ||
		last.Header.Get("Anthropic-Version") != "2023-06-01" {
		t.Errorf("replay sent ?%s, anthropic-beta %q, anthropic-version %q", last.RawQuery,
			last.Header.Get("Anthropic-Beta"), last.Header.Get("Anthropic-Version"))
	}
	again := h.messages("/v1/messages?beta=true", messagesBody, hdr)
	if again.status != http.StatusOK || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("client retry: %d %s, want the replayed answer", again.status, again.body)
	}
	if n := h.ant.Calls(); n != len(reqs) {
		t.Error("client retry called upstream")
	}
}
