package gateway

import (
	"strings"
	"testing"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// One client's failing requests spend at most half of the retry budget:
// another client's transient failure right after still gets its retry.
// Before, the flooder's retries took the whole budget (20% of the window's
// requests plus budget_min_per_second), and the other client's request,
// failing once, was answered 503 with no retry (found by the
// hostile-tenant run).
func TestRetryBudgetSharedPerClient(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Clients = []config.Client{{Name: "flooder", Key: "key-f"}, {Name: "victim", Key: "key-v"}}
		c.Retry.MaxAttempts = 3
		c.Retry.BudgetMinPerSecond = 1 // 10 retries over the 10 s window, plus 20% of its requests
		c.Breaker.ConsecutiveFailures = 1 << 30
		c.Breaker.MinRequests = 1 << 30
	})
	h.fake.SetDefault(fakeprovider.Step{Status: 503})
	flood := strings.Replace(chatBody, "gpt-4o-mini", "gpt-4o", 1)
	for range 20 {
		if r := h.chat(flood, map[string]string{"Authorization": "Bearer key-f"}); r.status != 503 {
			t.Fatalf("flooder: %d %s", r.status, r.body)
		}
	}
	floodCalls := h.fake.Calls("")
	// The victim's request fails once, then would succeed.
	h.fake.Enqueue(fakeprovider.Step{Status: 503})
	h.fake.SetDefault(fakeprovider.Step{})
	r := h.chat(chatBody, map[string]string{"Authorization": "Bearer key-v"})
	if r.status != 200 {
		t.Fatalf("the victim's request failing once after another client's flood: %d %s (the flood made %d upstream calls for 20 requests)",
			r.status, r.body, floodCalls)
	}
	// The flooder's retries stopped at half the window's allowance:
	// (20% of 20 requests + 10) / 2 = 7.
	if retries := floodCalls - 20; retries < 6 || retries > 8 {
		t.Fatalf("the flooder made %d retries, want about 7 (half the allowance)", retries)
	}
}
