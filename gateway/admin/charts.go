package admin

// The page's charts: the timeline's last hour drawn as inline SVG by
// html/template — no script, so the page's Content-Security-Policy stays
// as it is. The geometry is worked out here, in Go; page.html only places
// the shapes. Every minute's shapes carry their numbers twice: in a
// <title> (the browser's tooltip) and in data-* attributes, which is what
// the browser test reads back.

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/gateway/outcome"
	"github.com/llmgate/llmgate/gateway/timeline"
)

// The layout of one upstream's chart, in SVG user units: a left gutter
// for the lanes' names, the plot (every lane shares one time axis, so a
// minute is one column all the way down), a right gutter for the scales.
const (
	chartW     = 1080.0
	chartLeft  = 130.0
	chartPlot  = 900.0
	chartTop   = 6.0
	laneGap    = 12.0
	axisHeight = 18.0
)

// groupColors are the fills of the requests lane, by chart group
// (outcome.Groups): greens for answers, blues and purples for the
// client's or the account's problems, warm colours for the upstream
// failing, greys for the client leaving and the gateway's own errors.
var groupColors = map[outcome.Group]string{
	outcome.GroupSuccess:     "#2da44e",
	outcome.GroupReplay:      "#8dd6a0",
	outcome.GroupNotRetried:  "#54aeff",
	outcome.GroupClientError: "#8250df",
	outcome.GroupRefused:     "#bf3989",
	outcome.GroupTransient:   "#fb8f44",
	outcome.GroupBreakerOpen: "#cf222e",
	outcome.GroupClientLeft:  "#d0d7de",
	outcome.GroupGateway:     "#57606a",
}

const (
	colorP50      = "#0969da"
	colorP99      = "#bf3989"
	colorRetries  = "#e16f24"
	colorDead     = "#82071e"
	colorStore    = "#6e7781"
	colorClosed   = "#4ac26b"
	colorHalfOpen = "#d4a72c"
	colorOpen     = "#cf222e"
	colorNoData   = "#eaeef2"
)

// chartsView is the charts section of the page.
type chartsView struct {
	Window    string // "14:03–15:02:41 UTC"
	Width     string // "1 minute"
	MemoryKiB int
	Legend    []legendItem // the chart groups seen in the window
	Series    []legendItem // the other lanes' colours
	Upstreams []upstreamChart
	Store     storeChart
}

// legendItem is a key of the legend: a chart group's (Title: what it
// holds) or another lane's.
type legendItem struct{ Name, Fill, Title string }

// upstreamChart is one upstream's SVG: five lanes over one time axis.
type upstreamChart struct {
	Name        string
	W, H        float64
	Requests    int
	Groups      []groupCount // the requests by chart group, in the page's order; none empty
	Retries     int
	DeadLetters int
	OpenFor     string // time open in the window, "" if never
	State       breaker.State
	Req         barLane
	Lat         latencyLane
	Retry       barLane
	Dead        barLane
	Breaker     stateLane
	Axis        []axisLabel
	AxisY       float64
}

// frame is what every lane draws around its data: its name on the left,
// gridlines with their labels on the right, and a baseline.
type frame struct {
	Label, Sub          string
	LabelY, SubY        float64
	X1, X2              float64
	Top, Mid, Bottom, H float64
	Grid                []gridLine
}

type gridLine struct {
	Y, LabelY float64
	Label     string
}

func grid(y float64, label string) gridLine {
	return gridLine{Y: r1(y), LabelY: r1(y + 4), Label: label}
}

type barLane struct {
	frame
	Bars []barGroup
}

// barGroup is one minute's bar: one rect per series stacked from the
// baseline.
type barGroup struct {
	Minute string
	Total  int
	Title  string
	Segs   []barSeg
}

// groupCount is how many requests of a window ended in a chart group, and
// of which classes.
type groupCount struct {
	Group   outcome.Group
	Count   int
	Classes []classCount
}

type classCount struct {
	Class string
	Count int
}

// groupCounts sums buckets' class counts into chart groups, in
// outcome.Groups order, leaving out the empty ones.
func groupCounts(buckets ...timeline.Bucket) []groupCount {
	var out []groupCount
	for _, g := range outcome.Groups() {
		gc := groupCount{Group: g.Group}
		for _, b := range buckets {
			for _, cc := range b.Classes {
				if outcome.GroupOf(classify.Class(cc.Class)) == g.Group {
					gc.Count += cc.Count
					gc.Classes = addClass(gc.Classes, cc)
				}
			}
		}
		if gc.Count > 0 {
			out = append(out, gc)
		}
	}
	return out
}

func addClass(cs []classCount, cc timeline.ClassCount) []classCount {
	for i := range cs {
		if cs[i].Class == cc.Class {
			cs[i].Count += cc.Count
			return cs
		}
	}
	return append(cs, classCount{cc.Class, cc.Count})
}

// String is "replay 2" or, for a group of other classes, "transient 3
// (rate_limited 1, transient 2)".
func (g groupCount) String() string {
	s := fmt.Sprintf("%s %d", g.Group, g.Count)
	if len(g.Classes) == 1 && g.Classes[0].Class == string(g.Group) {
		return s
	}
	parts := make([]string, len(g.Classes))
	for i, c := range g.Classes {
		parts[i] = fmt.Sprintf("%s %d", c.Class, c.Count)
	}
	return s + " (" + strings.Join(parts, ", ") + ")"
}

type barSeg struct {
	X, Y, W, H float64
	Fill       string
	Class      string
	Count      int
}

type latencyLane struct {
	frame
	Empty    string
	P50, P99 []string // polyline point lists, one per run of minutes with requests
	Points   []latPoint
	Color50  string
	Color99  string
}

type latPoint struct {
	Minute       string
	Title        string
	X, Y50, Y99  float64
	P50ms, P99ms string
	Requests     int
}

type stateLane struct {
	frame
	Cells []stateCell
}

// stateCell is one minute of the breaker's band: the time in each state,
// stacked (closed at the bottom, open at the top) in proportion.
type stateCell struct {
	Minute                       string
	Title                        string
	State                        string // the state it spent the most time in, or "none"
	ClosedMs, HalfOpenMs, OpenMs int64
	Segs                         []barSeg
}

type axisLabel struct {
	X     float64
	Label string
}

type storeChart struct {
	W, H    float64
	Samples int
	Records barLane
	Axis    []axisLabel
	AxisY   float64
}

// r1 rounds to a tenth of a unit: short attributes, no float noise.
func r1(v float64) float64 { return math.Round(v*10) / 10 }

// geometry is the horizontal layout for a snapshot's buckets.
type geometry struct {
	col float64 // the width of one bucket's column
}

func (g geometry) x(i int) float64    { return chartLeft + float64(i)*g.col }
func (g geometry) barX(i int) float64 { return r1(g.x(i) + g.col*0.15) }
func (g geometry) barW() float64      { return r1(g.col * 0.7) }
func (g geometry) mid(i int) float64  { return r1(g.x(i) + g.col/2) }

func newFrame(label, sub string, top, h float64) frame {
	return frame{Label: label, Sub: sub, LabelY: top + 13, SubY: top + 27, X1: chartLeft, X2: chartLeft + chartPlot,
		Top: top, Mid: r1(top + h/2 + 4), Bottom: top + h, H: h}
}

func minuteLabel(t time.Time) string { return t.UTC().Format("15:04") }

// niceCeil is the smallest of 1, 2, 5 × 10^k at or above v (at least 1).
func niceCeil(v int) int {
	if v <= 1 {
		return 1
	}
	for p := 1; ; p *= 10 {
		for _, m := range []int{1, 2, 5} {
			if m*p >= v {
				return m * p
			}
		}
	}
}

// buildCharts lays out a timeline snapshot.
func buildCharts(s timeline.Snapshot, memBytes int) chartsView {
	g := geometry{col: chartPlot / float64(max(s.Buckets, 1))}
	v := chartsView{
		Window:    s.Start.UTC().Format("15:04") + "–" + s.End.UTC().Format("15:04:05") + " UTC",
		Width:     roughDuration(s.Width),
		MemoryKiB: (memBytes + 1023) / 1024,
	}
	if s.Width == time.Minute {
		v.Width = "1 minute"
	}
	seen := map[outcome.Group]bool{}
	for _, u := range s.Upstreams {
		c := upstreamChartOf(u, g, s)
		for _, gc := range c.Groups {
			seen[gc.Group] = true
		}
		v.Upstreams = append(v.Upstreams, c)
	}
	v.Legend = groupLegend(seen)
	v.Series = []legendItem{{"p50", colorP50, ""}, {"p99", colorP99, ""}, {"retries", colorRetries, ""}, {"dead letters", colorDead, ""},
		{"closed", colorClosed, ""}, {"half-open", colorHalfOpen, ""}, {"open", colorOpen, ""}}
	v.Store = storeChartOf(s, g)
	return v
}

// groupLegend is the legend's keys for the chart groups seen, in the
// page's order, each titled with what it holds.
func groupLegend(seen map[outcome.Group]bool) []legendItem {
	var out []legendItem
	for _, g := range outcome.Groups() {
		if !seen[g.Group] {
			continue
		}
		classes := make([]string, len(g.Classes))
		for i, c := range g.Classes {
			classes[i] = string(c)
		}
		out = append(out, legendItem{Name: string(g.Group), Fill: groupColors[g.Group],
			Title: g.Label + " — " + strings.Join(classes, ", ")})
	}
	return out
}

func upstreamChartOf(u timeline.Upstream, g geometry, s timeline.Snapshot) upstreamChart {
	c := upstreamChart{Name: u.Name, W: chartW, State: u.State}
	y := chartTop
	c.Req = requestsLane(u, g, y, 96)
	y += 96 + laneGap
	c.Lat = latencyLaneOf(u, g, y, 96)
	y += 96 + laneGap
	c.Retry = countLane(retriesCount, u, g, y, 36)
	y += 36 + laneGap
	c.Dead = countLane(deadLettersCount, u, g, y, 36)
	y += 36 + laneGap
	c.Breaker = breakerLane(u, g, y, 20)
	y += 20 + 4
	c.AxisY, c.Axis = r1(y+12), axis(s, g)
	c.H = r1(y + axisHeight)
	var open time.Duration
	for _, b := range u.Buckets {
		c.Requests += b.Requests
		c.Retries += b.Retries
		c.DeadLetters += b.DeadLetters
		open += b.Open
	}
	c.Groups = groupCounts(u.Buckets...)
	if open > 0 {
		c.OpenFor = preciseDuration(open)
	}
	return c
}

func requestsLane(u timeline.Upstream, g geometry, top, h float64) barLane {
	peak := 0
	for _, b := range u.Buckets {
		peak = max(peak, b.Requests)
	}
	scale := niceCeil(peak)
	l := barLane{frame: newFrame("Requests", "by outcome", top, h)}
	l.Grid = []gridLine{grid(top, strconv.Itoa(scale)+"/min"), grid(top+h/2, "")}
	for i, b := range u.Buckets {
		if b.Requests == 0 {
			continue
		}
		grp := barGroup{Minute: minuteLabel(b.Start), Total: b.Requests}
		gcs := groupCounts(b)
		parts := make([]string, 0, len(gcs))
		base := top + h
		for _, gc := range gcs {
			hh := h * float64(gc.Count) / float64(scale)
			grp.Segs = append(grp.Segs, barSeg{X: g.barX(i), Y: r1(base - hh), W: g.barW(), H: r1(hh),
				Fill: groupColors[gc.Group], Class: string(gc.Group), Count: gc.Count})
			base -= hh
			parts = append(parts, gc.String())
		}
		grp.Title = fmt.Sprintf("%s · %d request%s: %s", grp.Minute, b.Requests, plural(b.Requests), strings.Join(parts, ", "))
		l.Bars = append(l.Bars, grp)
	}
	return l
}

// countSeries is a per-minute count that countLane draws: the lane's label
// and sub-label, the bars' fill and class name, and the count in a bucket.
type countSeries struct {
	label, sub  string
	fill, class string
	get         func(timeline.Bucket) int
}

var (
	retriesCount = countSeries{label: "Retries", sub: "per minute", fill: colorRetries, class: "retries",
		get: func(b timeline.Bucket) int { return b.Retries }}
	deadLettersCount = countSeries{label: "Dead letters", sub: "recorded", fill: colorDead, class: "dead_letters",
		get: func(b timeline.Bucket) int { return b.DeadLetters }}
)

func countLane(cs countSeries, u timeline.Upstream, g geometry, top, h float64) barLane {
	get, fill, class := cs.get, cs.fill, cs.class
	peak := 0
	for _, b := range u.Buckets {
		peak = max(peak, get(b))
	}
	scale := niceCeil(peak)
	l := barLane{frame: newFrame(cs.label, cs.sub, top, h)}
	l.Grid = []gridLine{grid(top, strconv.Itoa(scale))}
	for i, b := range u.Buckets {
		n := get(b)
		if n == 0 {
			continue
		}
		hh := h * float64(n) / float64(scale)
		l.Bars = append(l.Bars, barGroup{Minute: minuteLabel(b.Start), Total: n,
			Title: fmt.Sprintf("%s · %d %s", minuteLabel(b.Start), n, strings.ToLower(strings.ReplaceAll(class, "_", " "))),
			Segs:  []barSeg{{X: g.barX(i), Y: r1(top + h - hh), W: g.barW(), H: r1(hh), Fill: fill, Class: class, Count: n}}})
	}
	return l
}

// latencyLaneOf draws p50 and p99 on a log scale of whole decades that
// holds every value of the window.
func latencyLaneOf(u timeline.Upstream, g geometry, top, h float64) latencyLane {
	l := latencyLane{frame: newFrame("Latency", "p50 · p99", top, h), Color50: colorP50, Color99: colorP99}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, b := range u.Buckets {
		if b.Requests > 0 {
			lo = math.Min(lo, math.Log10(b.P50.Seconds()))
			hi = math.Max(hi, math.Log10(b.P99.Seconds()))
		}
	}
	if math.IsInf(lo, 1) {
		l.Empty = "no requests in the window"
		l.Grid = []gridLine{grid(top, "")}
		return l
	}
	dlo, dhi := math.Floor(lo), math.Ceil(hi)
	if dhi <= dlo {
		dhi = dlo + 1
	}
	yOf := func(d time.Duration) float64 {
		return r1(top + h - (math.Log10(d.Seconds())-dlo)/(dhi-dlo)*h)
	}
	for d := dlo; d <= dhi; d++ {
		l.Grid = append(l.Grid, grid(top+h-(d-dlo)/(dhi-dlo)*h, decadeLabel(int(d))))
	}
	var run50, run99 []string
	flush := func() {
		if len(run50) > 0 {
			l.P50 = append(l.P50, strings.Join(run50, " "))
			l.P99 = append(l.P99, strings.Join(run99, " "))
		}
		run50, run99 = nil, nil
	}
	for i, b := range u.Buckets {
		if b.Requests == 0 {
			flush()
			continue
		}
		p := latPoint{Minute: minuteLabel(b.Start), X: g.mid(i), Y50: yOf(b.P50), Y99: yOf(b.P99),
			P50ms: msString(b.P50), P99ms: msString(b.P99), Requests: b.Requests}
		p.Title = fmt.Sprintf("%s · p50 %s, p99 %s (%d request%s)", p.Minute, preciseDuration(b.P50), preciseDuration(b.P99), b.Requests, plural(b.Requests))
		l.Points = append(l.Points, p)
		run50 = append(run50, fmt.Sprintf("%v,%v", p.X, p.Y50))
		run99 = append(run99, fmt.Sprintf("%v,%v", p.X, p.Y99))
	}
	flush()
	return l
}

func breakerLane(u timeline.Upstream, g geometry, top, h float64) stateLane {
	l := stateLane{frame: newFrame("Breaker", "", top, h)}
	l.LabelY = top + 14
	for i, b := range u.Buckets {
		total := b.Closed + b.HalfOpen + b.Open
		c := stateCell{Minute: minuteLabel(b.Start), ClosedMs: b.Closed.Milliseconds(),
			HalfOpenMs: b.HalfOpen.Milliseconds(), OpenMs: b.Open.Milliseconds(), State: "none"}
		if total == 0 {
			c.Title = c.Minute + " · no data (before this process started)"
			c.Segs = []barSeg{{X: r1(g.x(i)), Y: r1(top), W: r1(g.col), H: r1(h), Fill: colorNoData, Class: "none"}}
			l.Cells = append(l.Cells, c)
			continue
		}
		base := top + h
		most := time.Duration(-1)
		for _, st := range []struct {
			name  breaker.State
			d     time.Duration
			color string
		}{{breaker.Closed, b.Closed, colorClosed}, {breaker.HalfOpen, b.HalfOpen, colorHalfOpen}, {breaker.Open, b.Open, colorOpen}} {
			if st.d > most {
				most, c.State = st.d, string(st.name)
			}
			if st.d == 0 {
				continue
			}
			hh := h * float64(st.d) / float64(total)
			c.Segs = append(c.Segs, barSeg{X: r1(g.x(i)), Y: r1(base - hh), W: r1(g.col), H: r1(hh), Fill: st.color, Class: string(st.name)})
			base -= hh
		}
		c.Title = fmt.Sprintf("%s · closed %s, half-open %s, open %s", c.Minute,
			preciseDuration(b.Closed), preciseDuration(b.HalfOpen), preciseDuration(b.Open))
		l.Cells = append(l.Cells, c)
	}
	return l
}

// axis labels every tenth minute, and the newest bucket as "now".
func axis(s timeline.Snapshot, g geometry) []axisLabel {
	var out []axisLabel
	for i := range s.Buckets {
		t := s.Start.Add(time.Duration(i) * s.Width).UTC()
		if i == s.Buckets-1 {
			out = append(out, axisLabel{X: g.mid(i), Label: "now"})
		} else if t.Minute()%10 == 0 && t.Second() == 0 && i < s.Buckets-3 {
			out = append(out, axisLabel{X: g.mid(i), Label: t.Format("15:04")})
		}
	}
	return out
}

func storeChartOf(s timeline.Snapshot, g geometry) storeChart {
	const h = 60.0
	c := storeChart{W: chartW}
	var peak int64
	for _, b := range s.Store {
		if b.Sampled {
			peak = max(peak, b.Stats.Records)
			c.Samples++
		}
	}
	scale := niceCeil(int(min(peak, math.MaxInt32)))
	c.Records = barLane{frame: newFrame("Records", "last sample", chartTop, h)}
	c.Records.Grid = []gridLine{grid(chartTop, strconv.Itoa(scale))}
	for i, b := range s.Store {
		if !b.Sampled {
			continue
		}
		hh := h * float64(b.Stats.Records) / float64(scale)
		st := b.Stats
		c.Records.Bars = append(c.Records.Bars, barGroup{Minute: minuteLabel(b.Start), Total: int(st.Records),
			Title: fmt.Sprintf("%s · %d records (%d in flight), LSM %s, value log %s", minuteLabel(b.Start),
				st.Records, st.InFlight, humanBytes(st.LSMBytes), humanBytes(st.VLogBytes)),
			Segs: []barSeg{{X: g.barX(i), Y: r1(chartTop + h - hh), W: g.barW(), H: r1(hh), Fill: colorStore, Class: "records", Count: int(st.Records)}}})
	}
	c.AxisY = r1(chartTop + h + 16)
	c.Axis = axis(s, g)
	c.H = r1(chartTop + h + 4 + axisHeight)
	return c
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// decadeLabel names 10^e seconds: "1 ms", "100 ms", "10 s".
func decadeLabel(e int) string {
	d := time.Duration(math.Pow(10, float64(e)) * float64(time.Second))
	return preciseDuration(d)
}

// preciseDuration is a short human duration: "840 µs", "12.3 ms", "1.52 s",
// "2m10s".
func preciseDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Millisecond:
		return fmt.Sprintf("%d µs", d.Microseconds())
	case d < 10*time.Millisecond:
		return trimZeros(fmt.Sprintf("%.2f", float64(d)/1e6)) + " ms"
	case d < time.Second:
		return trimZeros(fmt.Sprintf("%.1f", float64(d)/1e6)) + " ms"
	case d < time.Minute:
		return trimZeros(fmt.Sprintf("%.2f", d.Seconds())) + " s"
	}
	return d.Round(time.Second).String()
}

func trimZeros(s string) string {
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// msString is d in milliseconds with three decimals, for data attributes.
func msString(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/1e6, 'f', 3, 64)
}
