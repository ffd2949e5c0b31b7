package gateway

import (
	"net/http"
	"testing"
)

// TestAnthropicHeadersOnlyToAnthropic: anthropic-version and
// anthropic-beta reach an Anthropic upstream as the client sent them,
// and never an OpenAI one (chat, embeddings), where they mean nothing
// and would tell the provider what else the client runs.
func TestAnthropicHeadersOnlyToAnthropic(t *testing.T) {
	h := newMessagesHarness(t, nil)
	hdr := map[string]string{"Authorization": "Bearer " + gwClientKey, "Anthropic-Version": "2023-06-01", "Anthropic-Beta": "files-api-2025-04-14"}
	if r := h.chat(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hi"}]}`, hdr); r.status != http.StatusOK {
		t.Fatalf("chat: %d %s", r.status, r.body)
	}
	if r := h.do(http.MethodPost, "/v1/embeddings", `{"model":"gpt-4o-mini","input":"hi"}`, hdr); r.status != http.StatusOK {
		t.Fatalf("embeddings: %d %s", r.status, r.body)
	}
	if r := h.messages("/v1/messages", messagesBody, map[string]string{"Anthropic-Beta": "files-api-2025-04-14"}); r.status != http.StatusOK {
		t.Fatalf("messages: %d %s", r.status, r.body)
	}
	reqs := h.fake.Requests()
	if len(reqs) != 2 {
		t.Fatalf("the OpenAI upstream saw %d requests, want 2", len(reqs))
	}
	for _, rq := range reqs {
		for _, k := range []string{"Anthropic-Version", "Anthropic-Beta"} {
			if v := rq.Header.Get(k); v != "" {
				t.Errorf("the OpenAI upstream saw %s: %s on %s", k, v, rq.Path)
			}
		}
	}
	up := h.ant.Requests()[0]
	if up.Header.Get("Anthropic-Version") != "2023-06-01" || up.Header.Get("Anthropic-Beta") != "files-api-2025-04-14" {
		t.Errorf("the Anthropic upstream saw version %q beta %q", up.Header.Get("Anthropic-Version"), up.Header.Get("Anthropic-Beta"))
	}
}
