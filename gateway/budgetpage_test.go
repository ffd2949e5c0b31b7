package gateway

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/config"
)

var (
	budgetFigure = regexp.MustCompile(`<figure class="chart-box" id="budget-alice-minute.tokens.total"[^>]*data-limit="(\d+)" data-spent="(\d+)"[^>]*data-samples="(\d+)">`)
	budgetSample = regexp.MustCompile(`<circle class="sample" cx="([\d.]+)" cy="[\d.]+" r="2.6" fill="[^"]+" data-slot="(\d+)" data-at="[^"]+" data-spent="(\d+)"`)
	budgetLimit  = regexp.MustCompile(`<line class="limit" [^>]*data-limit="(\d+)"`)
)

// budgetChartOn reads alice's minute budget chart on the page: its
// limit and spent, and its samples as slot:spent@x.
func budgetChartOn(t *testing.T, h *harness, cookies []*http.Cookie) (limit, spent string, samples []string) {
	t.Helper()
	r := h.page(http.MethodGet, "/admin/", nil, cookies, nil)
	body := string(r.body)
	i := strings.Index(body, `<section class="card" id="budgets">`)
	if r.status != 200 || i < 0 {
		t.Fatalf("page: %d, budgets section at %d", r.status, i)
	}
	body = body[i:]
	m := budgetFigure.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no chart of alice's minute budget in:\n%s", body[:min(len(body), 3000)])
	}
	if l := budgetLimit.FindStringSubmatch(body); l == nil || l[1] != m[1] {
		t.Fatalf("the budget line: %v, want data-limit %s", l, m[1])
	}
	for _, s := range budgetSample.FindAllStringSubmatch(body, -1) {
		samples = append(samples, s[2]+":"+s[3]+"@"+s[1])
	}
	if fmt.Sprint(len(samples)) != m[3] {
		t.Fatalf("data-samples %s, %d circles", m[3], len(samples))
	}
	if strings.Contains(body, "key-alice") {
		t.Fatal("alice's key on the page")
	}
	return m[1], m[2], samples
}

// The page charts alice's minute budget over its window from the reads
// of the page, /admin/clients and /metrics: one sample per slot of a
// sixtieth of the window (1 s here) read, at its place in the window
// (x = 130 + slot/60 × 900), with the limit drawn; spent as
// /admin/clients says it. A new window starts a new chart.
func TestBudgetChartOnPage(t *testing.T) {
	up := &metered{In: 100, Out: 150}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	minute := config.Budget{Window: config.WindowMinute, Tokens: 10000}
	clock := newOffsetClock()
	h := newClockHarness(t, clock.Now, budgeted(srv.URL, minute))
	cookies := h.login()
	charge := func() {
		if r := h.chat(budgetChat, alice); r.status != 200 {
			t.Fatalf("request: %d %s", r.status, r.body)
		}
	}
	clock.at(3, 0)
	charge()
	budgetChartOn(t, h, cookies)
	clock.at(3, 10)
	charge()
	adminClients(t, h) // a read of the budgets: a sample
	clock.at(3, 30)
	_ = h.metricsText()
	limit, spent, samples := budgetChartOn(t, h, cookies)
	if want := []string{"0:250@130", "10:500@280", "30:500@580"}; limit != "10000" || spent != "500" || fmt.Sprint(samples) != fmt.Sprint(want) {
		t.Fatalf("chart: limit %s, spent %s, samples %v; want 10000, 500, %v", limit, spent, samples, want)
	}
	if got := adminClients(t, h)["alice"].Budgets[0].Spent; fmt.Sprint(got) != spent {
		t.Fatalf("/admin/clients spent %d, chart %s", got, spent)
	}
	clock.at(4, 6)
	if _, spent, samples := budgetChartOn(t, h, cookies); spent != "0" || fmt.Sprint(samples) != "[6:0@220]" {
		t.Fatalf("next window: spent %s, samples %v; want 0, [6:0@220]", spent, samples)
	}
}
