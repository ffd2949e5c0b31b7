package gateway

import (
	"strings"
	"testing"

	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// TestRetriesExhaustedOpenAI: when the gateway's retries of a transient
// provider failure run out, the client gets the provider's status and
// error.type (what the SDKs raise their error types on), error.code
// upstream_retries_exhausted where the provider's was null (the
// provider's own where it had one), a message that says how many attempts
// were made and how the last one failed, the provider's Retry-After when
// it gave one, its request id, and x-should-retry: false.
func TestRetriesExhaustedOpenAI(t *testing.T) {
	last := func(st fakeprovider.Step, n int) []fakeprovider.Step {
		steps := make([]fakeprovider.Step, n)
		for i := range steps {
			steps[i] = fakeprovider.Step{Status: st.Status, Body: st.Body, ErrType: st.ErrType, ErrCode: st.ErrCode}
		}
		steps[n-1].Header = st.Header
		return steps
	}
	for _, tc := range []struct {
		name       string
		steps      []fakeprovider.Step
		hdr        map[string]string
		body       string
		status     int
		typ, code  string
		attempts   string // in the message
		retryAfter string
		requestID  string
	}{
		{name: "503 ×3", steps: last(fakeprovider.Step{Status: 503}, 3),
			status: 503, typ: "server_error", code: "upstream_retries_exhausted", attempts: "3 attempts", retryAfter: ""},
		{name: "503 ×3, the last with Retry-After", steps: last(fakeprovider.Step{Status: 503,
			Header: map[string]string{"Retry-After": "7", "X-Request-Id": "req_503"}}, 3),
			status: 503, typ: "server_error", code: "upstream_retries_exhausted", attempts: "3 attempts", retryAfter: "7", requestID: "req_503"},
		{name: "503 ×3, streaming", steps: last(fakeprovider.Step{Status: 503}, 3), body: `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			status: 503, typ: "server_error", code: "upstream_retries_exhausted", attempts: "3 attempts"},
		{name: "503 ×3, keyed", steps: last(fakeprovider.Step{Status: 503, Header: map[string]string{"Retry-After": "4"}}, 3),
			hdr:    map[string]string{"Idempotency-Key": "exhausted-keyed-1"},
			status: 503, typ: "server_error", code: "upstream_retries_exhausted", attempts: "3 attempts", retryAfter: "4"},
		{name: "429 keeps the provider's code", steps: last(fakeprovider.Step{Status: 429, Header: map[string]string{"Retry-After": "2"}}, 3),
			status: 429, typ: "requests", code: "rate_limit_exceeded", attempts: "3 attempts", retryAfter: "2"},
		{name: "500 ×2, a provider type of its own", steps: last(fakeprovider.Step{Status: 500, ErrType: "api_error"}, 2),
			status: 500, typ: "api_error", code: "upstream_retries_exhausted", attempts: "2 attempts"},
		{name: "502 ×3 of HTML", steps: last(fakeprovider.Step{Status: 502, Body: "<html>bad gateway</html>",
			Header: map[string]string{"Content-Type": "text/html"}}, 3),
			status: 502, typ: "server_error", code: "upstream_retries_exhausted", attempts: "3 attempts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.fake.Enqueue(tc.steps...)
			body := tc.body
			if body == "" {
				body = chatBody
			}
			r := h.chat(body, tc.hdr)
			e := wantOpenAIError(t, r, tc.status)
			if e["type"] != tc.typ || e["code"] != tc.code {
				t.Errorf("type %v code %v, want %s %s: %s", e["type"], e["code"], tc.typ, tc.code, r.body)
			}
			msg, _ := e["message"].(string)
			if !strings.Contains(msg, tc.attempts) || !strings.Contains(msg, "transient") && !strings.Contains(msg, "rate_limited") && !strings.Contains(msg, "server_error") {
				t.Errorf("message does not say the attempts (%s) and the last class: %q", tc.attempts, msg)
			}
			if got := r.header.Get("Retry-After"); got != tc.retryAfter {
				t.Errorf("Retry-After %q, want %q", got, tc.retryAfter)
			}
			if got := r.header.Get("X-Should-Retry"); got != "false" {
				t.Errorf("x-should-retry %q, want false", got)
			}
			if got := r.header.Get("X-Request-Id"); tc.requestID != "" && got != tc.requestID {
				t.Errorf("X-Request-Id %q, want the provider's %q", got, tc.requestID)
			}
			if got := r.header.Get("Content-Type"); got != "application/json" {
				t.Errorf("Content-Type %q", got)
			}
			if got := r.header.Get("X-Llmgate-Upstream"); got != "primary" {
				t.Errorf("X-Llmgate-Upstream %q", got)
			}
		})
	}
}

// TestRetriesExhaustedAnthropic: on /v1/messages the same answer is in
// Anthropic's shape, with the provider's own error.type (api_error on a
// 503 stays api_error) and status (529 stays 529).
func TestRetriesExhaustedAnthropic(t *testing.T) {
	steps := func(st fakeprovider.AnthropicStep, n int, lastHeader map[string]string) []fakeprovider.AnthropicStep {
		s := make([]fakeprovider.AnthropicStep, n)
		for i := range s {
			s[i] = st
		}
		s[n-1].Header = lastHeader
		return s
	}
	for _, tc := range []struct {
		name       string
		steps      []fakeprovider.AnthropicStep
		status     int
		typ        string
		retryAfter string
		requestID  string
	}{
		{name: "529 ×3", steps: steps(fakeprovider.AnthropicStep{Status: 529}, 3, nil), status: 529, typ: "overloaded_error"},
		{name: "529 ×3, the last with retry-after", steps: steps(fakeprovider.AnthropicStep{Status: 529}, 3,
			map[string]string{"Retry-After": "9", "Request-Id": "req_ant"}), status: 529, typ: "overloaded_error", retryAfter: "9", requestID: "req_ant"},
		{name: "503 api_error ×3", steps: steps(fakeprovider.AnthropicStep{Status: 503, ErrorType: "api_error", Message: "Internal"}, 3, nil),
			status: 503, typ: "api_error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newMessagesHarness(t, nil)
			h.ant.Enqueue(tc.steps...)
			r := h.messages("/v1/messages", messagesBody, nil)
			msg := wantAnthropicError(t, r, tc.status, tc.typ)
			if !strings.Contains(msg, "3 attempts") || !strings.Contains(msg, "transient") {
				t.Errorf("message does not say the attempts and the last class: %q", msg)
			}
			if n := h.ant.Calls(); n != 3 {
				t.Errorf("upstream calls %d, want 3", n)
			}
			if got := r.header.Get("Retry-After"); got != tc.retryAfter {
				t.Errorf("Retry-After %q, want %q", got, tc.retryAfter)
			}
			if got := r.header.Get("X-Should-Retry"); got != "false" {
				t.Errorf("x-should-retry %q, want false", got)
			}
			if got := r.header.Get("Request-Id"); tc.requestID != "" && got != tc.requestID {
				t.Errorf("Request-Id %q, want the provider's %q", got, tc.requestID)
			}
		})
	}
}
