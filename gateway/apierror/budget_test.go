package apierror

import (
	"net/http"
	"testing"
	"time"
)

// A budget refusal's message, by what is known: a cost budget's figures
// in currency units, a minute window's reset in seconds, and — when the
// counter could not be read — no figures but the reset. Every refusal
// is 429 budget_exceeded, x-should-retry false, X-Llmgate-Outcome quota.
func TestBudgetRefusalMessage(t *testing.T) {
	reset := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		err  *BudgetExceeded
		want string
	}{
		{"cost, figures known", &BudgetExceeded{What: "500.000000 of cost per month", Window: "month", Reset: reset, RetryAfter: 90*time.Hour + 1500*time.Millisecond,
			Figures: &BudgetFigures{Spent: 499_990_000, Held: 0, Limit: 500_000_000, Needs: 40_000, Cost: true}},
			"This API key's budget at the gateway (500.000000 of cost per month) has no room for this request: 499.990000 spent and 0.000000 held by requests in flight, " +
				"of a limit of 500.000000; this request needs 0.040000. It resets at 2026-12-03T00:00:00Z (in 90h0m2s), when the next UTC month starts. " +
				"The request was not sent to any provider; retrying before then will not help."},
		{"tokens held by runs in flight", &BudgetExceeded{What: "70 total tokens per minute", Window: "minute", Reset: reset, RetryAfter: 37 * time.Second,
			Figures: &BudgetFigures{Spent: 20, Held: 40, Limit: 70, Needs: 40}},
			"This API key's budget at the gateway (70 total tokens per minute) has no room for this request: 20 spent and 40 held by requests in flight, " +
				"of a limit of 70; this request needs 40. It resets at 2026-12-03T00:00:00Z (in 37s), when the next UTC minute starts. " +
				"The request was not sent to any provider; unless the requests in flight settle below what they hold, retrying before then will not help."},
		{"figures unknown", &BudgetExceeded{What: "2000000 total tokens per day", Window: "day", Reset: reset, RetryAfter: time.Hour},
			"This API key's budget at the gateway (2000000 total tokens per day) is spent. It resets at 2026-12-03T00:00:00Z (in 1h0m0s), when the next UTC day starts. " +
				"The request was not sent to any provider; retrying before then will not help."},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := Wire(c.err)
			if e.Message != c.want {
				t.Errorf("message\n got %s\nwant %s", e.Message, c.want)
			}
			h := http.Header{}
			SetHeader(h, e)
			if e.Status != 429 || e.Code != "budget_exceeded" || h.Get("X-Should-Retry") != "false" || h.Get("X-Llmgate-Outcome") != "quota" ||
				h.Get(BudgetResetHeader) != "2026-12-03T00:00:00Z" {
				t.Errorf("status %d code %s headers %v", e.Status, e.Code, h)
			}
		})
	}
}
