package gateway

import (
	"context"
	"fmt"
	"github.com/llmgate/llmgate/breaker"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway/timeline"
)

// offsetClock is real time shifted by an offset the test sets: durations
// stay real (the charts' latency is measured), while the test decides
// which minute each step of its traffic lands in. Its minute 2 is about
// when the test looks at the page, so that the times the page shows from
// other clocks (the breaker's is real time) agree with the charts; its
// earlier minutes are in the past, so the test raises retry.deadline above
// the whole story, and no deadline computed from this clock is already
// over.
type offsetClock struct {
	base time.Time // minute 0, a minute boundary
	off  atomic.Int64
}

func newOffsetClock() *offsetClock {
	return &offsetClock{base: time.Now().UTC().Add(-100 * time.Second).Truncate(time.Minute)}
}

func (c *offsetClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

// at moves the clock to sec seconds into minute k after base. The test
// only ever moves it forward.
func (c *offsetClock) at(k, sec int) {
	target := c.base.Add(time.Duration(k)*time.Minute + time.Duration(sec)*time.Second)
	c.off.Store(int64(time.Until(target)))
}

func (c *offsetClock) minute(k int) string {
	return c.base.Add(time.Duration(k) * time.Minute).Format("15:04")
}

// newClockHarness is newHarness with the gateway on clock.
func newClockHarness(t *testing.T, clock func() time.Time, mutate func(c *config.Config)) *harness {
	t.Helper()
	return newHarnessOptions(t, mutate, nil, fakeprovider.Options{}, func(o *Options) { o.Now = clock })
}

// waitLogged waits (bounded) until n request lines are written: each
// request is charted by its log line's defer, which may run just after the
// client has its answer, and the clock must not move on before.
func (h *harness) waitLogged(n int) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(h.requestLines()) < n {
		if time.Now().After(deadline) {
			h.t.Fatalf("%d request lines, want %d; logs:\n%s", len(h.requestLines()), n, h.logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// chartsDOM is what the test reads back from the rendered page.
type chartsDOM struct {
	Requests    int `json:"requests"`
	Retries     int `json:"retries"`
	DeadLetters int `json:"deadLetters"`
	Height      int `json:"height"`
	// Per minute ("15:04"): count by class, p50/p99 in ms, retries, dead
	// letters, breaker state and time in it.
	Classes  map[string]map[string]int `json:"classes"`
	Titles   map[string]string         `json:"titles"`
	P50      map[string]float64        `json:"p50"`
	P99      map[string]float64        `json:"p99"`
	Retry    map[string]int            `json:"retry"`
	Dead     map[string]int            `json:"dead"`
	State    map[string]string         `json:"state"`
	OpenMs   map[string]int            `json:"openMs"`
	ClosedMs map[string]int            `json:"closedMs"`
	Cells    int                       `json:"cells"`
	Store    int                       `json:"storeSamples"`
	Legend   []string                  `json:"legend"`
}

const readCharts = `(() => {
  const svg = document.querySelector('#chart-primary svg.chart');
  const groups = (lane) => [...svg.querySelectorAll('g.lane.' + lane + ' g.minute')];
  const out = {requests: +svg.dataset.requests, retries: +svg.dataset.retries, deadLetters: +svg.dataset.deadLetters,
    height: Math.round(svg.getBoundingClientRect().height),
    classes: {}, titles: {}, p50: {}, p99: {}, retry: {}, dead: {}, state: {}, openMs: {}, closedMs: {}, cells: 0,
    storeSamples: +document.querySelector('#chart-store').dataset.samples,
    legend: [...document.querySelectorAll('#charts .legend code')].map(c => c.textContent)};
  for (const g of groups('requests')) {
    const m = g.dataset.minute, by = {};
    for (const r of g.querySelectorAll('rect')) by[r.dataset.class] = +r.dataset.count;
    out.classes[m] = by;
    out.titles[m] = g.querySelector('title').textContent;
  }
  for (const g of groups('latency')) { out.p50[g.dataset.minute] = +g.dataset.p50Ms; out.p99[g.dataset.minute] = +g.dataset.p99Ms; }
  for (const g of groups('retries')) out.retry[g.dataset.minute] = +g.dataset.total;
  for (const g of groups('deadletters')) out.dead[g.dataset.minute] = +g.dataset.total;
  for (const g of groups('breaker')) {
    out.cells++;
    out.state[g.dataset.minute] = g.dataset.state;
    out.openMs[g.dataset.minute] = +g.dataset.openMs;
    out.closedMs[g.dataset.minute] = +g.dataset.closedMs;
  }
  return out;
})()`

// TestAdminChartsInBrowser scripts an hour's story on a moving clock —
// minutes of successes at different latencies, then a minute of transient
// failures that were retried and one that was not saved by its retries
// (a dead letter), then a breaker forced open that refuses a keyed request
// (another dead letter) — and reads each minute's numbers back from the
// page's SVG in a real browser.
func TestAdminChartsInBrowser(t *testing.T) {
	ctx := newBrowser(t, 90*time.Second)
	clk := newOffsetClock()
	clk.at(-10, 1)
	h := newClockHarness(t, clk.Now, func(c *config.Config) {
		c.Retry.MaxAttempts = 3
		c.Retry.Deadline = config.Duration(time.Hour) // see offsetClock
		c.Breaker.ConsecutiveFailures = 5
	})
	sent := 0
	send := func(status int, hdr map[string]string) {
		t.Helper()
		if r := h.chat(chatBody, hdr); r.status != status {
			t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
		}
		sent++
	}

	// Eight minutes of successes, a few keyed (records for the store's
	// chart), each minute slower than the one before.
	delays := []int{12, 18, 15, 25, 30, 22, 40, 35} // ms
	counts := []int{3, 5, 4, 6, 5, 7, 4, 6}
	total := 0
	for i := range delays {
		k := i - 8
		clk.at(k, 1)
		h.fake.SetDefault(fakeprovider.Step{Delay: time.Duration(delays[i]) * time.Millisecond})
		for j := range counts[i] {
			var hdr map[string]string
			if j%2 == 0 {
				hdr = key(fmt.Sprintf("history/%d/%d", k, j))
			}
			send(http.StatusOK, hdr)
		}
		total += counts[i]
		h.waitLogged(sent)
		h.gw.registry.Gather() // as Prometheus scrapes: a store sample
	}

	// Minute 0: two requests that succeed on their retry, one keyed
	// request that is still failing after three attempts, three plain
	// successes.
	clk.at(0, 1)
	h.fake.SetDefault(fakeprovider.Step{Delay: 10 * time.Millisecond})
	for range 2 {
		h.fake.Enqueue(fakeprovider.Step{Status: 503}, fakeprovider.Step{})
		send(http.StatusOK, nil)
	}
	h.fake.Enqueue(fakeprovider.Step{Status: 503}, fakeprovider.Step{Status: 503}, fakeprovider.Step{Status: 503})
	send(http.StatusServiceUnavailable, key("invoice-7/summary"))
	for range 3 {
		send(http.StatusOK, nil)
	}
	total += 6
	h.waitLogged(sent)

	// Minute 1: the operator forces the breaker open; a keyed request and
	// an unkeyed one are refused.
	clk.at(1, 1)
	if err := h.gw.admin.SetBreakerForced(context.Background(), breaker.Key{Upstream: "primary"}, true); err != nil {
		t.Fatal(err)
	}
	send(http.StatusServiceUnavailable, key("invoice-8/summary"))
	send(http.StatusServiceUnavailable, nil)
	total += 2
	h.waitLogged(sent)

	// Some seconds into minute 2 — real time, when that is in minute 2 —
	// the operator looks.
	look := min(max(int(time.Since(clk.base.Add(2*time.Minute))/time.Second), 10), 55)
	clk.at(2, look)
	err := chromedp.Do(ctx,
		chromedp.Navigate(h.srv.URL+"/admin/login"),
		chromedp.WaitVisible(chromedp.CSS(`#token`)),
		chromedp.SendKeys(chromedp.CSS(`#token`), adminToken),
		chromedp.Click(chromedp.CSS(`button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#chart-primary svg.chart`)),
	)
	if err != nil {
		t.Fatalf("log in: %v", err)
	}
	got := run(t, ctx, chromedp.Evaluate[chartsDOM](readCharts))
	shot := run(t, ctx, chromedp.FullScreenshot(100))

	// The hour's totals, on the chart's root.
	if got.Requests != total || got.Retries != 4 || got.DeadLetters != 2 {
		t.Errorf("chart totals: %d requests, %d retries, %d dead letters; want %d, 4, 2", got.Requests, got.Retries, got.DeadLetters, total)
	}
	if got.Height < 200 {
		t.Errorf("the chart is %d px high: not drawn", got.Height)
	}
	if got.Cells != 60 {
		t.Errorf("%d breaker cells, want one per minute of the hour (60)", got.Cells)
	}
	// Minute by minute: successes, each slower minute's p50 at or above
	// its upstream's delay (within the histogram's error).
	for i := range delays {
		m := clk.minute(i - 8)
		if c := got.Classes[m]; len(c) != 1 || c["success"] != counts[i] {
			t.Errorf("%s: classes %v, want %d success", m, c, counts[i])
		}
		if p50, p99 := got.P50[m], got.P99[m]; p50 < float64(delays[i])*(1-timeline.MaxRelativeError) || p99 < p50 {
			t.Errorf("%s: p50 %.3f ms, p99 %.3f ms; the upstream took %d ms", m, p50, p99, delays[i])
		}
		if got.State[m] != "closed" || got.OpenMs[m] != 0 {
			t.Errorf("%s: breaker %s, open %d ms; want closed", m, got.State[m], got.OpenMs[m])
		}
	}
	m0, m1, m2 := clk.minute(0), clk.minute(1), clk.minute(2)
	if c := got.Classes[m0]; len(c) != 2 || c["success"] != 5 || c["transient"] != 1 {
		t.Errorf("%s: classes %v, want 5 success, 1 transient", m0, c)
	}
	if title := got.Titles[m0]; !strings.Contains(title, "6 requests: success 5, transient 1") {
		t.Errorf("%s: bar title %q", m0, title)
	}
	if got.Retry[m0] != 4 || got.Dead[m0] != 1 {
		t.Errorf("%s: %d retries, %d dead letters; want 4, 1", m0, got.Retry[m0], got.Dead[m0])
	}
	if got.P99[m0] < got.P50[m0] {
		t.Errorf("%s: p99 %.3f ms under p50 %.3f ms", m0, got.P99[m0], got.P50[m0])
	}
	if c := got.Classes[m1]; len(c) != 1 || c["breaker_open"] != 2 {
		t.Errorf("%s: groups %v, want 2 breaker_open (refused by the open breaker)", m1, c)
	}
	if got.Retry[m1] != 0 || got.Dead[m1] != 1 {
		t.Errorf("%s: %d retries, %d dead letters; want 0, 1", m1, got.Retry[m1], got.Dead[m1])
	}
	// The breaker band: closed through minute 0, open from a second into
	// minute 1, still open when the page is read. (Each state's time is
	// shown in whole milliseconds, rounded down.)
	if got.State[m0] != "closed" || got.ClosedMs[m0] != 60000 {
		t.Errorf("%s: breaker %s, closed %d ms; want closed all minute", m0, got.State[m0], got.ClosedMs[m0])
	}
	if got.State[m1] != "open" || got.OpenMs[m1] < 55000 || math.Abs(float64(got.OpenMs[m1]+got.ClosedMs[m1]-60000)) > 2 {
		t.Errorf("%s: breaker %s, open %d ms, closed %d ms; want open from 1 s in", m1, got.State[m1], got.OpenMs[m1], got.ClosedMs[m1])
	}
	if got.State[m2] != "open" || math.Abs(float64(got.OpenMs[m2]-1000*look)) > 5000 {
		t.Errorf("%s: breaker %s, open %d ms; want open for the %d s so far", m2, got.State[m2], got.OpenMs[m2], look)
	}
	if _, ok := got.Classes[m2]; ok {
		t.Errorf("%s: requests charted in a minute without traffic: %v", m2, got.Classes[m2])
	}
	if got.Store < 9 {
		t.Errorf("%d store samples, want one per minute with traffic and one for the page", got.Store)
	}
	if strings.Join(got.Legend, ",") != "success,transient,breaker_open" {
		t.Errorf("legend %v", got.Legend)
	}

	// html/template had nothing to neutralise (ZgotmplZ marks a value it
	// refused in a URL, CSS or attribute-name context).
	if body := string(h.page(http.MethodGet, "/admin/", nil, h.login(), nil).body); strings.Contains(body, "ZgotmplZ") {
		t.Error("the page has a value html/template refused (ZgotmplZ)")
	}

	writeShot(t, filepath.Join(t.TempDir(), "admin-charts.png"), shot)
	if p := os.Getenv("LLMGATE_CHARTS_SCREENSHOT"); p != "" {
		writeShot(t, p, shot)
	}
}
