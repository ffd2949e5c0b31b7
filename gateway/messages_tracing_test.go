package gateway

import (
	"net/http"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// A Messages request's spans carry the GenAI attributes in Anthropic's
// terms: gen_ai.provider.name anthropic, operation chat, the model that
// answered, its stop_reason as the finish reason, and the usage —
// message_start's input count and the last message_delta's output count
// for a stream.
func TestTracesMessages(t *testing.T) {
	ant := fakeprovider.NewAnthropic()
	url := newTestServer(t, ant)
	th := newTracedHarness(t, func(c *config.Config) {
		c.Upstreams = append(c.Upstreams, config.Upstream{Name: "anthropic", BaseURL: url, APIKey: anthropicKey,
			API: config.APIAnthropic, Models: []string{"claude-*"}, Timeout: config.Duration(5 * time.Second)})
	})
	for id, body := range map[string]string{"req-msg-json": messagesBody, "req-msg-stream": messagesStreamBody} {
		if r := th.post("/v1/messages", body, id, nil); r.status != http.StatusOK {
			t.Fatalf("%s: %d %s", id, r.status, r.body)
		}
	}
	spans := th.spans()
	assertNoSecrets(t, spans, anthropicKey)
	for id, out := range map[string]int{"req-msg-json": 7, "req-msg-stream": 9} {
		s := requestSpan(t, spans, id)
		want := map[string]any{"gen_ai.operation.name": "chat", "gen_ai.provider.name": "anthropic",
			"gen_ai.request.model": "claude-sonnet-4-5", "gen_ai.response.model": "claude-sonnet-4-5",
			"gen_ai.response.id": "msg_fake01", "gen_ai.response.finish_reasons": []any{"end_turn"},
			"gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": out,
			"llmgate.upstream": "anthropic", "http.route": "/v1/messages"}
		wantAttrs(t, s, want)
		att := children(spans, s)
		if len(att) != 1 || att[0].Name != "chat claude-sonnet-4-5" {
			t.Fatalf("%s: attempt spans %+v", id, att)
		}
		delete(want, "http.route") // the request's
		wantAttrs(t, att[0], want)
	}
}
