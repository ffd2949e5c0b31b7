package gateway

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway/budget"
)

// budgetGauge is the value of gauge name for alice's budget in a
// /metrics text, and whether the series is there.
func budgetGauge(text, name, client, id, window string) (float64, bool) {
	prefix := fmt.Sprintf(`%s{budget=%q,client=%q,window=%q} `, name, id, client, window)
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// gaugesOf are the five gauges of one budget, as /admin/clients names
// its fields.
func gaugesOf(t *testing.T, text, client string, st budget.Status) budget.Status {
	t.Helper()
	var got budget.Status
	for _, g := range []struct {
		name string
		to   *int64
	}{
		{"llmgate_budget_limit", &got.Limit}, {"llmgate_budget_spent", &got.Spent}, {"llmgate_budget_held", &got.Held},
		{"llmgate_budget_remaining", &got.Remaining},
	} {
		v, ok := budgetGauge(text, g.name, client, st.Budget, st.Window)
		if !ok {
			t.Fatalf("no %s for %s %s in:\n%s", g.name, client, st.Budget, grepLines(text, "llmgate_budget"))
		}
		*g.to = int64(v)
	}
	v, _ := budgetGauge(text, "llmgate_budget_reset_timestamp_seconds", client, st.Budget, st.Window)
	got.Reset = time.Unix(int64(v), 0).UTC()
	got.Budget, got.Window, got.Unit, got.Count, got.Model = st.Budget, st.Window, st.Unit, st.Count, st.Model
	return got
}

type clientJSON struct {
	Client  string          `json:"client"`
	Budgets []budget.Status `json:"budgets"`
}

// adminClients reads GET /admin/clients, by client.
func adminClients(t *testing.T, h *harness) map[string]clientJSON {
	t.Helper()
	r := h.admin(http.MethodGet, "/admin/clients")
	var out struct{ Clients []clientJSON }
	if r.status != 200 || json.Unmarshal(r.body, &out) != nil {
		t.Fatalf("GET /admin/clients = %d %s", r.status, r.body)
	}
	if strings.Contains(string(r.body), "key-alice") || strings.Contains(string(r.body), "key-bob") {
		t.Fatalf("GET /admin/clients shows a client key: %s", r.body)
	}
	m := map[string]clientJSON{}
	for _, c := range out.Clients {
		m[c.Client] = c
	}
	return m
}

// After three charged runs of 100 prompt and 150 completion tokens the
// gauges of alice's two budgets say what the provider's usage implies —
// 750 total tokens of 1000 today, 300 input tokens of 5000 this month on
// gpt-* — and exactly what GET /admin/clients and /admin/clients/alice
// say. One read serves for a second: a scrape within it shows the spend
// as it was, the next one after it the new spend.
func TestBudgetGaugesAgreeWithAdminAndUsage(t *testing.T) {
	up := &metered{In: 100, Out: 150}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	day := config.Budget{Window: config.WindowDay, Tokens: 1000}
	month := config.Budget{Window: config.WindowMonth, Tokens: 5000, Count: config.CountInput, Model: "gpt-*"}
	clock := newOffsetClock()
	h := newClockHarness(t, clock.Now, budgeted(srv.URL, day, month))
	for i := range 3 {
		if r := h.chat(budgetChat, alice); r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	text := h.metricsText()
	clients := adminClients(t, h)
	one := h.admin(http.MethodGet, "/admin/clients/alice")
	var alone clientJSON
	if one.status != 200 || json.Unmarshal(one.body, &alone) != nil || alone.Client != "alice" {
		t.Fatalf("GET /admin/clients/alice = %d %s", one.status, one.body)
	}
	if strings.Contains(string(one.body), "key-alice") {
		t.Fatalf("GET /admin/clients/alice shows alice's key: %s", one.body)
	}
	_, dayReset := budget.Window(config.WindowDay, clock.Now())
	_, monthReset := budget.Window(config.WindowMonth, clock.Now())
	want := []budget.Status{
		{Budget: "day.tokens.total", Window: "day", Unit: "tokens", Count: "total", Limit: 1000, Spent: 750, Remaining: 250, Reset: dayReset},
		{Budget: "month.tokens.input.gpt-*", Window: "month", Unit: "tokens", Count: "input", Model: "gpt-*", Limit: 5000, Spent: 300, Remaining: 4700, Reset: monthReset},
	}
	if got := clients["alice"].Budgets; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("/admin/clients alice budgets = %+v\nwant %+v", got, want)
	}
	if fmt.Sprint(alone.Budgets) != fmt.Sprint(want) {
		t.Fatalf("/admin/clients/alice budgets = %+v\nwant %+v", alone.Budgets, want)
	}
	for _, st := range want {
		if got := gaugesOf(t, text, "alice", st); fmt.Sprint(got) != fmt.Sprint(st) {
			t.Errorf("gauges = %+v\nwant %+v", got, st)
		}
	}
	if g := grepLines(text, "llmgate_budget_limit{"); strings.Contains(g, `client="bob"`) {
		t.Errorf("bob has no budget but has gauges:\n%s", g)
	}

	if r := h.chat(budgetChat, alice); r.status != 200 {
		t.Fatalf("fourth: %d %s", r.status, r.body)
	}
	if v, _ := budgetGauge(h.metricsText(), "llmgate_budget_spent", "alice", "day.tokens.total", "day"); v != 750 {
		t.Fatalf("spent within the second of the last read = %v, want 750 (the read is shared)", v)
	}
	clock.off.Add(int64(1100 * time.Millisecond))
	if v, _ := budgetGauge(h.metricsText(), "llmgate_budget_spent", "alice", "day.tokens.total", "day"); v != 1000 {
		t.Fatalf("spent after the second = %v, want 1000", v)
	}
}

// Two gateways on one Redis report the same spend: each reads the shared
// counters, whichever gateway charged them.
func TestBudgetGaugesSharedOnRedis(t *testing.T) {
	up := &metered{In: 100, Out: 150}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	day := config.Budget{Window: config.WindowDay, Tokens: 1000}
	prefix := "llmgate-test:" + rand.Text()[:10] + ":"
	var gws []*harness
	for range 2 {
		st := budgetRedis(t, prefix)
		gws = append(gws, newHarnessStore(t, budgeted(srv.URL, day), func(Store) Store { return st }, fakeprovider.Options{}))
	}
	for i := range 3 {
		if r := gws[i%2].chat(budgetChat, alice); r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	_, reset := budget.Window(config.WindowDay, time.Now())
	want := budget.Status{Budget: "day.tokens.total", Window: "day", Unit: "tokens", Count: "total", Limit: 1000, Spent: 750, Remaining: 250, Reset: reset}
	for i, h := range gws {
		if got := gaugesOf(t, h.metricsText(), "alice", want); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("gateway %d gauges = %+v, want %+v", i, got, want)
		}
		if got := adminClients(t, h)["alice"].Budgets; len(got) != 1 || got[0].Spent != 750 {
			t.Errorf("gateway %d /admin/clients alice = %+v, want 750 spent", i, got)
		}
	}
}

// flakyBudgets fails ReadBudgets while failing is set.
type flakyBudgets struct {
	Store
	failing atomic.Bool
	reads   atomic.Int64
}

func (f *flakyBudgets) ReadBudgets(ctx context.Context, scope string, counters []string) ([]cache.BudgetCount, error) {
	f.reads.Add(1)
	if f.failing.Load() {
		return nil, errors.New("budget store down")
	}
	return f.Store.ReadBudgets(ctx, scope, counters)
}

// A budget store that cannot be read leaves the budget gauges out and
// logs it once; the scrape still answers 200 with every other series,
// and the gauges come back with the store.
func TestBudgetGaugesStoreError(t *testing.T) {
	up := &metered{In: 100, Out: 150}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	day := config.Budget{Window: config.WindowDay, Tokens: 1000}
	clock := newOffsetClock()
	var fb *flakyBudgets
	h := newHarnessOptions(t, budgeted(srv.URL, day), func(s Store) Store { fb = &flakyBudgets{Store: s}; return fb }, fakeprovider.Options{},
		func(o *Options) { o.Now = clock.Now })
	if r := h.chat(budgetChat, alice); r.status != 200 {
		t.Fatalf("request: %d %s", r.status, r.body)
	}
	fb.failing.Store(true)
	for range 2 {
		clock.off.Add(int64(2 * time.Second))
		m := h.admin(http.MethodGet, "/metrics")
		if m.status != 200 || !strings.Contains(string(m.body), "llmgate_requests_total") {
			t.Fatalf("scrape with the budget store down = %d\n%s", m.status, grepLines(string(m.body), "llmgate_budget"))
		}
		if _, ok := budgetGauge(string(m.body), "llmgate_budget_spent", "alice", day.ID(), "day"); ok {
			t.Fatalf("a gauge for an unreadable budget:\n%s", grepLines(string(m.body), "llmgate_budget"))
		}
	}
	if n := strings.Count(h.logs.String(), "budgets could not be read"); n != 1 {
		t.Fatalf("logged %d times, want once:\n%s", n, h.logs.String())
	}
	if r := h.admin(http.MethodGet, "/admin/clients/alice"); r.status != http.StatusServiceUnavailable {
		t.Fatalf("/admin/clients/alice with the budget store down = %d %s, want 503", r.status, r.body)
	}
	fb.failing.Store(false)
	clock.off.Add(int64(2 * time.Second))
	if v, ok := budgetGauge(h.metricsText(), "llmgate_budget_spent", "alice", day.ID(), "day"); !ok || v != 250 {
		t.Fatalf("spent after the store is back = %v, %v; want 250", v, ok)
	}
}

// GET /admin/clients/{name} answers one client; an unknown name is 404
// in the admin API's (OpenAI's) error shape, naming it; without the
// admin token 401.
func TestAdminClientByName(t *testing.T) {
	up := &metered{In: 100, Out: 150}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	h := newHarness(t, budgeted(srv.URL, config.Budget{Window: config.WindowDay, Tokens: 1000}))
	r := h.admin(http.MethodGet, "/admin/clients/bob")
	var bob map[string]any
	if r.status != 200 || json.Unmarshal(r.body, &bob) != nil || bob["client"] != "bob" || bob["configured"] != true || bob["budgets"] != nil {
		t.Fatalf("GET /admin/clients/bob = %d %s", r.status, r.body)
	}
	if strings.Contains(string(r.body), "key-") {
		t.Fatalf("a key in %s", r.body)
	}
	e := wantOpenAIError(t, h.admin(http.MethodGet, "/admin/clients/mallory"), http.StatusNotFound)
	if e["code"] != "client_not_found" || !strings.Contains(e["message"].(string), `"mallory"`) {
		t.Fatalf("unknown client error = %v", e)
	}
	if r := h.do(http.MethodGet, "/admin/clients/bob", "", nil); r.status != http.StatusUnauthorized {
		t.Fatalf("without the token = %d, want 401", r.status)
	}
}
