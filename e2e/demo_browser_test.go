package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/gateway/outcome"
)

const chromiumPath = "/usr/bin/chromium"

// newBrowser starts a headless Chromium for the test (skipping without
// one, unless LLMGATE_REQUIRE_BROWSER=1) and returns a tab's context.
func newBrowser(t *testing.T, timeout time.Duration) context.Context {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("LLMGATE_REQUIRE_BROWSER") == "1" {
			t.Fatalf("LLMGATE_REQUIRE_BROWSER=1 but there is no browser at %s: %v", chromiumPath, err)
		}
		t.Skipf("no browser at %s (apt-get install chromium): %v", chromiumPath, err)
	}
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(chromiumPath), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	tabCtx, cancelTab := chromedp.NewContext(allocCtx)
	t.Cleanup(cancel)
	t.Cleanup(cancelAlloc)
	t.Cleanup(cancelTab)
	if err := chromedp.Do(tabCtx); err != nil {
		t.Fatalf("starting %s: %v", chromiumPath, err)
	}
	return tabCtx
}

// metricSeries is one scrape of /metrics, parsed with Prometheus' text
// parser: each series' value by name and its labels ("k=v,k=v", sorted).
type metricSeries map[string]map[string]float64

func (tr *tour) scrape() metricSeries {
	tr.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, tr.base+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+tr.token)
	res, err := httpClient.Do(req)
	if err != nil {
		tr.t.Fatal(err)
	}
	defer res.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(res.Body)
	if err != nil {
		tr.t.Fatal(err)
	}
	out := metricSeries{}
	for name, f := range fams {
		out[name] = map[string]float64{}
		for _, m := range f.Metric {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			slices.Sort(ls)
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			out[name][strings.Join(ls, ",")] = v
		}
	}
	return out
}

// value is a series' value; a series that does not exist (yet) is 0.
func (m metricSeries) value(name string, labels ...string) float64 {
	slices.Sort(labels)
	return m[name][strings.Join(labels, ",")]
}

// sum adds up the series of name whose labels include every one of labels,
// by the value of the label by.
func (m metricSeries) sum(name, by string, labels ...string) map[string]float64 {
	out := map[string]float64{}
	for ls, v := range m[name] {
		parts := strings.Split(ls, ",")
		ok := true
		for _, l := range labels {
			ok = ok && slices.Contains(parts, l)
		}
		if !ok {
			continue
		}
		for _, p := range parts {
			if k, val, _ := strings.Cut(p, "="); k == by {
				out[val] += v
			}
		}
	}
	return out
}

// pageBreaker is a breaker's row as the browser shows it.
type pageBreaker struct {
	ID          string `json:"id"`
	State       string `json:"state"`
	OpenedBy    string `json:"openedBy"`
	Requests    int    `json:"requests"`
	OK          int    `json:"ok"`
	Failed      int    `json:"failed"`
	Rejected    int    `json:"rejected"`
	Consecutive int    `json:"consecutive"`
	LastClass   string `json:"lastClass"`
	LastAt      string `json:"lastAt"`
}

type pageView struct {
	Breakers      []pageBreaker  `json:"breakers"`
	ChartRequests int            `json:"chartRequests"`
	ChartGroups   map[string]int `json:"chartGroups"`
	ChartState    string         `json:"chartState"`
}

const readBreakers = `(() => {
  const num = (r, c) => +r.querySelector('td.' + c).textContent.trim();
  const breakers = [...document.querySelectorAll('#breakers tbody tr')].map(r => ({
    id: r.id, state: r.querySelector('.badge.state').textContent.trim(),
    openedBy: r.querySelector('td.opened-by').textContent.trim(),
    requests: num(r, 'requests'), ok: num(r, 'ok'), failed: num(r, 'failed'), rejected: num(r, 'rejected'),
    consecutive: num(r, 'consecutive'),
    lastClass: (r.querySelector('td.last-failure code') || {textContent: ''}).textContent,
    lastAt: (r.querySelector('td.last-failure code + span') || {textContent: ''}).textContent}));
  const fig = document.getElementById('chart-demo-down');
  const groups = {};
  for (const g of fig.querySelectorAll('figcaption .group')) groups[g.dataset.group] = +g.dataset.count;
  return {breakers, chartRequests: +fig.querySelector('svg.chart').dataset.requests, chartGroups: groups,
    chartState: fig.querySelector('figcaption .badge.state').textContent.trim()};
})()`

// TestDemoDownInBrowser takes the README tour's "An open breaker" steps
// against the real -demo binary — six keyed requests to demo-down, five
// failing until its breaker opens, the sixth refused — and opens the
// operator's page in a real Chromium: the breaker's row (what opened it,
// its last failure's class, when, its counts) and demo-down's chart must
// say what /admin/breakers and /metrics say, value for value.
func TestDemoDownInBrowser(t *testing.T) {
	ctx := newBrowser(t, 120*time.Second)
	cfg := filepath.Join(t.TempDir(), "gateway.yaml")
	// A long open_timeout: the breaker must not half-open while the test
	// compares; a short backoff keeps the retries quick.
	writeFile(t, cfg, "breaker:\n  open_timeout: 5m\nretry:\n  base_delay: 20ms\n")
	tr := startDemoTour(t, []string{"-demo", "-config", cfg},
		[]string{"GATEWAY_ADDR=127.0.0.1:0", "GATEWAY_DATA_DIR=" + t.TempDir(), "GATEWAY_ADMIN_TOKEN=", "OPENAI_API_KEY=", "OPENAI_BASE_URL="})
	before := tr.scrape()

	down := `{"model":"demo-down","messages":[{"role":"user","content":"Hello"}]}`
	for i := 1; i <= 6; i++ {
		if status, _, b := post(t, tr.chat(), down, map[string]string{"Idempotency-Key": fmt.Sprintf("tour-down-%d", i)}); status != 503 {
			t.Fatalf("tour-down-%d: %d %s", i, status, b)
		}
		if want := map[bool]string{true: "open", false: "closed"}[i >= 5]; tr.breaker("demo-down") != want {
			t.Fatalf("after tour-down-%d the breaker of demo-down is %s, want %s", i, tr.breaker("demo-down"), want)
		}
	}
	tr.waitLog(`"model":"demo-down"`, `"class":"breaker_open"`, `"attempts":0`)

	var js struct{ Breakers []breaker.Status }
	if got := tr.admin(http.MethodGet, "/admin/breakers", &js); got != 200 {
		t.Fatalf("GET /admin/breakers: %d", got)
	}
	after := tr.scrape()

	if err := chromedp.Do(ctx, chromedp.Navigate(tr.signIn), chromedp.WaitVisible(chromedp.CSS(`#chart-demo-down svg.chart`))); err != nil {
		t.Fatalf("signing in with the printed link: %v", err)
	}
	page, err := chromedp.Run(ctx, chromedp.Evaluate[pageView](readBreakers))
	if err != nil {
		t.Fatal(err)
	}
	var again struct{ Breakers []breaker.Status }
	tr.admin(http.MethodGet, "/admin/breakers", &again)
	if !reflect.DeepEqual(again.Breakers, js.Breakers) { // the values, not the pointers
		t.Fatalf("/admin/breakers changed while the page was read:\n%+v\n%+v", js.Breakers, again.Breakers)
	}

	compareBreakers(t, js.Breakers, page.Breakers, before, after)
	compareChart(t, page, before, after)
}

// compareBreakers holds each of demo-down's breakers on the page to its
// JSON and to the breaker series in /metrics.
func compareBreakers(t *testing.T, js []breaker.Status, rows []pageBreaker, before, after metricSeries) {
	t.Helper()
	byID := map[string]pageBreaker{}
	for _, r := range rows {
		byID[r.ID] = r
	}
	opened := 0
	for _, st := range js {
		if st.Name != "demo-down" {
			continue
		}
		id := "breaker-" + st.Name
		if st.Model != "" {
			id += "/" + st.Model
		}
		row, ok := byID[id]
		if !ok {
			t.Errorf("no row %s on the page", id)
			continue
		}
		if row.State != string(st.State) || row.Requests != int(st.Requests) || row.OK != int(st.TotalSuccesses) ||
			row.Failed != int(st.TotalFailures) || row.Rejected != int(st.Rejected) || row.Consecutive != int(st.ConsecutiveFailures) ||
			row.LastClass != st.LastFailureClass {
			t.Errorf("%s: the page shows %+v; /admin/breakers says %+v", id, row, st)
		}
		if at := st.LastFailureAt; (at == nil) != (row.LastAt == "") || at != nil && !strings.HasPrefix(row.LastAt, at.UTC().Format("15:04:05")) {
			t.Errorf("%s: the page's last failure at %q; /admin/breakers says %v", id, row.LastAt, at)
		}
		ls := []string{"upstream=" + st.Name, "model=" + st.Model}
		stateValue := map[breaker.State]float64{breaker.Closed: 0, breaker.HalfOpen: 1, breaker.Open: 2}[st.State]
		if got := after.value("llmgate_breaker_state", ls...); got != stateValue {
			t.Errorf("%s: llmgate_breaker_state %v, /admin/breakers says %s", id, got, st.State)
		}
		opens := after.value("llmgate_breaker_transitions_total", append(ls, "from=closed", "to=open")...) -
			before.value("llmgate_breaker_transitions_total", append(ls, "from=closed", "to=open")...)
		rejected := after.value("llmgate_breaker_rejections_total", ls...) - before.value("llmgate_breaker_rejections_total", ls...)
		if rejected != float64(st.Rejected) {
			t.Errorf("%s: %v rejections in /metrics, %d in /admin/breakers", id, rejected, st.Rejected)
		}
		if st.State != breaker.Open {
			if opens != 0 || st.OpenedBy != nil || row.OpenedBy != "—" {
				t.Errorf("%s (%s): %v openings in /metrics, opened_by %+v, page %q", id, st.State, opens, st.OpenedBy, row.OpenedBy)
			}
			continue
		}
		opened++
		if opens != 1 {
			t.Errorf("%s: %v closed→open transitions in /metrics, want 1", id, opens)
		}
		tr := st.OpenedBy
		if tr == nil || st.OpenedAt == nil || !tr.At.Equal(*st.OpenedAt) {
			t.Fatalf("%s: open, opened_by %+v, opened_at %v", id, tr, st.OpenedAt)
		}
		want := fmt.Sprintf("%d failures in a row (last: %s), %s", tr.Failures, tr.Class, tr.At.UTC().Format("15:04:05"))
		if tr.Reason != "consecutive_failures" || tr.Failures != 5 || tr.Class != "transient" || !strings.HasPrefix(row.OpenedBy, want) {
			t.Errorf("%s: the page says opened by %q; /admin/breakers says %+v (want the page to start %q)", id, row.OpenedBy, tr, want)
		}
	}
	if opened != 1 {
		t.Errorf("%d of demo-down's breakers open, want 1: %+v", opened, js)
	}
}

// compareChart holds demo-down's chart header to llmgate_requests_total,
// grouped by outcome.GroupOf.
func compareChart(t *testing.T, page pageView, before, after metricSeries) {
	t.Helper()
	want, total := map[string]int{}, 0
	now, then := after.sum("llmgate_requests_total", "outcome", "upstream=demo-down"),
		before.sum("llmgate_requests_total", "outcome", "upstream=demo-down")
	for class, n := range now {
		if d := int(n - then[class]); d > 0 {
			want[string(outcome.GroupOf(classify.Class(class)))] += d
			total += d
		}
	}
	if want["transient"] != 5 || want["breaker_open"] != 1 || total != 6 {
		t.Errorf("/metrics counts demo-down's requests as %v (from %v), want 5 transient and 1 breaker_open", want, now)
	}
	if page.ChartRequests != total || !maps.Equal(page.ChartGroups, want) {
		t.Errorf("the chart of demo-down says %d requests, %v; /metrics says %d, %v", page.ChartRequests, page.ChartGroups, total, want)
	}
	if page.ChartState != "open" {
		t.Errorf("the chart of demo-down shows its upstream's state %q, want open", page.ChartState)
	}
}
