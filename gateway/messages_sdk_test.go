package gateway

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// countingTransport counts the HTTP requests a client sends.
type countingTransport struct {
	n    atomic.Int32
	next http.RoundTripper
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// sdk is the official Go SDK pointed at the gateway with the client's
// gateway key (sent as Authorization: Bearer), no retries of its own
// unless opts say otherwise, counting the HTTP calls it makes.
func (h *messagesHarness) sdk(opts ...option.RequestOption) (anthropic.Client, *countingTransport) {
	ct := &countingTransport{next: http.DefaultTransport}
	return anthropic.NewClient(append([]option.RequestOption{
		option.WithBaseURL(h.srv.URL), option.WithAPIKey(gwClientKey),
		option.WithHTTPClient(&http.Client{Transport: ct, Timeout: requestLimit}), option.WithMaxRetries(0),
	}, opts...)...), ct
}

var sdkMessage = anthropic.MessageNewParams{
	Model: "claude-sonnet-4-5", MaxTokens: 64,
	Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Hello"))},
}

// accumulate reads a stream with the SDK's accumulator.
func accumulate(t *testing.T, c anthropic.Client, opts ...option.RequestOption) (anthropic.Message, error) {
	t.Helper()
	stream := c.Messages.NewStreaming(context.Background(), sdkMessage, opts...)
	defer stream.Close()
	var msg anthropic.Message
	for stream.Next() {
		if err := msg.Accumulate(stream.Current()); err != nil {
			t.Fatalf("accumulate: %v", err)
		}
	}
	return msg, stream.Err()
}

// TestMessagesSDK: the official Go SDK's messages.New and NewStreaming
// (with its accumulator) get the provider's answer through the gateway,
// usage and cache tokens included; the provider saw its own key as
// x-api-key.
func TestMessagesSDK(t *testing.T) {
	h := newMessagesHarness(t, nil)
	c, _ := h.sdk()
	msg, err := c.Messages.New(context.Background(), sdkMessage)
	if err != nil {
		t.Fatal(err)
	}
	if len(msg.Content) != 1 || msg.Content[0].Text != "Hello from the fake Anthropic provider." || msg.StopReason != "end_turn" {
		t.Errorf("message: %+v", msg)
	}
	if u := msg.Usage; u.InputTokens != 12 || u.OutputTokens != 7 || u.CacheCreationInputTokens != 3 || u.CacheReadInputTokens != 5 {
		t.Errorf("usage: %+v", u)
	}
	sm, err := accumulate(t, c)
	if err != nil {
		t.Fatal(err)
	}
	if len(sm.Content) != 1 || sm.Content[0].Text != "Hello from the fake Anthropic provider." || sm.StopReason != "end_turn" {
		t.Errorf("streamed message: %+v", sm)
	}
	for _, r := range h.ant.Requests() {
		if r.Header.Get("X-Api-Key") != anthropicKey || r.Header.Get("Authorization") != "" {
			t.Errorf("provider saw x-api-key %q, Authorization %q", r.Header.Get("X-Api-Key"), r.Header.Get("Authorization"))
		}
	}
}

// TestMessagesSDKBeta: the SDK's beta messages with anthropic-beta, posted
// to /v1/messages?beta=true as Claude Code posts them: the query and the
// header reach the provider.
func TestMessagesSDKBeta(t *testing.T) {
	h := newMessagesHarness(t, nil)
	c, _ := h.sdk(option.WithQuery("beta", "true"))
	_, err := c.Beta.Messages.New(context.Background(), anthropic.BetaMessageNewParams{
		Model: "claude-sonnet-4-5", MaxTokens: 64, Betas: []anthropic.AnthropicBeta{"interleaved-thinking-2025-05-14"},
		Messages: []anthropic.BetaMessageParam{anthropic.NewBetaUserMessage(anthropic.NewBetaTextBlock("Hello"))},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := h.ant.Requests()[0]
	if r.RawQuery != "beta=true" || r.Header.Get("Anthropic-Beta") != "interleaved-thinking-2025-05-14" {
		t.Errorf("provider saw ?%s and anthropic-beta %q", r.RawQuery, r.Header.Get("Anthropic-Beta"))
	}
}

// TestMessagesRetries: an overloaded provider (529) is retried and the
// client gets one answer; a 429 with retry-after: 1 is retried after a
// second at least.
func TestMessagesRetries(t *testing.T) {
	t.Run("529 then an answer", func(t *testing.T) {
		h := newMessagesHarness(t, nil)
		h.ant.Enqueue(fakeprovider.AnthropicStep{Status: 529, ErrorType: "overloaded_error"})
		c, ct := h.sdk()
		msg, err := c.Messages.New(context.Background(), sdkMessage)
		if err != nil {
			t.Fatal(err)
		}
		if msg.Content[0].Text != "Hello from the fake Anthropic provider." {
			t.Errorf("answer: %+v", msg)
		}
		if up, calls := h.ant.Calls(), ct.n.Load(); up != 2 || calls != 1 {
			t.Errorf("upstream calls %d (want 2), SDK calls %d (want 1)", up, calls)
		}
	})
	t.Run("429 with retry-after", func(t *testing.T) {
		h := newMessagesHarness(t, nil)
		h.ant.Enqueue(fakeprovider.AnthropicStep{Status: 429, ErrorType: "rate_limit_error", Message: "Number of requests has exceeded your rate limit",
			Header: map[string]string{"Retry-After": "1"}})
		c, _ := h.sdk()
		if _, err := c.Messages.New(context.Background(), sdkMessage); err != nil {
			t.Fatal(err)
		}
		reqs := h.ant.Requests()
		if len(reqs) != 2 {
			t.Fatalf("upstream calls %d, want 2", len(reqs))
		}
		if gap := reqs[1].At.Sub(reqs[0].At); gap < 900*time.Millisecond {
			t.Errorf("retried after %v, before retry-after's second", gap)
		}
	})
}

// TestMessagesSDKRetriesNotMultiplied: when the gateway's own retries
// end in a failure, it says x-should-retry: false, so an SDK left at its
// default retries makes one HTTP call, not three times the gateway's.
func TestMessagesSDKRetriesNotMultiplied(t *testing.T) {
	h := newMessagesHarness(t, nil)
	for range 3 {
		h.ant.Enqueue(fakeprovider.AnthropicStep{Status: 529, ErrorType: "overloaded_error"})
	}
	c, ct := h.sdk(option.WithMaxRetries(2))
	_, err := c.Messages.New(context.Background(), sdkMessage)
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != 529 || ae.Type() != "overloaded_error" {
		t.Fatalf("err = %v, want the SDK's overloaded_error", err)
	}
	if up, calls := h.ant.Calls(), ct.n.Load(); up != 3 || calls != 1 {
		t.Errorf("upstream calls %d (want the gateway's 3), SDK calls %d (want 1)", up, calls)
	}
}

// TestMessagesNotRetried: a refusal and an empty message are the model's
// answer, not a failure: one call, relayed, named in X-Llmgate-Outcome.
func TestMessagesNotRetried(t *testing.T) {
	for _, tc := range []struct{ name, body, outcome string }{
		{"refusal", fakeprovider.AnthropicMessage("claude-sonnet-4-5", "I can't help with that.", "refusal"), "content_filter"},
		{"empty", fakeprovider.AnthropicMessage("claude-sonnet-4-5", "", "end_turn"), "empty_output"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newMessagesHarness(t, nil)
			h.ant.Enqueue(fakeprovider.AnthropicStep{Body: tc.body})
			r := h.messages("/v1/messages", messagesBody, nil)
			if r.status != 200 || string(r.body) != tc.body {
				t.Fatalf("%d %s", r.status, r.body)
			}
			if got := r.header.Get("X-Llmgate-Outcome"); got != tc.outcome {
				t.Errorf("X-Llmgate-Outcome = %q, want %q", got, tc.outcome)
			}
			if n := h.ant.Calls(); n != 1 {
				t.Errorf("upstream calls %d, want 1", n)
			}
		})
	}
}

// wire is a stream's events as they go on the wire.
func wire(events []string) string { return strings.Join(events, "\n\n") + "\n\n" }

// TestMessagesStreamRelayedByteForByte: a stream with a thinking block
// (thinking and signature deltas), text and a tool_use block (input_json
// deltas) reaches the client byte for byte, keyed or not, and the SDK's
// accumulator rebuilds every block from it.
func TestMessagesStreamRelayedByteForByte(t *testing.T) {
	h := newMessagesHarness(t, nil)
	events := fakeprovider.AnthropicThinkingToolStream("claude-sonnet-4-5")
	for _, hdr := range []map[string]string{nil, {"Idempotency-Key": "msg-thinking"}} {
		h.ant.Enqueue(fakeprovider.AnthropicStep{Events: events})
		r := h.messages("/v1/messages", messagesStreamBody, hdr)
		if r.status != 200 || string(r.body) != wire(events) {
			t.Errorf("keyed=%v: %d, stream changed on its way:\n%s", hdr != nil, r.status, r.body)
		}
	}
	h.ant.Enqueue(fakeprovider.AnthropicStep{Events: events})
	c, _ := h.sdk()
	msg, err := accumulate(t, c)
	if err != nil {
		t.Fatal(err)
	}
	if len(msg.Content) != 3 || msg.Content[0].Type != "thinking" || msg.Content[0].Signature == "" ||
		msg.Content[1].Text != "I'll check the weather." || msg.Content[2].Type != "tool_use" ||
		string(msg.Content[2].Input) != `{"location": "San Francisco, CA"}` || msg.StopReason != "tool_use" {
		t.Errorf("accumulated: %+v", msg.Content)
	}
}

// TestMessagesStreamFailures: a stream that fails after its first deltas
// reached the client ends with exactly one error event in Anthropic's
// shape — the provider's own, or the gateway's for a cut — which the SDK
// raises; it is not committed, and the key's retry runs again.
func TestMessagesStreamFailures(t *testing.T) {
	cut := append(fakeprovider.AnthropicStart("claude-sonnet-4-5"), fakeprovider.AnthropicTextDelta("Hello"), fakeprovider.AnthropicTextDelta("! How can"))
	for _, tc := range []struct {
		name    string
		step    fakeprovider.AnthropicStep
		errType string
	}{
		{"error event after two deltas", fakeprovider.AnthropicStep{Events: fakeprovider.AnthropicErrorAfterTwoDeltas("claude-sonnet-4-5")}, "overloaded_error"},
		{"cut", fakeprovider.AnthropicStep{Events: cut, Cut: true}, "api_error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newMessagesHarness(t, nil)
			h.ant.Enqueue(tc.step)
			hdr := map[string]string{"Idempotency-Key": "msg-fail"}
			r := h.messages("/v1/messages", messagesStreamBody, hdr)
			body := string(r.body)
			if r.status != 200 || !strings.Contains(body, `"text":"! How can"`) {
				t.Fatalf("%d %s", r.status, body)
			}
			if n := strings.Count(body, "event: error\n"); n != 1 {
				t.Fatalf("%d error events, want 1:\n%s", n, body)
			}
			ev := body[strings.Index(body, "event: error\n"):]
			if !strings.HasSuffix(body, "\n\n") || strings.Count(ev, "\n\n") != 1 ||
				!strings.Contains(ev, `data: {"type":"error","error":{"type":"`+tc.errType+`"`) {
				t.Errorf("stream does not end with the error event:\n%s", ev)
			}
			if strings.Contains(body, "message_stop") {
				t.Errorf("a failed stream ended cleanly:\n%s", body)
			}
			again := h.messages("/v1/messages", messagesStreamBody, hdr)
			if again.status != 200 || again.header.Get("Idempotent-Replayed") != "" || !strings.Contains(string(again.body), "event: message_stop") {
				t.Fatalf("retry: %d replayed=%q %s", again.status, again.header.Get("Idempotent-Replayed"), again.body)
			}
			if n := h.ant.Calls(); n != 2 {
				t.Errorf("upstream calls %d, want 2", n)
			}
			// The SDK raises on it.
			h.ant.Enqueue(tc.step)
			c, _ := h.sdk()
			_, err := accumulate(t, c)
			if err == nil {
				t.Error("the SDK took a failed stream as complete")
			}
		})
	}
}
