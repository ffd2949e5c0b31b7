package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

func TestRequestBodyReachesUpstreamUnchanged(t *testing.T) {
	h := newHarness(t, nil)
	// Unknown fields, temperature 0, a vendor extension, odd spacing and
	// key order: all must arrive exactly as sent.
	body := `{ "temperature": 0, "model":"gpt-4o-mini","messages":[{"role":"user","content":"Hi \u00e9"}],` +
		`"x_vendor":{"top_k":0,"safe":false},"seed":0 }`
	r := h.chat(body, map[string]string{"Authorization": "Bearer client-key", "Cookie": "a=b", "X-Stainless-Lang": "python"})
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	reqs := h.fake.Requests()
	if len(reqs) != 1 {
		t.Fatalf("upstream saw %d requests, want 1", len(reqs))
	}
	got := reqs[0]
	if string(got.Body) != body {
		t.Errorf("upstream body differs:\n got %s\nwant %s", got.Body, body)
	}
	if got.Path != "/v1/chat/completions" {
		t.Errorf("upstream path %q", got.Path)
	}
	if a := got.Header.Get("Authorization"); a != "Bearer "+upstreamKey {
		t.Errorf("upstream Authorization = %q, want the upstream's key, never the client's", a)
	}
	if got.Header.Get("Cookie") != "" {
		t.Error("client Cookie forwarded")
	}
	if got.Header.Get("X-Stainless-Lang") != "python" {
		t.Error("SDK telemetry header not forwarded")
	}
}

func TestResponseBytesAndHeadersPassThrough(t *testing.T) {
	h := newHarness(t, nil)
	raw := "{\n  \"id\": \"chatcmpl-x\",  \"object\":\"chat.completion\", \"unknown_field\": [1, 2.50, null],\n" +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}` + "\n"
	h.fake.Enqueue(fakeprovider.Step{Body: raw, Header: map[string]string{
		"x-request-id": "req-123", "x-ratelimit-remaining-requests": "99", "openai-processing-ms": "7",
		"Keep-Alive": "timeout=5", "Proxy-Authenticate": "Basic", "Set-Cookie": "__cf_bm=upstream-cookie",
	}})
	r := h.chat(chatBody, nil)
	if r.status != 200 || string(r.body) != raw {
		t.Fatalf("status %d body differs:\n got %q\nwant %q", r.status, r.body, raw)
	}
	for k, want := range map[string]string{"X-Request-Id": "req-123", "X-Ratelimit-Remaining-Requests": "99",
		"Openai-Processing-Ms": "7", "X-Llmgate-Upstream": "primary", "Content-Type": "application/json"} {
		if got := r.header.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	if r.header.Get("Proxy-Authenticate") != "" || r.header.Get("Keep-Alive") != "" || r.header.Get("Set-Cookie") != "" {
		t.Errorf("hop-by-hop headers leaked: %v", r.header)
	}
}

func TestStreamIsRelayedIncrementally(t *testing.T) {
	h := newHarness(t, nil)
	// The upstream sends two events and then stalls: a gateway that
	// buffered the stream would show the client nothing.
	h.fake.Enqueue(fakeprovider.Step{StallAfter: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := h.send(ctx, http.MethodPost, "/v1/chat/completions", streamBody, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("Content-Type %q", ct)
	}
	br := bufio.NewReader(res.Body)
	events := 0
	for events < 2 {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d events: %v", events, err)
		}
		if line == "\n" {
			events++
		}
	}
	// Both events arrived while the upstream is still stalled.
	if n := h.fake.Calls(""); n != 1 {
		t.Fatalf("upstream calls %d", n)
	}
}

func TestStreamBytesIdenticalWithUsage(t *testing.T) {
	h := newHarness(t, nil)
	direct := func() string {
		// What the fake sends for this request, fetched directly.
		req, _ := http.NewRequest(http.MethodPost, h.up.URL+"/v1/chat/completions", strings.NewReader(streamBody))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var b strings.Builder
		_, _ = bufio.NewReader(res.Body).WriteTo(&b)
		return b.String()
	}()
	r := h.chat(streamBody, nil)
	if r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	// Ids differ per call; everything else, framing included, must match.
	norm := func(s string) string {
		var out []string
		for _, line := range strings.Split(s, "\n") {
			if strings.HasPrefix(line, "data: {") {
				var m map[string]any
				_ = json.Unmarshal([]byte(line[6:]), &m)
				delete(m, "id")
				delete(m, "created")
				b, _ := json.Marshal(m)
				line = "data: " + string(b)
			}
			out = append(out, line)
		}
		return strings.Join(out, "\n")
	}
	if norm(string(r.body)) != norm(direct) {
		t.Fatalf("stream differs from upstream's:\n got %s\nwant %s", r.body, direct)
	}
	if !strings.Contains(string(r.body), `"usage"`) || !strings.HasSuffix(string(r.body), "data: [DONE]\n\n") {
		t.Fatalf("stream lacks usage or [DONE]: %s", r.body)
	}
}

func TestGatewayErrors(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Limits.MaxBodyBytes = 1024
		c.Upstreams[0].Models = []string{"gpt-*"}
		c.Clients = []config.Client{{Name: "team-a", Key: "key-a"}}
	})
	auth := map[string]string{"Authorization": "Bearer key-a"}
	cases := []struct {
		name   string
		path   string
		body   string
		hdr    map[string]string
		status int
		code   string
	}{
		{"no key", "/v1/chat/completions", chatBody, nil, 401, "invalid_api_key"},
		{"wrong key", "/v1/chat/completions", chatBody, map[string]string{"Authorization": "Bearer nope"}, 401, "invalid_api_key"},
		{"malformed json", "/v1/chat/completions", `{"model":`, auth, 400, "invalid_json"},
		{"missing model", "/v1/chat/completions", `{"messages":[]}`, auth, 400, ""},
		{"model not a string", "/v1/chat/completions", `{"model":3}`, auth, 400, ""},
		{"unknown model", "/v1/chat/completions", `{"model":"llama-3"}`, auth, 404, "model_not_found"},
		{"too large", "/v1/chat/completions", `{"model":"gpt-4o","x":"` + strings.Repeat("a", 2000) + `"}`, auth, 413, "request_too_large"},
		{"too deep", "/v1/chat/completions", `{"model":"gpt-4o","x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, auth, 400, ""},
		{"unknown path", "/v1/nope", chatBody, auth, 404, "unknown_url"},
		{"bad idempotency key", "/v1/chat/completions", chatBody, map[string]string{"Authorization": "Bearer key-a", "Idempotency-Key": strings.Repeat("k", 256)}, 400, "invalid_idempotency_key"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do(http.MethodPost, tc.path, tc.body, tc.hdr)
			e := wantOpenAIError(t, r, tc.status)
			if tc.code != "" && e["code"] != tc.code {
				t.Errorf("code = %v, want %s", e["code"], tc.code)
			}
			if strings.Contains(string(r.body), "goroutine") || strings.Contains(string(r.body), "key-a") {
				t.Errorf("error leaks internals: %s", r.body)
			}
		})
	}
	if n := h.fake.Calls(""); n != 0 {
		t.Errorf("rejected requests reached the upstream %d times", n)
	}
	if r := h.chat(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`, auth); r.status != 200 {
		t.Errorf("authorised request: %d %s", r.status, r.body)
	}
	if strings.Contains(h.logs.String(), "key-a") || strings.Contains(h.logs.String(), upstreamKey) {
		t.Error("a key appears in the logs")
	}
	if !strings.Contains(h.logs.String(), `"client":"team-a"`) {
		t.Error("the log line does not name the client")
	}
}

func TestUpstreamUnreachableAndTimeout(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].Timeout = config.Duration(200 * time.Millisecond)
		c.Upstreams[0].Models = []string{"gpt-*"}
		c.Upstreams = append(c.Upstreams, config.Upstream{Name: "dead", BaseURL: deadURL + "/v1", Models: []string{"dead-*"}, Timeout: config.Duration(time.Second)})
	})
	r := h.chat(`{"model":"dead-1","messages":[{"role":"user","content":"hi"}]}`, nil)
	wantOpenAIError(t, r, 502)
	if r.header.Get("X-Should-Retry") != "false" {
		t.Errorf("x-should-retry = %q", r.header.Get("X-Should-Retry"))
	}
	h.fake.SetDefault(fakeprovider.Step{Hang: true})
	r = h.chat(chatBody, nil)
	wantOpenAIError(t, r, 504)
}

func TestModelsMergedAcrossUpstreams(t *testing.T) {
	second := fakeprovider.New(fakeprovider.Options{Models: []string{"llama-3", "gpt-4o"}})
	srv2 := httptest.NewServer(second)
	t.Cleanup(srv2.Close)
	t.Cleanup(second.Close)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].Models = []string{"gpt-*"}
		c.Upstreams = append(c.Upstreams, config.Upstream{Name: "local", BaseURL: srv2.URL + "/v1", Models: []string{"llama-*"}, Timeout: config.Duration(time.Second)})
	})
	r := h.do(http.MethodGet, "/v1/models", "", nil)
	if r.status != 200 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	var list struct {
		Object string
		Data   []struct{ ID string }
	}
	if err := json.Unmarshal(r.body, &list); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	if got := strings.Join(ids, ","); got != "gpt-4o,gpt-4o-mini,llama-3,text-embedding-3-small" {
		t.Fatalf("models = %s", got)
	}
	// Routing: llama goes to the second upstream.
	if r := h.chat(`{"model":"llama-3","messages":[{"role":"user","content":"hi"}]}`, nil); r.header.Get("X-Llmgate-Upstream") != "local" {
		t.Fatalf("llama-3 served by %q", r.header.Get("X-Llmgate-Upstream"))
	}
}

func TestHealthAndReadiness(t *testing.T) {
	h := newHarness(t, nil)
	if r := h.do(http.MethodGet, "/healthz", "", nil); r.status != 200 {
		t.Fatalf("healthz %d", r.status)
	}
	if r := h.do(http.MethodGet, "/readyz", "", nil); r.status != 200 {
		t.Fatalf("readyz %d", r.status)
	}
	h.gw.BeginShutdown()
	if r := h.do(http.MethodGet, "/readyz", "", nil); r.status != 503 {
		t.Fatalf("readyz during shutdown %d", r.status)
	}
	if r := h.do(http.MethodGet, "/healthz", "", nil); r.status != 200 {
		t.Fatalf("healthz during shutdown %d", r.status)
	}
}

func TestEmbeddingsAndCompletionsPassThrough(t *testing.T) {
	h := newHarness(t, nil)
	r := h.do(http.MethodPost, "/v1/embeddings", `{"model":"text-embedding-3-small","input":["a","b"],"dimensions":4}`, nil)
	if r.status != 200 || !strings.Contains(string(r.body), `"embedding"`) {
		t.Fatalf("embeddings: %d %s", r.status, r.body)
	}
	r = h.do(http.MethodPost, "/v1/completions", `{"model":"gpt-3.5-turbo-instruct","prompt":"Say hi"}`, nil)
	if r.status != 200 || !strings.Contains(string(r.body), `"text_completion"`) {
		t.Fatalf("completions: %d %s", r.status, r.body)
	}
	reqs := h.fake.Requests()
	if reqs[0].Path != "/v1/embeddings" || reqs[1].Path != "/v1/completions" {
		t.Fatalf("paths %s %s", reqs[0].Path, reqs[1].Path)
	}
}
