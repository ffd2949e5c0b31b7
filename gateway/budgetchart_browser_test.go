package gateway

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/llmgate/llmgate/config"
)

// budgetDOM is what a browser draws of alice's minute budget chart.
type budgetDOM struct {
	Found   bool    `json:"found"`
	Height  float64 `json:"height"`
	Limit   int     `json:"limit"`
	Spent   int     `json:"spent"`
	Samples int     `json:"samples"`
	// LimitWidth is the drawn width of the budget line; LimitTop and
	// LastTop the screen y of the line and of the last sample.
	LimitWidth float64 `json:"limitWidth"`
	LimitTop   float64 `json:"limitTop"`
	LastTop    float64 `json:"lastTop"`
	Points     int     `json:"points"`
	Caption    string  `json:"caption"`
}

const readBudgetChart = `(() => {
  const fig = document.getElementById('budget-alice-minute.tokens.total');
  if (!fig) return {found: false};
  const svg = fig.querySelector('svg.chart');
  const limit = svg.querySelector('line.limit').getBoundingClientRect();
  const dots = [...svg.querySelectorAll('circle.sample')];
  const last = dots.length ? dots[dots.length - 1].getBoundingClientRect() : {top: 0, height: 0};
  const line = svg.querySelector('polyline.spent');
  return {found: true, height: svg.getBoundingClientRect().height, limit: +fig.dataset.limit, spent: +fig.dataset.spent,
    samples: +fig.dataset.samples, limitWidth: limit.width, limitTop: limit.top + limit.height / 2,
    lastTop: last.top + last.height / 2, points: line ? line.points.numberOfItems : 0,
    caption: fig.querySelector('figcaption').textContent};
})()`

// The budget chart renders in a browser: the budget line across the
// plot, above the spent line's last sample (500 of 1000 spent), with
// one point per sample taken.
func TestBudgetChartInBrowser(t *testing.T) {
	ctx := newBrowser(t, 60*time.Second)
	up := &metered{In: 100, Out: 150}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	clock := newOffsetClock()
	h := newClockHarness(t, clock.Now, budgeted(srv.URL, config.Budget{Window: config.WindowMinute, Tokens: 1000}))
	clock.at(3, 5)
	h.chat(budgetChat, alice)
	_ = h.metricsText()
	clock.at(3, 20)
	h.chat(budgetChat, alice)
	clock.at(3, 40)
	err := chromedp.Do(ctx,
		chromedp.Navigate(h.srv.URL+"/admin/login"),
		chromedp.WaitVisible(chromedp.CSS(`#token`)),
		chromedp.SendKeys(chromedp.CSS(`#token`), adminToken),
		chromedp.Click(chromedp.CSS(`button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#budgets svg.chart`)),
	)
	if err != nil {
		t.Fatalf("log in: %v", err)
	}
	got := run(t, ctx, chromedp.Evaluate[budgetDOM](readBudgetChart))
	if !got.Found || got.Limit != 1000 || got.Spent != 500 || got.Samples != 2 || got.Points != 2 {
		t.Fatalf("budget chart = %+v; want limit 1000, spent 500, 2 samples on the line", got)
	}
	if got.Height < 60 || got.LimitWidth < 500 {
		t.Errorf("chart %.0f px high, budget line %.0f px wide: not drawn", got.Height, got.LimitWidth)
	}
	if got.LimitTop >= got.LastTop {
		t.Errorf("budget line at y %.1f, last sample (half spent) at %.1f: the line should be above it", got.LimitTop, got.LastTop)
	}
	if p := os.Getenv("LLMGATE_SCREENSHOT"); p != "" {
		writeShot(t, strings.TrimSuffix(p, filepath.Ext(p))+"-budget"+filepath.Ext(p), run(t, ctx, chromedp.FullScreenshot(100)))
	}
}
