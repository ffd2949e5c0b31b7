package gateway

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// Issue 13, item 4: a provider's 401 is the operator's problem. The tenant
// gets llmgate's own 502 (never the provider's message, which describes the
// provider key); the operator gets an ERROR line, a metric, and a breaker
// that counts a 401 (the fallback takes over) but not a 403.
func TestUpstreamAuthFailureIsTheOperators(t *testing.T) {
	const leak = "Incorrect API key provided: sk-***...-123"
	h := newHarness(t, func(c *config.Config) { c.Breaker.ConsecutiveFailures = 2 })
	h.fake.SetDefault(fakeprovider.Step{Status: 401, Body: `{"error":{"message":"` + leak + `","type":"invalid_request_error","code":"invalid_api_key"}}`})
	r := h.chat(chatBody, nil)
	e := wantOpenAIError(t, r, http.StatusBadGateway)
	if e["code"] != "upstream_auth_failed" || strings.Contains(string(r.body), "sk-") || !strings.Contains(e["message"].(string), "primary") {
		t.Fatalf("401 answer: %s", r.body)
	}
	if h.fake.Calls("") != 1 {
		t.Fatalf("a 401 was retried: %d calls", h.fake.Calls(""))
	}
	if !strings.Contains(h.logs.String(), `"level":"ERROR","msg":"upstream refused the gateway's credentials`) || strings.Contains(h.logs.String(), "sk-***") {
		t.Fatalf("log: %s", grepLines(h.logs.String(), "credentials"))
	}
	if m := h.metricsText(); !strings.Contains(m, `llmgate_upstream_auth_failures_total{status="401",upstream="primary"} 1`) {
		t.Fatalf("not counted:\n%s", grepLines(m, "auth_failures"))
	}
	h.chat(chatBody, nil)
	if got := breakerState(t, h, "primary"); got != "open" {
		t.Fatalf("two 401s: breaker %s, want open", got)
	}

	h403 := newHarness(t, func(c *config.Config) { c.Breaker.ConsecutiveFailures = 2 })
	h403.fake.SetDefault(fakeprovider.Step{Status: 403})
	for range 3 {
		wantOpenAIError(t, h403.chat(chatBody, nil), http.StatusBadGateway)
	}
	if got := breakerState(t, h403, "primary"); got != "closed" {
		t.Fatalf("403s: breaker %s, want closed", got)
	}
}

// Issue 13, item 5: upstream response headers that are llmgate's to set,
// CORS, cookies and the provider's account never reach the client — on a
// fresh answer or on its replay; the ones a client relies on do.
func TestUpstreamResponseHeadersAllowList(t *testing.T) {
	h, _ := upstreamHarness(t, func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		for k, v := range map[string]string{
			"Idempotent-Replayed": "true", "Access-Control-Allow-Origin": "*", "X-Llmgate-Upstream": "evil",
			"X-Llmgate-Outcome": "success", "Set-Cookie": "s=1", "Openai-Organization": "org-secret",
			"Openai-Project": "proj-secret", "X-Should-Retry": "true",
			"X-Request-Id": "req-1", "X-Ratelimit-Remaining-Requests": "99", "Openai-Processing-Ms": "12",
			"Content-Disposition": `attachment; filename="a.json"`,
		} {
			hd.Set(k, v)
		}
		hd.Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`))
	}, nil)
	for i, r := range []result{h.chat(chatBody, key("hdr")), h.chat(chatBody, key("hdr"))} {
		for _, bad := range []string{"Access-Control-Allow-Origin", "Set-Cookie", "Openai-Organization", "Openai-Project"} {
			if v := r.header.Get(bad); v != "" {
				t.Errorf("answer %d: %s: %q passed through", i, bad, v)
			}
		}
		if r.header.Get("X-Llmgate-Upstream") != "primary" || r.header.Get("X-Llmgate-Outcome") != "" || r.header.Get("X-Should-Retry") == "true" {
			t.Errorf("answer %d: llmgate's own headers set by the upstream: %v", i, r.header)
		}
		if (i == 0) != (r.header.Get("Idempotent-Replayed") == "") {
			t.Errorf("answer %d: Idempotent-Replayed %q", i, r.header.Get("Idempotent-Replayed"))
		}
		for _, good := range []string{"X-Request-Id", "X-Ratelimit-Remaining-Requests", "Openai-Processing-Ms", "Content-Disposition"} {
			if r.header.Get(good) == "" {
				t.Errorf("answer %d: %s was dropped", i, good)
			}
		}
	}
}

// Issue 13, item 6: base_url's query string (Azure's api-version) is kept
// on every upstream request; the client's query string never reaches the
// upstream nor overrides it.
func TestBaseURLQueryKept(t *testing.T) {
	var queries []string
	var mu sync.Mutex
	h, _ := upstreamHarness(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		queries = append(queries, r.URL.Path+"?"+r.URL.RawQuery)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`))
	}, func(c *config.Config) { c.Upstreams[0].BaseURL += "?api-version=2024-10-21" })
	h.do(http.MethodPost, "/v1/chat/completions?api-version=evil&x=1", chatBody, nil)
	mu.Lock()
	defer mu.Unlock()
	if len(queries) != 1 || queries[0] != "/v1/chat/completions?api-version=2024-10-21" {
		t.Fatalf("upstream saw %q", queries)
	}
}
