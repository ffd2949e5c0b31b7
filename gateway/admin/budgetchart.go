package admin

// The page's budget charts: for each budget of each budgeted client, its
// spend over the current window (the samples budget.View keeps, at most
// budget.ChartSamples a window) against its limit, drawn as inline SVG
// like the other charts (charts.go): the geometry is worked out here,
// page.html only places it, and every sample carries its numbers in a
// <title> and in data-* attributes.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/budget"
)

// The layout of one budget's chart, in SVG user units: the same gutters
// and plot width as the upstreams' charts.
const (
	budgetPlotH = 90.0
	budgetTop   = 8.0
)

const (
	colorSpent = "#0969da"
	colorLimit = "#cf222e"
)

// budgetChartsView is the budgets section of the page.
type budgetChartsView struct {
	Charts []budgetChart
	// Failed are the clients whose budgets could not be read.
	Failed []string
}

// budgetChart is one budget of one client over its current window.
type budgetChart struct {
	ID                      string // budget-<client>-<budget>
	Client, Budget, Window  string
	Limit, Spent, Held      int64
	Remaining               int64
	LimitText, SpentText    string
	HeldText, RemainingText string
	Reset                   string
	W, H                    float64
	X1, X2, Top, Bottom     float64
	LimitY                  float64
	ScaleText               string // the amount at the plot's top
	Points                  string // the spent line: "x,y x,y …"
	Dots                    []budgetDot
	Axis                    []axisLabel
	AxisY                   float64
	LimitColor, SpentColor  string
}

// budgetDot is one sample of the spent line.
type budgetDot struct {
	X, Y         float64
	Slot         int
	Spent, Held  int64
	Title, Label string
}

// budgetCharts reads the budgets' samples (nil without budgets or none
// budgeted).
func (a *Admin) budgetCharts(ctx context.Context) *budgetChartsView {
	if a.budgets == nil {
		return nil
	}
	series, failed := a.budgets.Chart(ctx)
	if len(series) == 0 && len(failed) == 0 {
		return nil
	}
	v := &budgetChartsView{Failed: failed}
	for _, s := range series {
		v.Charts = append(v.Charts, budgetChartOf(s))
	}
	return v
}

// budgetChartOf lays out one budget's chart: time across the whole
// window, from its start to its reset, each sample at the start of its
// slot; amounts up to the limit or the
// most spent, whichever is higher, and a tenth more.
func budgetChartOf(s budget.Series) budgetChart {
	st := s.Status
	c := budgetChart{ID: "budget-" + s.Client + "-" + st.Budget, Client: s.Client, Budget: st.Budget, Window: st.Window,
		Limit: st.Limit, Spent: st.Spent, Held: st.Held, Remaining: st.Remaining,
		LimitText: amount(st.Unit, st.Limit), SpentText: amount(st.Unit, st.Spent), HeldText: amount(st.Unit, st.Held),
		RemainingText: amount(st.Unit, st.Remaining), Reset: st.Reset.UTC().Format("2006-01-02 15:04 UTC"),
		W: chartW, X1: chartLeft, X2: chartLeft + chartPlot, Top: budgetTop, Bottom: budgetTop + budgetPlotH,
		LimitColor: colorLimit, SpentColor: colorSpent}
	c.H = c.Bottom + axisHeight + 4
	c.AxisY = c.Bottom + 14
	top := st.Limit
	for _, p := range s.Samples {
		top = max(top, p.Spent)
	}
	top = max(cache.AddCapped(top, top/10), 1) // a saturated spend must not wrap
	c.ScaleText = amount(st.Unit, top)
	y := func(v int64) float64 { return r1(c.Bottom - float64(v)/float64(top)*budgetPlotH) }
	c.LimitY = y(st.Limit)
	span := st.Reset.Sub(s.Start)
	x := func(t time.Time) float64 {
		f := min(max(float64(t.Sub(s.Start))/float64(span), 0), 1)
		return r1(chartLeft + f*chartPlot)
	}
	var pts []string
	for _, p := range s.Samples {
		d := budgetDot{X: r1(chartLeft + float64(p.Slot)*chartPlot/budget.ChartSamples), Y: y(p.Spent), Slot: p.Slot, Spent: p.Spent, Held: p.Held,
			Label: p.At.UTC().Format("2006-01-02 15:04:05")}
		d.Title = fmt.Sprintf("%s UTC: %s spent, %s held", d.Label, amount(st.Unit, p.Spent), amount(st.Unit, p.Held))
		c.Dots = append(c.Dots, d)
		pts = append(pts, strconv.FormatFloat(d.X, 'f', -1, 64)+","+strconv.FormatFloat(d.Y, 'f', -1, 64))
	}
	c.Points = strings.Join(pts, " ")
	for i := range 5 {
		t := s.Start.Add(span * time.Duration(i) / 4)
		c.Axis = append(c.Axis, axisLabel{X: x(t), Label: windowTick(st.Window, t)})
	}
	return c
}

// amount is a budget's amount for people: tokens, or money for a cost
// budget (micro-units).
func amount(unit string, v int64) string {
	if unit == "cost" {
		// "2.000000" → "2.00", "0.005615" stays.
		m := config.Money(v).String()
		for dot := strings.IndexByte(m, '.'); dot >= 0 && strings.HasSuffix(m, "0") && len(m)-dot > 3; {
			m = m[:len(m)-1]
		}
		return m
	}
	return strconv.FormatInt(v, 10)
}

// windowTick labels a point of a window's axis.
func windowTick(window string, t time.Time) string {
	t = t.UTC()
	switch window {
	case config.WindowMinute:
		return t.Format("15:04:05")
	case config.WindowMonth:
		return t.Format("Jan 2 15:04")
	}
	return t.Format("15:04")
}
