package gateway

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/llmgate/llmgate/cache"
	badgerstore "github.com/llmgate/llmgate/cache/badger"
	redisstore "github.com/llmgate/llmgate/cache/redis"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway/budget"
)

// metered is a fake provider that reports usage: each chat completion
// (JSON or stream) says it took In prompt and Out completion tokens, and
// each Anthropic message the same. Script, when set, answers call n
// (from 1) instead, returning false to fall through to the usual answer.
type metered struct {
	In, Out int64
	Delay   time.Duration
	Script  func(n int64, w http.ResponseWriter, r *http.Request) bool
	calls   atomic.Int64
}

func (m *metered) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := m.calls.Add(1)
	body, _ := io.ReadAll(r.Body)
	if m.Delay > 0 {
		time.Sleep(m.Delay)
	}
	if m.Script != nil && m.Script(n, w, r) {
		return
	}
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, m.In, m.Out, m.In+m.Out)
	switch {
	case strings.HasSuffix(r.URL.Path, "/messages"):
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Hi"}],`+
			`"stop_reason":"end_turn","usage":{"input_tokens":%d,"output_tokens":%d}}`, m.In, m.Out)
	case strings.Contains(string(body), `"stream":true`):
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}`+"\n\n")
		fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n")
		fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":%s}`+"\n\n", usage)
		fmt.Fprint(w, "data: [DONE]\n\n")
	default:
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{"index":0,`+
			`"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":%s}`, usage)
	}
}

// budgeted is alice with budgets, on the upstream at url (OpenAI's API
// for gpt-*, Anthropic's for claude-*).
func budgeted(url string, budgets ...config.Budget) func(c *config.Config) {
	return func(c *config.Config) {
		c.Upstreams = []config.Upstream{
			{Name: "primary", BaseURL: url + "/v1", Models: []string{"gpt-*"}, Timeout: config.Duration(5 * time.Second)},
			{Name: "claude", BaseURL: url, API: config.APIAnthropic, Models: []string{"claude-*"}, Timeout: config.Duration(5 * time.Second)},
		}
		c.Clients = []config.Client{{Name: "alice", Key: "key-alice", Budgets: budgets}, {Name: "bob", Key: "key-bob"}}
	}
}

var alice = map[string]string{"Authorization": "Bearer key-alice"}

// budgetChat is a chat body of 120 bytes with max_tokens 10: its run
// reserves 30 + 10 = 40 tokens (bytes_per_token 4).
var budgetChat = func() string {
	b := `{"model":"gpt-4o-mini","max_tokens":10,"messages":[{"role":"user","content":"` + "%s" + `"}]}`
	return fmt.Sprintf(b, strings.Repeat("x", 120-len(b)+2))
}()

func TestBudgetChatIs120Bytes(t *testing.T) {
	if len(budgetChat) != 120 {
		t.Fatalf("budgetChat is %d bytes", len(budgetChat))
	}
}

// spent reads alice's counter of b in the current window.
func spent(t *testing.T, st budget.Store, b config.Budget) cache.BudgetCount {
	t.Helper()
	start, _ := budget.Window(b.Window, time.Now())
	label := start.Format("2006-01-02")
	if b.Window == config.WindowMinute {
		label = start.Format("2006-01-02T15:04")
	}
	got, err := st.ReadBudgets(context.Background(), "alice", []string{b.ID() + "@" + label})
	if err != nil {
		t.Fatal(err)
	}
	return got[0]
}

// A budget of 1000 tokens, with runs of 250 (each reserving 40): the
// fifth request is the one refused — 1000 spent + 40 > 1000 — not the
// fourth nor the sixth, and it never reaches the provider. The refusal
// says so as OpenAI's SDKs read it: 429, code budget_exceeded, the reset
// time in its header and message, Retry-After until then, and
// x-should-retry: false.
func TestBudgetReachedAtTheExpectedRequest(t *testing.T) {
	up := &metered{In: 100, Out: 150}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	day := config.Budget{Window: config.WindowDay, Tokens: 1000}
	h := newHarness(t, budgeted(srv.URL, day))
	var statuses []int
	var last result
	for range 6 {
		last = h.chat(budgetChat, alice)
		statuses = append(statuses, last.status)
	}
	if want := []int{200, 200, 200, 200, 429, 429}; fmt.Sprint(statuses) != fmt.Sprint(want) {
		t.Fatalf("statuses = %v, want %v", statuses, want)
	}
	if n := up.calls.Load(); n != 4 {
		t.Fatalf("provider calls = %d, want 4 (refusals never reach it)", n)
	}
	if got := spent(t, h.store, day); got != (cache.BudgetCount{Spent: 1000}) {
		t.Fatalf("counter = %+v, want 1000 spent, nothing held", got)
	}
	e := wantOpenAIError(t, last, 429)
	_, reset := budget.Window(config.WindowDay, time.Now())
	wantReset := reset.Format(time.RFC3339)
	if e["code"] != "budget_exceeded" || e["type"] != "budget" || !strings.Contains(e["message"].(string), wantReset) {
		t.Fatalf("error = %v, want code budget_exceeded, type budget, the reset %s in the message", e, wantReset)
	}
	if got := last.header.Get("X-Llmgate-Budget-Reset"); got != wantReset {
		t.Fatalf("X-Llmgate-Budget-Reset = %q, want %q", got, wantReset)
	}
	if got := last.header.Get("X-Should-Retry"); got != "false" {
		t.Fatalf("x-should-retry = %q, want false", got)
	}
	ra, err := strconv.Atoi(last.header.Get("Retry-After"))
	if left := time.Until(reset).Seconds(); err != nil || float64(ra) < left-5 || float64(ra) > left+5 {
		t.Fatalf("Retry-After = %q, want about %.0f (until the reset)", last.header.Get("Retry-After"), left)
	}
	// Another client's requests are not refused by alice's budget.
	if r := h.chat(budgetChat, map[string]string{"Authorization": "Bearer key-bob"}); r.status != 200 {
		t.Fatalf("bob: %d %s", r.status, r.body)
	}
	var clients struct {
		Clients []struct {
			Client  string
			Budgets []budget.Status
		}
	}
	if r := h.admin(http.MethodGet, "/admin/clients"); json.Unmarshal(r.body, &clients) != nil || len(clients.Clients) != 2 ||
		len(clients.Clients[0].Budgets) != 1 || clients.Clients[1].Budgets != nil {
		t.Fatalf("GET /admin/clients = %d %s", r.status, r.body)
	}
	if st := clients.Clients[0].Budgets[0]; st.Budget != "day.tokens.total" || st.Limit != 1000 || st.Spent != 1000 || st.Remaining != 0 || !st.Reset.Equal(reset) {
		t.Fatalf("alice's budget in /admin/clients = %+v", st)
	}
	m := h.admin(http.MethodGet, "/metrics")
	if !strings.Contains(string(m.body), `llmgate_budget_refused_total{budget="day.tokens.total",client="alice"} 2`) {
		t.Fatalf("metrics lack the two refusals:\n%s", grepLines(string(m.body), "llmgate_budget"))
	}
}

// On /v1/messages the refusal is in Anthropic's shape (the SDKs raise
// RateLimitError), with the same headers.
func TestBudgetRefusalAnthropicShape(t *testing.T) {
	up := &metered{In: 60, Out: 40}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	h := newHarness(t, budgeted(srv.URL, config.Budget{Window: config.WindowMonth, Tokens: 100, Model: "claude-*"}))
	body := `{"model":"claude-x","max_tokens":5,"messages":[{"role":"user","content":"Hi"}]}`
	hdr := with(alice, "anthropic-version", "2023-06-01")
	if r := h.do(http.MethodPost, "/v1/messages", body, hdr); r.status != 200 {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	r := h.do(http.MethodPost, "/v1/messages", body, hdr)
	var e struct {
		Type  string `json:"type"`
		Error struct{ Type, Message string }
	}
	if r.status != 429 || json.Unmarshal(r.body, &e) != nil || e.Type != "error" || e.Error.Type != "rate_limit_error" ||
		!strings.Contains(e.Error.Message, "per month for models claude-*") {
		t.Fatalf("refusal = %d %s, want 429 in Anthropic's shape naming the budget", r.status, r.body)
	}
	if r.header.Get("X-Should-Retry") != "false" || r.header.Get("X-Llmgate-Budget-Reset") == "" || r.header.Get("X-Llmgate-Outcome") != "quota" {
		t.Fatalf("headers = %v", r.header)
	}
	// The budget is scoped to claude-*: gpt-* requests pass it by.
	if r := h.chat(budgetChat, alice); r.status != 200 {
		t.Fatalf("gpt request under a claude-* budget: %d %s", r.status, r.body)
	}
	if n := up.calls.Load(); n != 2 {
		t.Fatalf("provider calls = %d, want 2", n)
	}
}

// 50 concurrent requests under a 1000-token budget, each reserving 40:
// when every run uses at most its reservation, spend never passes the
// budget; when each run uses 100 (its prompt underestimated by 60), spend
// passes it by no more than the stated bound — the underestimates of the
// runs in flight, at most 1000/40 = 25 of them: 25 × 60 = 1500.
func TestBudgetConcurrentOvershootBound(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in, out int64
		bound   int64
	}{
		{"runs within their reservation", 20, 10, 1000},
		{"runs over their reservation", 60, 40, 1000 + (1000/40)*(100-40)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := &metered{In: tc.in, Out: tc.out, Delay: 20 * time.Millisecond}
			srv := httptest.NewServer(up)
			t.Cleanup(srv.Close)
			day := config.Budget{Window: config.WindowDay, Tokens: 1000}
			h := newHarness(t, budgeted(srv.URL, day))
			var wg sync.WaitGroup
			var ok, refused atomic.Int64
			for range 50 {
				wg.Go(func() {
					r, err := h.try(http.MethodPost, "/v1/chat/completions", budgetChat, alice)
					switch {
					case err != nil:
					case r.status == 200:
						ok.Add(1)
					case r.status == 429:
						refused.Add(1)
					}
				})
			}
			wg.Wait()
			got := spent(t, h.store, day)
			if ok.Load()+refused.Load() != 50 || got.Held != 0 || got.Spent != ok.Load()*(tc.in+tc.out) {
				t.Fatalf("%d ok, %d refused, counter %+v: want 50 answered, every run charged its usage, nothing held", ok.Load(), refused.Load(), got)
			}
			if got.Spent > tc.bound {
				t.Fatalf("spent %d, over the bound %d", got.Spent, tc.bound)
			}
			t.Logf("%d of 50 ran, spent %d of 1000 (bound %d)", ok.Load(), got.Spent, tc.bound)
		})
	}
}

// A keyed request coalesced with 3 duplicates while it runs, then retried
// 5 times by its client after it committed and replayed 10 times more,
// is one provider run, charged once. The run spends the whole budget:
// the replays are still served (free), a new key is refused.
func TestBudgetKeyedChargedOnce(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	up := &metered{In: 200, Out: 50}
	up.Script = func(n int64, w http.ResponseWriter, r *http.Request) bool {
		if n == 1 {
			<-release
		}
		return false
	}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	t.Cleanup(open)
	day := config.Budget{Window: config.WindowDay, Tokens: 250}
	h := newHarness(t, budgeted(srv.URL, day))
	key := with(alice, "Idempotency-Key", "order-1/summary")
	first := h.chatAsync(budgetChat, key)
	waitFor(t, "the first call at the provider", func() bool { return up.calls.Load() == 1 })
	var dups []<-chan asyncResult
	for range 3 {
		dups = append(dups, h.chatAsync(budgetChat, key))
	}
	waitFor(t, "the duplicates in flight", func() bool {
		m := h.admin(http.MethodGet, "/metrics")
		return strings.Contains(string(m.body), "llmgate_requests_in_flight 4\n")
	})
	open()
	want := h.await(first)
	if want.status != 200 {
		t.Fatalf("first: %d %s", want.status, want.body)
	}
	for i, ch := range dups {
		if r := h.await(ch); r.status != 200 || string(r.body) != string(want.body) {
			t.Fatalf("duplicate %d: %d %s", i, r.status, r.body)
		}
	}
	for i := range 15 { // 5 client retries, then 10 replays
		if r := h.chat(budgetChat, key); r.status != 200 || string(r.body) != string(want.body) {
			t.Fatalf("replay %d: %d %s", i, r.status, r.body)
		}
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("provider calls = %d, want 1", n)
	}
	if got := spent(t, h.store, day); got != (cache.BudgetCount{Spent: 250}) {
		t.Fatalf("counter = %+v, want the one run's 250, charged once", got)
	}
	if r := h.chat(budgetChat, with(alice, "Idempotency-Key", "order-2/summary")); r.status != 429 {
		t.Fatalf("a new key over the spent budget: %d %s", r.status, r.body)
	}
}

// A stream cut before its first event (the provider billed it) and then
// served again — by the gateway's retry, or by a fallback upstream — is
// charged for both runs: the cut one by its reservation (it reported no
// usage), the second by its usage.
func TestBudgetCutStreamRetriedChargedForBothRuns(t *testing.T) {
	for _, tc := range []struct {
		name   string
		second string // what served the second run
		mutate func(c *config.Config, url string)
	}{
		{"retried", "its retry", func(*config.Config, string) {}},
		{"fallback", "the fallback", func(c *config.Config, url string) {
			c.Retry.MaxAttempts = 1
			c.Upstreams = []config.Upstream{
				{Name: "primary", BaseURL: url + "/v1", Models: []string{"gpt-*"}, Fallbacks: []string{"secondary"}, Timeout: config.Duration(5 * time.Second)},
				{Name: "secondary", BaseURL: url + "/v1", Models: []string{"gpt-*"}, Timeout: config.Duration(5 * time.Second)},
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := &metered{In: 100, Out: 150}
			up.Script = func(n int64, w http.ResponseWriter, r *http.Request) bool {
				if n == 1 {
					w.Header().Set("Content-Type", "text/event-stream")
					w.WriteHeader(200)
					w.(http.Flusher).Flush()
					return true // the stream ends before its first event
				}
				return false
			}
			srv := httptest.NewServer(up)
			t.Cleanup(srv.Close)
			day := config.Budget{Window: config.WindowDay, Tokens: 100000}
			h := newHarness(t, func(c *config.Config) {
				budgeted(srv.URL, day)(c)
				tc.mutate(c, srv.URL)
			})
			body := `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"max_tokens":20,"messages":[{"role":"user","content":"Hello"}]}`
			r := h.chat(body, alice)
			if r.status != 200 || !strings.Contains(string(r.body), "[DONE]") {
				t.Fatalf("stream: %d %s", r.status, r.body)
			}
			if n := up.calls.Load(); n != 2 {
				t.Fatalf("provider calls = %d, want 2 (the cut run, then %s)", n, tc.second)
			}
			reserved := int64((len(body)+3)/4) + 20
			if got := spent(t, h.store, day); got != (cache.BudgetCount{Spent: reserved + 250}) {
				t.Fatalf("counter = %+v, want %d (the cut run's reservation) + 250 (%s's usage)", got, reserved, tc.second)
			}
		})
	}
}

// A stream already running when its budget runs out completes; the next
// request is refused.
func TestBudgetStreamRunningCompletes(t *testing.T) {
	up := &metered{In: 100, Out: 900}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	day := config.Budget{Window: config.WindowDay, Tokens: 500}
	h := newHarness(t, budgeted(srv.URL, day))
	body := `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"max_tokens":20,"messages":[{"role":"user","content":"Hello"}]}`
	if r := h.chat(body, alice); r.status != 200 || !strings.Contains(string(r.body), "[DONE]") || !strings.Contains(string(r.body), `"completion_tokens":900`) {
		t.Fatalf("the stream that spends the budget: %d %s", r.status, r.body)
	}
	if r := h.chat(body, alice); r.status != 429 {
		t.Fatalf("the next: %d %s", r.status, r.body)
	}
	if got := spent(t, h.store, day); got.Spent != 1000 {
		t.Fatalf("spent %d, want 1000 (the run's usage, past the budget)", got.Spent)
	}
}

// budgetRedis opens a store on Redis under prefix, deleting its keys at
// the end.
func budgetRedis(t *testing.T, prefix string) *redisstore.Store {
	t.Helper()
	addr := os.Getenv("LLMGATE_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	s, err := redisstore.Open(context.Background(), redisstore.Options{URL: "redis://" + addr, Prefix: prefix})
	if err != nil {
		if os.Getenv("LLMGATE_REQUIRE_REDIS") == "1" {
			t.Fatalf("Redis expected at %s (LLMGATE_REQUIRE_REDIS=1): %v", addr, err)
		}
		t.Skipf("Redis unreachable at %s: %v", addr, err)
	}
	t.Cleanup(func() {
		s.Close()
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		defer c.Close()
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
	})
	return s
}

// Two gateways on one Redis share alice's budget: requests alternating
// between them are refused at the fifth, as on one gateway.
func TestBudgetSharedByReplicasOnRedis(t *testing.T) {
	up := &metered{In: 100, Out: 150}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	day := config.Budget{Window: config.WindowDay, Tokens: 1000}
	prefix := "llmgate-test:" + rand.Text()[:10] + ":"
	var stores []*redisstore.Store
	var gws []*harness
	for range 2 {
		st := budgetRedis(t, prefix)
		stores = append(stores, st)
		gws = append(gws, newHarnessStore(t, budgeted(srv.URL, day), func(Store) Store { return st }, fakeprovider.Options{}))
	}
	var statuses []int
	for i := range 6 {
		statuses = append(statuses, gws[i%2].chat(budgetChat, alice).status)
	}
	if want := []int{200, 200, 200, 200, 429, 429}; fmt.Sprint(statuses) != fmt.Sprint(want) {
		t.Fatalf("statuses = %v, want %v", statuses, want)
	}
	if got := spent(t, stores[1], day); got != (cache.BudgetCount{Spent: 1000}) {
		t.Fatalf("counter = %+v, want 1000 spent", got)
	}
}

// A gateway restarted on its Badger directory keeps what was spent.
func TestBudgetSurvivesBadgerRestart(t *testing.T) {
	up := &metered{In: 100, Out: 150}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	day := config.Budget{Window: config.WindowDay, Tokens: 1000}
	h := newHarness(t, budgeted(srv.URL, day))
	for range 3 {
		if r := h.chat(budgetChat, alice); r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	h.srv.Close()
	if err := h.store.Close(); err != nil {
		t.Fatal(err)
	}
	store, err := badgerstore.Open(badgerstore.Options{Dir: h.cfg.DataDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	gw, err := New(Options{Config: h.cfg, Store: store, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	h.store, h.gw, h.srv = store, gw, httptest.NewServer(gw.Handler())
	t.Cleanup(h.srv.Close)
	if r := h.chat(budgetChat, alice); r.status != 200 {
		t.Fatalf("fourth, after the restart: %d %s", r.status, r.body)
	}
	if r := h.chat(budgetChat, alice); r.status != 429 {
		t.Fatalf("fifth, after the restart: %d %s (the restart forgot what was spent)", r.status, r.body)
	}
}

// brokenBudgets is a store whose budget counters cannot be reached.
type brokenBudgets struct{ Store }

func (brokenBudgets) ReserveBudget(context.Context, string, cache.BudgetHold) (int, error) {
	return 0, errors.New("dial tcp: connection refused")
}

// With the budget store unreachable a budgeted client's request is
// refused (503 budget_store_unavailable, before any upstream call) by
// default; under on_store_error: allow it runs. A client without a
// budget is not affected either way.
func TestBudgetStoreUnreachable(t *testing.T) {
	for _, tc := range []struct {
		policy string
		status int
		calls  int64
	}{
		{config.OnStoreErrorRefuse, 503, 1},
		{config.OnStoreErrorAllow, 200, 2},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			up := &metered{In: 1, Out: 1}
			srv := httptest.NewServer(up)
			t.Cleanup(srv.Close)
			mutate := func(c *config.Config) {
				budgeted(srv.URL, config.Budget{Window: config.WindowDay, Tokens: 1000})(c)
				c.Budgets.OnStoreError = tc.policy
			}
			h := newHarnessStore(t, mutate, func(s Store) Store { return brokenBudgets{s} }, fakeprovider.Options{})
			r := h.chat(budgetChat, alice)
			if r.status != tc.status {
				t.Fatalf("alice: %d %s, want %d", r.status, r.body, tc.status)
			}
			if tc.status == 503 {
				if e := wantOpenAIError(t, r, 503); e["code"] != "budget_store_unavailable" {
					t.Fatalf("code = %v", e["code"])
				}
			}
			if r := h.chat(budgetChat, map[string]string{"Authorization": "Bearer key-bob"}); r.status != 200 {
				t.Fatalf("bob, with no budget: %d %s", r.status, r.body)
			}
			if n := up.calls.Load(); n != tc.calls {
				t.Fatalf("provider calls = %d, want %d", n, tc.calls)
			}
		})
	}
}

// A cost budget charges what the provider's usage costs at the
// upstream's prices, in micro-units: input not cached, cached input and
// output each at its price, rounded up.
func TestBudgetCostFromPrices(t *testing.T) {
	up := &metered{}
	up.Script = func(n int64, w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],`+
			`"usage":{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,"prompt_tokens_details":{"cached_tokens":1920}}}`)
		return true
	}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	month := config.Budget{Window: config.WindowMonth, Cost: 20_000} // 0.02 units
	h := newHarness(t, func(c *config.Config) {
		budgeted(srv.URL, month)(c)
		c.Upstreams[0].Prices = map[string]config.Price{"gpt-4o*": {Input: 2_500_000, CachedInput: 1_250_000, Output: 10_000_000}}
	})
	body := strings.Replace(budgetChat, "gpt-4o-mini", "gpt-4o", 1)
	for i := range 3 {
		if r := h.chat(body, alice); r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	// 86 × 2.50 + 1920 × 1.25 + 300 × 10 per million = 5615 micro-units a run.
	start, _ := budget.Window(config.WindowMonth, time.Now())
	got, err := h.store.ReadBudgets(context.Background(), "alice", []string{month.ID() + "@" + start.Format("2006-01")})
	if err != nil || got[0] != (cache.BudgetCount{Spent: 3 * 5615}) {
		t.Fatalf("counter = %+v, %v; want 16845 spent", got, err)
	}
	// 20000 − 16845 = 3155 left, under a run's reservation (30 + 10
	// tokens at $10: 400): the fourth still fits; its run takes it over.
	if r := h.chat(body, alice); r.status != 200 {
		t.Fatalf("fourth: %d %s", r.status, r.body)
	}
	if r := h.chat(body, alice); r.status != 429 {
		t.Fatalf("fifth: %d %s", r.status, r.body)
	}
}

// tokens_per_minute is a budget of total tokens per UTC minute, from
// client_limits for every client without its own.
func TestTokensPerMinute(t *testing.T) {
	up := &metered{In: 100, Out: 150}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	h := newHarness(t, func(c *config.Config) {
		budgeted(srv.URL)(c)
		c.ClientLimits.TokensPerMinute = 500
	})
	var statuses []int
	before := time.Now().UTC().Truncate(time.Minute)
	for range 3 {
		statuses = append(statuses, h.chat(budgetChat, alice).status)
	}
	if after := time.Now().UTC().Truncate(time.Minute); after.Equal(before) && fmt.Sprint(statuses) != "[200 200 429]" {
		t.Fatalf("statuses = %v within one minute, want the third refused (500 spent + 40 > 500)", statuses)
	}
	if r := h.chat(budgetChat, map[string]string{"Authorization": "Bearer key-bob"}); r.status != 200 {
		t.Fatalf("bob has his own minute: %d %s", r.status, r.body)
	}
}

// A client's own budget of total tokens per minute and its
// tokens_per_minute are one counter: one line, the stricter limit, and
// nothing left held once each run settles (on Redis a hold naming the
// counter twice was held twice and released once).
func TestTokensPerMinuteBesideOwnMinuteBudget(t *testing.T) {
	up := &metered{In: 100, Out: 150}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	own := config.Budget{Window: config.WindowMinute, Tokens: 5000}
	st := budgetRedis(t, "llmgate-test:"+rand.Text()[:10]+":")
	h := newHarnessStore(t, func(c *config.Config) {
		budgeted(srv.URL, own)(c)
		c.ClientLimits.TokensPerMinute = 500
	}, func(Store) Store { return st }, fakeprovider.Options{})
	var statuses []int
	before := time.Now().UTC().Truncate(time.Minute)
	for range 3 {
		statuses = append(statuses, h.chat(budgetChat, alice).status)
	}
	after := time.Now().UTC().Truncate(time.Minute)
	if !after.Equal(before) {
		t.Skip("the minute turned during the test; its counts span two windows")
	}
	if fmt.Sprint(statuses) != "[200 200 429]" {
		t.Fatalf("statuses = %v, want the third refused by the stricter limit (500 spent + 40 > 500)", statuses)
	}
	if got := spent(t, st, own); got != (cache.BudgetCount{Spent: 500}) {
		t.Fatalf("counter = %+v, want 500 spent and nothing held", got)
	}
	if r := h.admin(http.MethodGet, "/metrics"); r.status != 200 || strings.Count(string(r.body), `llmgate_budget_limit{budget="minute.tokens.total",client="alice"`) != 1 {
		t.Fatalf("GET /metrics: %d, want 200 with one budget limit series:\n%s", r.status, r.body)
	}
}

// A keyed request its budget refuses is refused before its call, its key
// released and no dead letter recorded: its retry gets the same refusal,
// not a 409 for a key left in flight.
func TestBudgetRefusedKeyIsReleased(t *testing.T) {
	up := &metered{In: 100, Out: 150}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	h := newHarness(t, budgeted(srv.URL, config.Budget{Window: config.WindowDay, Tokens: 250}))
	if r := h.chat(budgetChat, alice); r.status != 200 {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	key := with(alice, "Idempotency-Key", "order-9/summary")
	if r := h.chat(budgetChat, key); r.status != 429 || r.header.Get("X-Llmgate-Outcome") != "quota" {
		t.Fatalf("keyed over the budget: %d %v %s, want 429 with X-Llmgate-Outcome: quota", r.status, r.header, r.body)
	}
	if r := h.admin(http.MethodGet, "/admin/deadletters"); r.status != 200 || strings.Contains(string(r.body), "order-9") {
		t.Fatalf("dead letters: %d %s, want none for a budget refusal", r.status, r.body)
	}
	if r := h.chat(budgetChat, key); r.status != 429 || !strings.Contains(string(r.body), "budget_exceeded") {
		t.Fatalf("its retry: %d %s, want the same refusal (the key was released, not left in flight)", r.status, r.body)
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("provider calls = %d, want 1", n)
	}
}

// Anthropic's prompt-cache tokens are input: a token budget counts
// cache writes and reads beside input_tokens.
func TestBudgetCountsAnthropicCacheTokens(t *testing.T) {
	up := &metered{}
	up.Script = func(n int64, w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn",`+
			`"usage":{"input_tokens":12,"cache_creation_input_tokens":1024,"cache_read_input_tokens":2048,"output_tokens":6}}`)
		return true
	}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	in := config.Budget{Window: config.WindowDay, Tokens: 100000, Count: config.CountInput}
	h := newHarness(t, budgeted(srv.URL, in))
	body := `{"model":"claude-x","max_tokens":5,"messages":[{"role":"user","content":"Hi"}]}`
	if r := h.do(http.MethodPost, "/v1/messages", body, with(alice, "anthropic-version", "2023-06-01")); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if got := spent(t, h.store, in); got.Spent != 12+1024+2048 {
		t.Fatalf("input spent %d, want 3084 (input, cache writes and reads)", got.Spent)
	}
}

// TestBudgetCountTokensFree: /v1/messages/count_tokens costs nothing at
// the provider, so a budgeted client's counts are neither refused by a
// reservation (default_max_tokens alone is over this budget) nor charged:
// after four counts its one message still fits.
func TestBudgetCountTokensFree(t *testing.T) {
	up := &metered{In: 60, Out: 40}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	h := newHarness(t, budgeted(srv.URL, config.Budget{Window: config.WindowMonth, Tokens: 100, Model: "claude-*"}))
	hdr := with(alice, "anthropic-version", "2023-06-01")
	for i := range 4 {
		if r := h.do(http.MethodPost, "/v1/messages/count_tokens", `{"model":"claude-x","messages":[{"role":"user","content":"Hi"}]}`, hdr); r.status != 200 {
			t.Fatalf("count %d: %d %s", i, r.status, r.body)
		}
	}
	if r := h.do(http.MethodPost, "/v1/messages", `{"model":"claude-x","max_tokens":5,"messages":[{"role":"user","content":"Hi"}]}`, hdr); r.status != 200 {
		t.Fatalf("the message after the counts: %d %s", r.status, r.body)
	}
}

// A request asking for n choices (or best_of) is reserved for n times its
// max_tokens, as the provider may bill every choice, and a completion of
// several prompts (an array of strings or of token arrays) for each
// prompt's: under a budget of 500 tokens, n=5 or 5 prompts with
// max_tokens 100 does not fit and never reaches the provider (before,
// prompts counted as one: the hostile-tenant run overshot a day's budget
// 9× with ten 1,000-prompt calls); an embedding, which has no output, is
// reserved for its input only.
func TestBudgetReservesEveryChoiceAndNoOutputForEmbeddings(t *testing.T) {
	up := &metered{In: 10, Out: 10}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	day := config.Budget{Window: config.WindowDay, Tokens: 500}
	h := newHarness(t, budgeted(srv.URL, day))
	for _, body := range []string{
		`{"model":"gpt-4o-mini","n":5,"max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-4o-mini","best_of":5,"max_tokens":100,"prompt":"hi"}`,
		`{"model":"gpt-4o-mini","max_tokens":100,"prompt":["a","b","c","d","e"]}`,
		`{"model":"gpt-4o-mini","max_tokens":100,"prompt":[[1],[2],[3],[4],[5]]}`,
	} {
		path := "/v1/chat/completions"
		if strings.Contains(body, "prompt") {
			path = "/v1/completions"
		}
		r := h.do(http.MethodPost, path, body, alice)
		if e := wantOpenAIError(t, r, http.StatusBadRequest); e["code"] != "budget_request_too_large" {
			t.Fatalf("%s: %v, want the 400 of a request over the whole budget", body, e)
		}
	}
	if n := up.calls.Load(); n != 0 {
		t.Fatalf("provider calls = %d, want 0", n)
	}
	if r := h.chat(`{"model":"gpt-4o-mini","n":3,"max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`, alice); r.status != 200 {
		t.Fatalf("n=3, max_tokens 100 under 500: %d %s", r.status, r.body)
	}
	// One prompt of tokens is one prompt.
	if r := h.do(http.MethodPost, "/v1/completions", `{"model":"gpt-4o-mini","max_tokens":100,"prompt":[1,2,3,4,5]}`, alice); r.status != 200 {
		t.Fatalf("a prompt of 5 tokens, max_tokens 100 under 500: %d %s", r.status, r.body)
	}
	// An embedding reserves its input only (default_max_tokens is 4096,
	// which would not fit what is left).
	r := h.do(http.MethodPost, "/v1/embeddings", `{"model":"gpt-embed-small","input":"hello"}`, alice)
	if r.status != 200 {
		t.Fatalf("embedding under the budget: %d %s", r.status, r.body)
	}
}

// A request whose reservation is larger than its budget's whole limit can
// never fit, in this window or any other: it is a 400 that says so and how
// to fix it, with no Retry-After (not a 429 telling the client to wait a
// day for a reset that will not help), and no upstream call.
func TestBudgetRequestThatNeverFits(t *testing.T) {
	up := &metered{In: 10, Out: 10}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	day := config.Budget{Window: config.WindowDay, Tokens: 500}
	h := newHarness(t, budgeted(srv.URL, day))
	r := h.chat(`{"model":"gpt-4o-mini","max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}`, alice)
	e := wantOpenAIError(t, r, http.StatusBadRequest)
	msg, _ := e["message"].(string)
	if e["code"] != "budget_request_too_large" || e["type"] != "budget" || e["param"] != "max_tokens" ||
		!strings.Contains(msg, "500") || !strings.Contains(msg, "max_tokens") {
		t.Fatalf("error = %v", e)
	}
	if ra := r.header.Get("Retry-After"); ra != "" {
		t.Errorf("Retry-After = %q, want none (waiting does not help)", ra)
	}
	if r.header.Get("X-Should-Retry") != "false" || r.header.Get("X-Llmgate-Outcome") != "quota" {
		t.Errorf("headers: %v", r.header)
	}
	if n := up.calls.Load(); n != 0 {
		t.Fatalf("provider calls = %d, want 0", n)
	}
	if got := spent(t, h.store, day); got != (cache.BudgetCount{}) {
		t.Fatalf("counter = %+v, want untouched", got)
	}
	// A count past the integer range is the largest count, not "unset"
	// (which reserved default_max_tokens, or one choice for n).
	for _, body := range []string{
		`{"model":"gpt-4o-mini","max_tokens":1e30,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-4o-mini","max_tokens":1,"n":18446744073709551616,"messages":[{"role":"user","content":"hi"}]}`,
	} {
		if e := wantOpenAIError(t, h.chat(body, alice), http.StatusBadRequest); e["code"] != "budget_request_too_large" {
			t.Fatalf("%s: %v", body, e)
		}
	}
	if n := up.calls.Load(); n != 0 {
		t.Fatalf("provider calls = %d, want 0", n)
	}
	// On /v1/messages, in Anthropic's shape.
	r = h.do(http.MethodPost, "/v1/messages", `{"model":"claude-x","max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}`,
		map[string]string{"x-api-key": "key-alice", "anthropic-version": "2023-06-01"})
	if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), `"type":"error"`) || !strings.Contains(string(r.body), "invalid_request_error") {
		t.Fatalf("messages: %d %s", r.status, r.body)
	}
}

// slowBudgets is a store whose budget reservations wait for their
// context to end.
type slowBudgets struct{ Store }

func (slowBudgets) ReserveBudget(ctx context.Context, _ string, _ cache.BudgetHold) (int, error) {
	<-ctx.Done()
	return 0, ctx.Err()
}

// A budgeted request whose own deadline (X-Llmgate-Deadline) passes
// before or while its budget is reserved is a 504 deadline_exceeded, not
// a 503 from a budget store taken for down, nor (under on_store_error:
// allow) a run let through uncharged: nothing counted as a store error or
// logged as one (found by the hostile-tenant run and a review: any
// budgeted tenant could raise false budget-store alarms at will).
func TestBudgetReserveAfterClientDeadline(t *testing.T) {
	for _, tc := range []struct {
		name, deadline, policy string
		slow                   bool
	}{
		{"passed before", "1ns", config.OnStoreErrorRefuse, false},
		{"passing during, refuse", "200ms", config.OnStoreErrorRefuse, true},
		{"passing during, allow", "200ms", config.OnStoreErrorAllow, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := &metered{In: 100, Out: 150}
			srv := httptest.NewServer(up)
			t.Cleanup(srv.Close)
			wrap := func(s Store) Store { return s }
			if tc.slow {
				wrap = func(s Store) Store { return slowBudgets{s} }
			}
			h := newHarnessStore(t, func(c *config.Config) {
				budgeted(srv.URL, config.Budget{Window: config.WindowDay, Tokens: 1000})(c)
				c.Budgets.OnStoreError = tc.policy
				c.Store.OpTimeout = config.Duration(time.Minute)
			}, wrap, fakeprovider.Options{})
			r := h.chat(budgetChat, with(alice, DeadlineHeader, tc.deadline))
			if e := wantOpenAIError(t, r, http.StatusGatewayTimeout); e["code"] != "deadline_exceeded" {
				t.Fatalf("%v, want deadline_exceeded", e)
			}
			if up.calls.Load() != 0 {
				t.Fatalf("%d upstream calls, want none", up.calls.Load())
			}
			if m := h.admin(http.MethodGet, "/metrics"); strings.Contains(string(m.body), "llmgate_budget_store_errors_total{") {
				t.Fatalf("a client's deadline counted as a budget store error:\n%s", m.body)
			}
			if logs := h.logs.String(); strings.Contains(logs, "budget store") || !strings.Contains(logs, `"class":"client_deadline"`) {
				t.Fatalf("a client's deadline logged as the budget store's failure, or not as a client deadline:\n%s", logs)
			}
		})
	}
}
