package gateway

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/config"
)

// BenchmarkBudgets is the request path (handler to a loopback upstream
// reporting usage, Badger store) for one client with and without a token
// budget, unkeyed and with a new Idempotency-Key each: what reserving and
// settling a budget adds to a request. The budget never runs out.
func BenchmarkBudgets(b *testing.B) {
	newKeyPrefix := func() string { return rand.Text() }
	up := &metered{In: 100, Out: 150}
	srv := httptest.NewServer(up)
	defer srv.Close()
	for _, on := range []bool{false, true} {
		cfg := testConfig(srv.URL)
		var budgets []config.Budget
		if on {
			budgets = []config.Budget{{Window: config.WindowDay, Tokens: 1 << 50}, {Window: config.WindowMinute, Tokens: 1 << 50}}
		}
		budgeted(srv.URL, budgets...)(&cfg)
		h := benchGateway(b, cfg)
		for _, keyed := range []bool{false, true} {
			name := fmt.Sprintf("budgets=%v/keyed=%v", on, keyed)
			b.Run(name, func(b *testing.B) {
				b.ReportAllocs()
				i, run := 0, newKeyPrefix()
				for b.Loop() {
					i++
					req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(budgetChat))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Authorization", alice["Authorization"])
					if keyed {
						req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d", run, i))
					}
					w := httptest.NewRecorder()
					h.ServeHTTP(w, req)
					if w.Code != http.StatusOK {
						b.Fatalf("status %d: %s", w.Code, w.Body)
					}
				}
			})
		}
	}
}
