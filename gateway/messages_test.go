package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

const (
	anthropicKey = "sk-ant-upstream-secret-0123456789"
	gwClientKey  = "sk-gw-client-secret-abcdef"
)

// messagesHarness is a gateway in front of two upstreams: "primary"
// (OpenAI's API, gpt-* models, the harness's fake) and "anthropic"
// (Anthropic's API, claude-* models, an Anthropic fake recording what it
// saw), with one client whose key is gwClientKey.
type messagesHarness struct {
	*harness
	ant *fakeprovider.Anthropic
}

func newMessagesHarness(t *testing.T, mutate func(c *config.Config)) *messagesHarness {
	t.Helper()
	return newMessagesHarnessStore(t, mutate, nil)
}

// newMessagesHarnessStore is newMessagesHarness with the store wrapped by
// wrap (fault injection).
func newMessagesHarnessStore(t *testing.T, mutate func(c *config.Config), wrap func(Store) Store) *messagesHarness {
	t.Helper()
	ant := fakeprovider.NewAnthropic()
	url := newTestServer(t, ant)
	h := newHarnessStore(t, func(c *config.Config) {
		c.Upstreams[0].Models = []string{"gpt-*"}
		c.Upstreams = append(c.Upstreams, config.Upstream{Name: "anthropic", BaseURL: url, APIKey: anthropicKey,
			API: config.APIAnthropic, Models: []string{"claude-*"}, Timeout: config.Duration(5 * time.Second)})
		c.Clients = []config.Client{{Name: "team", Key: gwClientKey}}
		if mutate != nil {
			mutate(c)
		}
	}, wrap, fakeprovider.Options{})
	return &messagesHarness{harness: h, ant: ant}
}

// messages posts body to path (/v1/messages...) with the client's key.
func (h *messagesHarness) messages(path, body string, hdr map[string]string) result {
	h.t.Helper()
	all := map[string]string{"Authorization": "Bearer " + gwClientKey, "Anthropic-Version": "2023-06-01"}
	for k, v := range hdr {
		all[k] = v
	}
	return h.do(http.MethodPost, path, body, all)
}

const messagesBody = `{"model":"claude-sonnet-4-5","max_tokens":256,"messages":[{"role":"user","content":"Hello"}]}`

// TestMessagesRoute: POST /v1/messages reaches the Anthropic upstream at
// base_url + /v1/messages with the client's query, its body byte for
// byte (unknown fields, temperature 0, thinking, cache_control as sent),
// anthropic-version and anthropic-beta as the client sent them, and the
// upstream's own key as x-api-key — never the client's gateway key; the
// answer comes back byte for byte.
func TestMessagesRoute(t *testing.T) {
	h := newMessagesHarness(t, nil)
	body := `{"model":"claude-sonnet-4-5","max_tokens":1024,"temperature":0,"x_unknown":{"a":[1,2.50]},` +
		`"thinking":{"type":"enabled","budget_tokens":512},` +
		`"system":[{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}],` +
		`"messages":[{"role":"user","content":"Hello"}]}`
	r := h.messages("/v1/messages?beta=true", body, map[string]string{
		"X-Api-Key": gwClientKey, "Anthropic-Version": "2026-10-21", "Anthropic-Beta": "interleaved-thinking-2025-05-14",
	})
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if want := fakeprovider.AnthropicMessage("claude-sonnet-4-5", "Hello from the fake Anthropic provider.", "end_turn"); string(r.body) != want {
		t.Errorf("answer not relayed byte for byte:\n got %s\nwant %s", r.body, want)
	}
	reqs := h.ant.Requests()
	if len(reqs) != 1 {
		t.Fatalf("upstream saw %d requests, want 1", len(reqs))
	}
	up := reqs[0]
	if up.Path != "/v1/messages" || up.RawQuery != "beta=true" {
		t.Errorf("upstream saw %s?%s, want /v1/messages?beta=true", up.Path, up.RawQuery)
	}
	if !bytes.Equal(up.Body, []byte(body)) {
		t.Errorf("body changed on its way:\n got %s\nwant %s", up.Body, body)
	}
	if got := up.Header.Get("X-Api-Key"); got != anthropicKey {
		t.Errorf("upstream x-api-key = %q, want the upstream's own key", got)
	}
	if got := up.Header.Get("Authorization"); got != "" {
		t.Errorf("upstream saw Authorization %q", got)
	}
	for k, vs := range up.Header {
		for _, v := range vs {
			if strings.Contains(v, gwClientKey) {
				t.Errorf("the client's gateway key reached the provider in %s", k)
			}
		}
	}
	if got := up.Header.Get("Anthropic-Version"); got != "2026-10-21" {
		t.Errorf("anthropic-version = %q, want the client's", got)
	}
	if got := up.Header.Get("Anthropic-Beta"); got != "interleaved-thinking-2025-05-14" {
		t.Errorf("anthropic-beta = %q, want the client's", got)
	}
}

// TestMessagesDefaultVersion: a client that sends no anthropic-version
// gets the upstream's anthropic_version.
func TestMessagesDefaultVersion(t *testing.T) {
	h := newMessagesHarness(t, nil)
	r := h.do(http.MethodPost, "/v1/messages", messagesBody, map[string]string{"Authorization": "Bearer " + gwClientKey})
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if got := h.ant.Requests()[0].Header.Get("Anthropic-Version"); got != config.DefaultAnthropicVersion {
		t.Errorf("anthropic-version = %q, want %q", got, config.DefaultAnthropicVersion)
	}
}

// TestCountTokens: /v1/messages/count_tokens is passed to the Anthropic
// upstream, unkeyed: nothing is committed, a second call goes upstream.
func TestCountTokens(t *testing.T) {
	h := newMessagesHarness(t, nil)
	for i := range 2 {
		r := h.messages("/v1/messages/count_tokens", `{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"Hello"}]}`, nil)
		if r.status != http.StatusOK || string(r.body) != `{"input_tokens":12}` {
			t.Fatalf("call %d: %d %s", i, r.status, r.body)
		}
	}
	if n := h.ant.Calls(); n != 2 {
		t.Errorf("upstream calls = %d, want 2", n)
	}
	if p := h.ant.Requests()[0].Path; p != "/v1/messages/count_tokens" {
		t.Errorf("upstream path %q", p)
	}
}

// TestMessagesRouteByAPI: an endpoint routes only to upstreams of its own
// API. A claude model, served only by the Anthropic upstream, asked for on
// /v1/chat/completions is a 404 that names the API to use, and a gpt model
// on /v1/messages likewise; neither reaches an upstream.
func TestMessagesRouteByAPI(t *testing.T) {
	h := newMessagesHarness(t, nil)
	chat := h.do(http.MethodPost, "/v1/chat/completions", `{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"Hi"}]}`,
		map[string]string{"Authorization": "Bearer " + gwClientKey})
	e := wantOpenAIError(t, chat, http.StatusNotFound)
	if msg, _ := e["message"].(string); !strings.Contains(msg, "anthropic API") || !strings.Contains(msg, "does not translate") {
		t.Errorf("404 does not say which API serves the model: %s", msg)
	}
	msgs := h.messages("/v1/messages", `{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user","content":"Hi"}]}`, nil)
	if msgs.status != http.StatusNotFound || !strings.Contains(string(msgs.body), "openai API") {
		t.Errorf("gpt model on /v1/messages: %d %s", msgs.status, msgs.body)
	}
	if n := h.ant.Calls() + h.fake.Calls(""); n != 0 {
		t.Errorf("%d upstream calls, want none", n)
	}
}

// wantAnthropicError checks r is Anthropic's error body — exactly
// {"type":"error","error":{"type":...,"message":...}} — with the status
// and error type, and returns its message.
func wantAnthropicError(t *testing.T, r result, status int, typ string) string {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d; body %s", r.status, status, r.body)
	}
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := dec.Decode(&e); err != nil || e.Type != "error" || e.Error.Message == "" {
		t.Fatalf("not Anthropic's error shape (%v): %s", err, r.body)
	}
	if e.Error.Type != typ {
		t.Errorf("error.type = %q, want %q: %s", e.Error.Type, typ, r.body)
	}
	return e.Error.Message
}

const gwSlowKey = "sk-gw-slow-client-secret-123456"

// TestMessagesErrorsInAnthropicShape: every error the gateway itself
// makes on /v1/messages is Anthropic's error body with the status and
// Anthropic error type of that status, and x-should-retry and
// Retry-After as the OpenAI route has them.
func TestMessagesErrorsInAnthropicShape(t *testing.T) {
	var fs *faultyStore
	h := newMessagesHarnessStore(t, func(c *config.Config) {
		c.Limits.MaxBodyBytes = 4096
		c.Clients = append(c.Clients, config.Client{Name: "slow", Key: gwSlowKey,
			Limits: config.ClientLimits{RequestsPerSecond: 0.001, Burst: 1}})
	}, func(s Store) Store { fs = &faultyStore{Store: s}; return fs })
	for _, tc := range []struct {
		name        string
		setup       func()
		send        func() result
		status      int
		typ         string
		shouldRetry string
		retryAfter  bool
	}{
		{name: "bad JSON", send: func() result { return h.messages("/v1/messages", `{"model":`, nil) },
			status: 400, typ: "invalid_request_error", shouldRetry: "false"},
		{name: "no key", send: func() result { return h.do(http.MethodPost, "/v1/messages", messagesBody, nil) },
			status: 401, typ: "authentication_error", shouldRetry: "false"},
		{name: "model not served", send: func() result {
			return h.messages("/v1/messages", `{"model":"gpt-4o","max_tokens":5,"messages":[]}`, nil)
		}, status: 404, typ: "not_found_error", shouldRetry: "false"},
		{name: "body too large", send: func() result {
			return h.messages("/v1/messages", `{"model":"claude-x","max_tokens":5,"messages":[{"role":"user","content":"`+strings.Repeat("a", 5000)+`"}]}`, nil)
		}, status: 413, typ: "request_too_large", shouldRetry: "false"},
		{name: "key reused", setup: func() {
			if r := h.messages("/v1/messages", messagesBody, key("err-reused")); r.status != 200 {
				t.Fatalf("first call: %d %s", r.status, r.body)
			}
		}, send: func() result {
			return h.messages("/v1/messages", `{"model":"claude-sonnet-4-5","max_tokens":9,"messages":[]}`, key("err-reused"))
		}, status: 422, typ: "invalid_request_error", shouldRetry: "false"},
		{name: "client rate limit", setup: func() {
			h.do(http.MethodPost, "/v1/messages", messagesBody, map[string]string{"Authorization": "Bearer " + gwSlowKey})
		}, send: func() result {
			return h.do(http.MethodPost, "/v1/messages", messagesBody, map[string]string{"Authorization": "Bearer " + gwSlowKey})
		}, status: 429, typ: "rate_limit_error", shouldRetry: "true", retryAfter: true},
		{name: "upstream refused the gateway's key", setup: func() {
			h.ant.Enqueue(fakeprovider.AnthropicStep{Status: 401, ErrorType: "authentication_error", Message: "invalid x-api-key"})
		}, send: func() result { return h.messages("/v1/messages", messagesBody, nil) },
			status: 502, typ: "api_error", shouldRetry: "false"},
		{name: "store unavailable", setup: func() { fs.failClaim.Store(true) }, send: func() result {
			defer fs.failClaim.Store(false)
			return h.messages("/v1/messages", messagesBody, key("err-store"))
		}, status: 503, typ: "overloaded_error", shouldRetry: "false", retryAfter: true},
		{name: "deadline spent", send: func() result {
			return h.messages("/v1/messages", messagesBody, map[string]string{"X-Llmgate-Deadline": "1ns"})
		}, status: 504, typ: "timeout_error"},
		{name: "breaker open", setup: func() {
			if r := h.admin(http.MethodPost, "/admin/breakers/anthropic/open"); r.status != 200 {
				t.Fatalf("force open: %d %s", r.status, r.body)
			}
		}, send: func() result { return h.messages("/v1/messages", messagesBody, nil) },
			status: 503, typ: "overloaded_error", shouldRetry: "false", retryAfter: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup()
			}
			r := tc.send()
			wantAnthropicError(t, r, tc.status, tc.typ)
			if tc.shouldRetry != "" {
				if got := r.header.Get("X-Should-Retry"); got != tc.shouldRetry {
					t.Errorf("x-should-retry = %q, want %q", got, tc.shouldRetry)
				}
			}
			if got := r.header.Get("Retry-After") != ""; got != tc.retryAfter {
				t.Errorf("Retry-After %q, want one: %v", r.header.Get("Retry-After"), tc.retryAfter)
			}
		})
	}
	// The OpenAI routes keep OpenAI's shape.
	wantOpenAIError(t, h.chat(`{"model":`, map[string]string{"Authorization": "Bearer " + gwClientKey}), 400)
}

// TestAnthropicUpstreamOffOpenAIPaths: an Anthropic upstream takes no part
// in OpenAI's surface — GET /v1/models lists the OpenAI upstreams' models
// without asking it, and a passthrough path goes to the first OpenAI
// upstream even when the Anthropic one is listed first.
func TestAnthropicUpstreamOffOpenAIPaths(t *testing.T) {
	h := newMessagesHarness(t, func(c *config.Config) {
		c.Upstreams[0], c.Upstreams[1] = c.Upstreams[1], c.Upstreams[0]
	})
	auth := map[string]string{"Authorization": "Bearer " + gwClientKey}
	models := h.do(http.MethodGet, "/v1/models", "", auth)
	if models.status != 200 || !strings.Contains(string(models.body), `"gpt-4o-mini"`) {
		t.Fatalf("models: %d %s", models.status, models.body)
	}
	h.do(http.MethodPost, "/v1/moderations", `{"input":"hi"}`, auth)
	if n := h.fake.Calls("/v1/moderations"); n != 1 {
		t.Errorf("the OpenAI upstream saw %d passthrough calls, want 1", n)
	}
	if n := h.ant.Calls(); n != 0 {
		t.Errorf("the Anthropic upstream was called %d times: %+v", n, h.ant.Requests())
	}
}

// TestMessagesClientKeyInXAPIKey: a client that sends its gateway key as
// x-api-key (Claude Code's ANTHROPIC_API_KEY, curl examples) is
// authenticated by it, and the provider sees the upstream's own key in
// that header, never the client's; ambiguous credentials are a 400 in
// Anthropic's shape.
func TestMessagesClientKeyInXAPIKey(t *testing.T) {
	h := newMessagesHarness(t, nil)
	r := h.do(http.MethodPost, "/v1/messages?beta=true", messagesBody, map[string]string{"X-Api-Key": gwClientKey, "Anthropic-Version": "2023-06-01"})
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	up := h.ant.Requests()[0]
	if got := up.Header.Get("X-Api-Key"); got != anthropicKey {
		t.Errorf("provider saw x-api-key %q, want the upstream's key", got)
	}
	bad := h.do(http.MethodPost, "/v1/messages", messagesBody, map[string]string{"X-Api-Key": gwClientKey, "Authorization": "Bearer " + gwSlowKey})
	wantAnthropicError(t, bad, http.StatusBadRequest, "invalid_request_error")
	if n := h.ant.Calls(); n != 1 {
		t.Errorf("upstream calls %d, want 1", n)
	}
}
