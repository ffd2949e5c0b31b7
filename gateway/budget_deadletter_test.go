package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/budget"
)

// readCount is spent without a *testing.T, for the fake upstream's
// goroutine: alice's counter of b in the current window.
func readCount(st budget.Store, b config.Budget) (cache.BudgetCount, error) {
	start, _ := budget.Window(b.Window, time.Now())
	label := start.Format("2006-01-02")
	got, err := st.ReadBudgets(context.Background(), "alice", []string{b.ID() + "@" + label})
	if err != nil {
		return cache.BudgetCount{}, err
	}
	return got[0], nil
}

// A keyed request that is dead-lettered (every attempt a 503, a 429, or
// a connection dropped) gives back the reservation it held while it ran:
// the budget's held amount is 40 during each attempt and 0 after, nothing
// is spent, and the next request — whose reservation fits only beside
// nothing held — runs.
func TestBudgetDeadLetterReleasesReservation(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(w http.ResponseWriter)
	}{
		{"503", func(w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) }},
		{"429", func(w http.ResponseWriter) { w.WriteHeader(http.StatusTooManyRequests) }},
		{"dropped", func(w http.ResponseWriter) {
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				c.Close()
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { deadLetterReleases(t, tc.fail) })
	}
}

func deadLetterReleases(t *testing.T, fail func(w http.ResponseWriter)) {
	var (
		mu     sync.Mutex
		during []cache.BudgetCount
		failed = true
	)
	day := config.Budget{Window: config.WindowDay, Tokens: 40} // one reservation of budgetChat, exactly
	var h *harness
	up := &metered{In: 10, Out: 5}
	up.Script = func(_ int64, w http.ResponseWriter, _ *http.Request) bool {
		mu.Lock()
		defer mu.Unlock()
		if c, err := readCount(h.store, day); err == nil {
			during = append(during, c)
		}
		if failed {
			fail(w)
			return true
		}
		return false
	}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	h = newHarness(t, func(c *config.Config) {
		budgeted(srv.URL, day)(c)
		c.Retry.MaxAttempts = 2
	})
	if r := h.chat(budgetChat, with(alice, "Idempotency-Key", "order-7/summary")); r.status < 429 {
		t.Fatalf("keyed call: %d %s, want a failure after its retries", r.status, r.body)
	}
	if l := listDLQ(t, h, ""); l.Total != 1 || l.DeadLetters[0].Key != "order-7/summary" || l.DeadLetters[0].Attempts != 2 {
		t.Fatalf("dead letters = %+v, want the keyed call after 2 attempts", l)
	}
	mu.Lock()
	seen := append([]cache.BudgetCount(nil), during...)
	failed = false
	mu.Unlock()
	if len(seen) != 2 || seen[0] != (cache.BudgetCount{Held: 40}) || seen[1] != (cache.BudgetCount{Held: 40}) {
		t.Fatalf("counter during the attempts = %+v, want 40 held in each", seen)
	}
	if got := spent(t, h.store, day); got != (cache.BudgetCount{}) {
		t.Fatalf("counter after the dead letter = %+v, want nothing spent or held", got)
	}
	if r := h.chat(budgetChat, alice); r.status != 200 {
		t.Fatalf("next request: %d %s, want 200 (its 40 fit: nothing is held)", r.status, r.body)
	}
	if got := spent(t, h.store, day); got != (cache.BudgetCount{Spent: 15}) {
		t.Fatalf("counter after the next request = %+v, want its 15 spent", got)
	}
}

// The refusal says why in figures and when it ends in words: with one
// run in flight holding 40 of a 70-token budget, the next request (which
// needs 40) is refused with 0 spent, 40 held, the limit and what it
// needs, and the reset time with how long until it. A chained llmgate
// and any client reading X-Llmgate-Outcome see quota.
func TestBudgetRefusalSaysWhy(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	up := &metered{In: 10, Out: 5}
	up.Script = func(n int64, _ http.ResponseWriter, _ *http.Request) bool {
		if n == 1 {
			close(entered)
			<-release
		}
		return false
	}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	day := config.Budget{Window: config.WindowDay, Tokens: 70}
	h := newHarness(t, budgeted(srv.URL, day))
	first := h.chatAsync(budgetChat, alice)
	<-entered
	r := h.chat(budgetChat, alice)
	close(release)
	if a := h.await(first); a.status != 200 {
		t.Fatalf("the run in flight: %d %s", a.status, a.body)
	}
	e := wantOpenAIError(t, r, 429)
	_, reset := budget.Window(config.WindowDay, time.Now())
	msg, _ := e["message"].(string)
	for _, want := range []string{"(70 total tokens per day)", "0 spent", "40 held by requests in flight", "limit of 70", "this request needs 40",
		"resets at " + reset.Format(time.RFC3339) + " (in ", "when the next UTC day starts"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	}
	if got := r.header.Get("X-Llmgate-Outcome"); got != "quota" {
		t.Errorf("X-Llmgate-Outcome = %q, want quota", got)
	}
}
