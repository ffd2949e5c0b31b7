package proxy

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/metrics"
	"github.com/llmgate/llmgate/gateway/retry"
)

// takenLease is a keyed call's lease whose key another owner holds.
type takenLease struct{ ch chan struct{} }

func (l takenLease) Taken() <-chan struct{} { return l.ch }

// A call whose key was taken over makes neither a retry nor a fallback
// after its attempt in flight fails: the first upstream is called once,
// the fallback never, and the failure is what Execute returns.
func TestTakenOverCallNeitherRetriesNorFallsBack(t *testing.T) {
	var calls [2]atomic.Int32
	srv := func(i int) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls[i].Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":{"message":"overloaded","type":"server_error"}}`))
		}))
		t.Cleanup(s.Close)
		return s
	}
	a, b := srv(0), srv(1)
	router, err := NewRouter([]config.Upstream{{Name: "a", BaseURL: a.URL + "/v1", Models: []string{"*"}}, {Name: "b", BaseURL: b.URL + "/v1", Models: []string{"*"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(router.Close)
	body := []byte(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hi"}]}`)
	for _, tc := range []struct {
		name     string
		taken    bool
		attempts int
		want     [2]int32
	}{
		{"taken, retries stopped", true, 3, [2]int32{1, 0}},
		{"taken, no retry to stop", true, 1, [2]int32{1, 0}}, // the fallback is what is stopped
		{"held", false, 3, [2]int32{3, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Retry.MaxAttempts = tc.attempts
			cfg.Retry.BaseDelay, cfg.Retry.MaxDelay = config.Duration(time.Nanosecond), config.Duration(time.Nanosecond)
			p := New(Options{Config: cfg, Router: router, Breakers: breaker.New([]breaker.Upstream{{Name: "a"}, {Name: "b"}}, breaker.Settings{}),
				Budget: retry.NewBudget(retry.BudgetOptions{}), Metrics: metrics.New(prometheus.NewRegistry(), nil)})
			calls[0].Store(0)
			calls[1].Store(0)
			l := takenLease{ch: make(chan struct{})}
			if tc.taken {
				close(l.ch)
			}
			in := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
			c := &Call{In: in, Suffix: "/chat/completions", API: ChatCompletions, Body: body, Model: "gpt-4o-mini", Lease: l,
				Hops: []Hop{PrivateHop(router.Upstream("a"), "sk-a"), PrivateHop(router.Upstream("b"), "sk-b")}}
			resp, err := p.Execute(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Discard()
			if got := [2]int32{calls[0].Load(), calls[1].Load()}; got != tc.want {
				t.Fatalf("upstream calls a, b = %v, want %v", got, tc.want)
			}
			if resp.Status != http.StatusServiceUnavailable || resp.Abandoned != tc.taken {
				t.Fatalf("status %d, abandoned %v; want the last attempt's 503, abandoned %v", resp.Status, resp.Abandoned, tc.taken)
			}
		})
	}
}
