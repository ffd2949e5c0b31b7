package classify

import (
	"net/http"
	"testing"
	"time"
)

// A quota error that crossed a chained llmgate stays a quota error (not
// retried): the inner gateway's storage quota, and any answer the inner
// gateway itself classified as quota (X-Llmgate-Outcome: quota), whatever
// its body. A plain 429 stays a rate limit.
func TestChainedQuotaStaysQuota(t *testing.T) {
	chained := http.Header{"X-Llmgate-Outcome": {"quota"}, "X-Should-Retry": {"false"}}
	for _, tc := range []struct {
		name   string
		status int
		h      http.Header
		body   string
		want   Class
	}{
		{"provider quota relayed", 429, chained, `{"error":{"message":"q","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`, Quota},
		{"inner storage quota", 429, http.Header{"X-Should-Retry": {"false"}},
			`{"error":{"message":"stored answers at quota","type":"storage","param":null,"code":"client_storage_quota_exceeded"}}`, Quota},
		{"inner budget spent", 429, http.Header{"X-Should-Retry": {"false"}},
			`{"error":{"message":"budget spent","type":"budget","param":null,"code":"budget_exceeded"}}`, Quota},
		{"inner verdict, body rewritten", 429, chained, `{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}`, Quota},
		{"inner verdict, no body", 503, chained, ``, Quota},
		{"plain rate limit", 429, http.Header{}, `{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}`, RateLimited},
		{"inner rate limit", 429, http.Header{"X-Llmgate-Outcome": {"rate_limited"}}, `{"error":{"type":"requests","code":"client_rate_limited"}}`, RateLimited},
	} {
		if got := FromResponse(tc.status, tc.h, []byte(tc.body), time.Now()); got.Class != tc.want {
			t.Errorf("%s: %+v, want %s", tc.name, got, tc.want)
		}
	}
}
