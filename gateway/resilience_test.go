package gateway

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// Each row: what the upstream does, how many upstream calls the gateway
// makes, and what the client gets. It reads like the policy table in the
// README.
func TestRetryPolicy(t *testing.T) {
	cases := []struct {
		name    string
		steps   []fakeprovider.Step
		calls   int
		status  int
		outcome string
	}{
		{"503,503,200 → success after three calls", []fakeprovider.Step{{Status: 503}, {Status: 503}, {}}, 3, 200, ""},
		{"502 then 504 then 200", []fakeprovider.Step{{Status: 502}, {Status: 504}, {}}, 3, 200, ""},
		{"529 overloaded is retried", []fakeprovider.Step{{Status: 529}, {}}, 2, 200, ""},
		{"503 three times → attempts exhausted", []fakeprovider.Step{{Status: 503}, {Status: 503}, {Status: 503}, {}}, 3, 503, ""},
		{"500 → exactly two calls", []fakeprovider.Step{{Status: 500}, {Status: 500}, {}}, 2, 500, ""},
		{"400 → one call", []fakeprovider.Step{{Status: 400}}, 1, 400, ""},
		{"404 → one call", []fakeprovider.Step{{Status: 404}}, 1, 404, ""},
		{"401 → one call, 502 to the client", []fakeprovider.Step{{Status: 401}}, 1, 502, ""},
		{"403 → one call, 502 to the client", []fakeprovider.Step{{Status: 403}}, 1, 502, ""},
		{"429 insufficient_quota → one call", []fakeprovider.Step{{Status: 429, ErrType: "insufficient_quota", ErrCode: "insufficient_quota"}}, 1, 429, ""},
		{"400 content_filter → one call", []fakeprovider.Step{{Status: 400, ErrCode: "content_filter"}}, 1, 400, ""},
		{"200 content_filter → one call, answered", []fakeprovider.Step{{FinishReason: "content_filter"}}, 1, 200, "content_filter"},
		{"200 empty output → one call, answered", []fakeprovider.Step{{Empty: true}}, 1, 200, "empty_output"},
		{"connection reset → retried", []fakeprovider.Step{{Reset: true}, {}}, 2, 200, ""},
		{"truncated body → retried", []fakeprovider.Step{{ResetAfter: 10}, {}}, 2, 200, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.fake.Enqueue(tc.steps...)
			r := h.chat(chatBody, nil)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			if n := h.fake.Calls("/v1/chat/completions"); n != tc.calls {
				t.Fatalf("upstream calls %d, want %d", n, tc.calls)
			}
			if got := r.header.Get("X-Llmgate-Outcome"); tc.outcome != "" && got != tc.outcome {
				t.Errorf("X-Llmgate-Outcome = %q, want %q", got, tc.outcome)
			}
			if r.status != 200 && r.header.Get("X-Should-Retry") != "false" {
				t.Errorf("a failure already retried must say x-should-retry: false, got %q", r.header.Get("X-Should-Retry"))
			}
		})
	}
}

func TestRetryAfterIsHonoured(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.Enqueue(fakeprovider.Step{Status: 429, Header: map[string]string{"Retry-After": "1"}}, fakeprovider.Step{})
	r := h.chat(chatBody, nil)
	if r.status != 200 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	reqs := h.fake.Requests()
	if len(reqs) != 2 {
		t.Fatalf("calls %d", len(reqs))
	}
	if gap := reqs[1].At.Sub(reqs[0].At); gap < time.Second {
		t.Fatalf("second call %v after the first; Retry-After said 1s", gap)
	}
}

func TestRetryAfterBeyondDeadlineReturnsAtOnce(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.Enqueue(fakeprovider.Step{Status: 429, Header: map[string]string{"Retry-After": "120"}})
	start := time.Now()
	r := h.chat(chatBody, map[string]string{DeadlineHeader: "5s"})
	if r.status != 429 || r.header.Get("Retry-After") != "120" {
		t.Fatalf("status %d Retry-After %q", r.status, r.header.Get("Retry-After"))
	}
	if h.fake.Calls("") != 1 {
		t.Fatalf("calls %d", h.fake.Calls(""))
	}
	if time.Since(start) > 3*time.Second {
		t.Fatal("the gateway slept although Retry-After exceeded the deadline")
	}
}

// breakerState is the worst state among the named upstream's breakers (its
// own and its models'): "closed" when none opened.
func breakerState(t *testing.T, h *harness, name string) string {
	t.Helper()
	r := h.admin(http.MethodGet, "/admin/breakers")
	if r.status != 200 {
		t.Fatalf("admin breakers %d %s", r.status, r.body)
	}
	var v struct {
		Breakers []struct{ Name, State string }
	}
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatal(err)
	}
	rank := map[string]int{"closed": 0, "half-open": 1, "open": 2}
	worst, found := "closed", false
	for _, b := range v.Breakers {
		if b.Name == name {
			found = true
			if rank[b.State] > rank[worst] {
				worst = b.State
			}
		}
	}
	if !found {
		t.Fatalf("no breaker %s in %s", name, r.body)
	}
	return worst
}

func TestBreakerTripsAndRecovers(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Retry.MaxAttempts = 1
		c.Breaker.ConsecutiveFailures = 3
		c.Breaker.OpenTimeout = config.Duration(300 * time.Millisecond)
	})
	h.fake.SetDefault(fakeprovider.Step{Status: 503})
	for i := 0; i < 3; i++ {
		if r := h.chat(chatBody, nil); r.status != 503 {
			t.Fatalf("call %d: %d", i, r.status)
		}
	}
	if got := breakerState(t, h, "primary"); got != "open" {
		t.Fatalf("state %s, want open", got)
	}
	before := h.fake.Calls("")
	r := h.chat(chatBody, nil)
	e := wantOpenAIError(t, r, 503)
	if !strings.Contains(e["message"].(string), "primary") || r.header.Get("Retry-After") == "" {
		t.Fatalf("open-breaker answer: %s, Retry-After %q", r.body, r.header.Get("Retry-After"))
	}
	if h.fake.Calls("") != before {
		t.Fatal("an open breaker let a request reach the upstream")
	}
	// After open_timeout a healthy probe closes it.
	h.fake.SetDefault(fakeprovider.Step{})
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := h.chat(chatBody, nil)
		if r.status == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("breaker never let a probe through: %d", r.status)
		}
		time.Sleep(50 * time.Millisecond) // waiting out open_timeout, not synchronising
	}
	if got := breakerState(t, h, "primary"); got != "closed" {
		t.Fatalf("state after healthy probe %s", got)
	}
}

func TestClientErrorsNeverTripBreaker(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Breaker.ConsecutiveFailures = 2 })
	h.fake.SetDefault(fakeprovider.Step{Status: 400})
	for i := 0; i < 20; i++ {
		if r := h.chat(chatBody, nil); r.status != 400 {
			t.Fatalf("status %d", r.status)
		}
	}
	if got := breakerState(t, h, "primary"); got != "closed" {
		t.Fatalf("400s tripped the breaker: %s", got)
	}
	if h.fake.Calls("") != 20 {
		t.Fatalf("calls %d", h.fake.Calls(""))
	}
}

func TestFallbackServesWhenPrimaryOpen(t *testing.T) {
	backup := fakeprovider.New(fakeprovider.Options{})
	bsrv := newTestServer(t, backup)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].Fallbacks = []string{"backup"}
		c.Upstreams = append(c.Upstreams, config.Upstream{Name: "backup", BaseURL: bsrv + "/v1", Models: []string{"backup-only"}, Timeout: config.Duration(time.Second)})
	})
	// Retries on the primary end transient → the fallback answers.
	h.fake.SetDefault(fakeprovider.Step{Status: 503})
	r := h.chat(chatBody, nil)
	if r.status != 200 || r.header.Get("X-Llmgate-Upstream") != "backup" {
		t.Fatalf("status %d upstream %q", r.status, r.header.Get("X-Llmgate-Upstream"))
	}
	// Forced open → straight to the fallback, primary untouched.
	if r := h.admin(http.MethodPost, "/admin/breakers/primary/open"); r.status != 200 {
		t.Fatalf("force open %d %s", r.status, r.body)
	}
	before := h.fake.Calls("")
	r = h.chat(chatBody, nil)
	if r.status != 200 || r.header.Get("X-Llmgate-Upstream") != "backup" {
		t.Fatalf("status %d upstream %q", r.status, r.header.Get("X-Llmgate-Upstream"))
	}
	if h.fake.Calls("") != before {
		t.Fatal("forced-open primary was called")
	}
	if r := h.admin(http.MethodPost, "/admin/breakers/primary/close"); r.status != 200 {
		t.Fatalf("force close %d", r.status)
	}
	h.fake.SetDefault(fakeprovider.Step{})
	if r := h.chat(chatBody, nil); r.header.Get("X-Llmgate-Upstream") != "primary" {
		t.Fatalf("after close served by %q", r.header.Get("X-Llmgate-Upstream"))
	}
}

func TestStreamFailureAfterFirstByteEndsWithErrorEvent(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.Enqueue(fakeprovider.Step{StopAfter: 2})
	r := h.chat(streamBody, nil)
	if r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	body := string(r.body)
	if strings.Contains(body, "data: [DONE]") || !strings.Contains(body, `"error"`) || !strings.HasSuffix(body, "\n\n") {
		t.Fatalf("a cut stream must end with an SSE error event: %q", body)
	}
	if h.fake.Calls("") != 1 {
		t.Fatalf("a stream past its first byte was retried: %d calls", h.fake.Calls(""))
	}
	// Before the first byte, a stream is retried.
	h.fake.Enqueue(fakeprovider.Step{Status: 503}, fakeprovider.Step{})
	r = h.chat(streamBody, nil)
	if r.status != 200 || !strings.HasSuffix(string(r.body), "data: [DONE]\n\n") {
		t.Fatalf("retried stream: %d %q", r.status, r.body)
	}
}

func TestStreamIdleTimeout(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Limits.StreamIdleTimeout = config.Duration(200 * time.Millisecond) })
	h.fake.Enqueue(fakeprovider.Step{StallAfter: 2})
	r := h.chat(streamBody, nil)
	if !strings.Contains(string(r.body), "stalled") {
		t.Fatalf("stalled stream not ended with an error event: %q", r.body)
	}
}

func TestAdminRequiresToken(t *testing.T) {
	h := newHarness(t, nil)
	for _, hdr := range []map[string]string{nil, {"Authorization": "Bearer wrong"}} {
		r := h.do(http.MethodGet, "/admin/breakers", "", hdr)
		wantOpenAIError(t, r, 401)
	}
	h2 := newHarness(t, func(c *config.Config) { c.AdminToken = "" })
	r := h2.do(http.MethodGet, "/admin/breakers", "", map[string]string{"Authorization": "Bearer "})
	wantOpenAIError(t, r, 403)
}
