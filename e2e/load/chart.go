package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"strings"
)

// chartRow is one bar group: a latency distribution of one leg.
type chartRow struct {
	label          string
	path           string
	p50, p99, p999 float64 // ms
}

func chartRows(r *report) []chartRow {
	var rows []chartRow
	for _, l := range r.Legs {
		if l.TTFB != nil && l.Kind == "stream" {
			rows = append(rows, chartRow{l.Name + " · TTFB", l.Path, l.TTFB.P50, l.TTFB.P99, l.TTFB.P999})
		}
		if l.Latency != nil {
			label := l.Name
			if l.Kind != "json" {
				label += " · last byte"
			}
			rows = append(rows, chartRow{label, l.Path, l.Latency.P50, l.Latency.P99, l.Latency.P999})
		}
	}
	return rows
}

var pathColor = map[string]string{"direct": "#6b6b6b", "floor": "#1f77b4", "llmgate": "#e6550d"}

// chart is the frame chartSVG draws in: its size and its logarithmic
// axis, decades dlo to dhi of milliseconds.
type chart struct {
	rows          []chartRow
	width, height float64
	dlo, dhi      float64
}

const (
	chartLeft, chartPlotW, chartRight = 330.0, 640.0, 330.0
	chartTop, chartRowH, chartBottom  = 86.0, 20.0, 56.0
)

// newChart sizes the chart for rows and picks whole decades that hold
// every p50 to p99.9.
func newChart(rows []chartRow) chart {
	c := chart{rows: rows, width: chartLeft + chartPlotW + chartRight,
		height: chartTop + chartRowH*float64(max(len(rows), 1)) + chartBottom}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, row := range rows {
		lo = math.Min(lo, row.p50)
		hi = math.Max(hi, row.p999)
	}
	if len(rows) == 0 {
		lo, hi = 0.01, 1
	}
	lo = math.Max(lo, 1e-3)
	hi = math.Max(hi, lo*10)
	c.dlo, c.dhi = math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	return c
}

// x is where v milliseconds falls on the axis.
func (c chart) x(v float64) float64 {
	v = math.Max(v, math.Pow(10, c.dlo))
	return chartLeft + chartPlotW*(math.Log10(v)-c.dlo)/(c.dhi-c.dlo)
}

// plotBottom is the bottom of the last row.
func (c chart) plotBottom() float64 { return chartTop + chartRowH*float64(len(c.rows)) }

func xmlEsc(s string) string {
	var e bytes.Buffer
	_ = xml.EscapeText(&e, []byte(s))
	return e.String()
}

// chartSVG draws each leg's p50, p99 and p99.9 as nested horizontal bars
// on a logarithmic millisecond axis.
func chartSVG(r *report) []byte {
	c := newChart(chartRows(r))
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", c.width, c.height, c.width, c.height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	c.titleAndLegend(&b, r)
	c.grid(&b)
	c.bars(&b)
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// titleAndLegend draws the title, the run's line and the legend.
func (c chart) titleAndLegend(b *bytes.Buffer, r *report) {
	left := chartLeft
	title := "llmgate vs a bare ReverseProxy (floor) vs direct: latency per leg"
	if r.Settings.Quick {
		title += " (quick mode: meaningless numbers)"
	}
	fmt.Fprintf(b, `<text x="%.0f" y="24" font-size="16" font-weight="bold">%s</text>`+"\n", left-310, xmlEsc(title))
	fmt.Fprintf(b, `<text x="%.0f" y="44" fill="#444">%s</text>`+"\n", left-310,
		xmlEsc(fmt.Sprintf("%s · %d CPUs · bars: p50 (solid), p99, p99.9 (palest) · log scale, milliseconds", r.Started.Format("2006-01-02 15:04 MST"), r.Host.NumCPU)))

	lx := left - 310
	for _, p := range []string{"direct", "floor", "llmgate"} {
		fmt.Fprintf(b, `<rect x="%.0f" y="56" width="14" height="12" fill="%s"/><text x="%.0f" y="66">%s</text>`+"\n", lx, pathColor[p], lx+18, p)
		lx += 90
	}
	for i, op := range []struct {
		name string
		o    float64
	}{{"p50", 1}, {"p99", 0.5}, {"p99.9", 0.25}} {
		fmt.Fprintf(b, `<rect x="%.0f" y="56" width="14" height="12" fill="#e6550d" fill-opacity="%.2f"/><text x="%.0f" y="66">%s</text>`+"\n", lx+float64(i)*70, op.o, lx+float64(i)*70+18, op.name)
	}
}

// grid draws the row shading, then the grid and ticks at every 1, 2, 5 ×
// 10^k (labels on the decades) and the axis.
func (c chart) grid(b *bytes.Buffer) {
	left, top, rowH, plotW := chartLeft, chartTop, chartRowH, chartPlotW
	plotBottom := c.plotBottom()
	// Row shading first, so the grid shows through it.
	for i := 0; i < len(c.rows); i += 2 {
		fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="#f4f4f4"/>`+"\n", left-320, top+rowH*float64(i), c.width-20, rowH)
	}
	for d := c.dlo; d <= c.dhi; d++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, d)
			if math.Log10(v) > c.dhi+1e-9 {
				break
			}
			xv := c.x(v)
			stroke, tick := "#e4e4e4", 7.0
			if m == 1 {
				stroke, tick = "#bdbdbd", 10
			}
			fmt.Fprintf(b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="%s"/>`+"\n", xv, top-4, xv, plotBottom+4, stroke)
			fmt.Fprintf(b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#333"/>`+"\n", xv, plotBottom+4, xv, plotBottom+4+tick)
			if m == 1 || c.dhi-c.dlo <= 3 {
				fmt.Fprintf(b, `<text x="%.1f" y="%.0f" text-anchor="middle" fill="#333">%s</text>`+"\n", xv, plotBottom+24, xmlEsc(msLabel(v)))
			}
		}
	}
	fmt.Fprintf(b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#333"/>`+"\n", left, plotBottom+4, left+plotW, plotBottom+4)
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" text-anchor="middle" fill="#333">latency (log scale)</text>`+"\n", left+plotW/2, plotBottom+44)
}

// bars draws each row's label, its three nested bars and their values.
func (c chart) bars(b *bytes.Buffer) {
	left := chartLeft
	for i, row := range c.rows {
		y := chartTop + chartRowH*float64(i)
		col := pathColor[row.path]
		fmt.Fprintf(b, `<text x="%.0f" y="%.0f" text-anchor="end">%s</text>`+"\n", left-8, y+14, xmlEsc(row.label))
		for _, bar := range []struct {
			v, o float64
		}{{row.p999, 0.25}, {row.p99, 0.5}, {row.p50, 1}} {
			fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="%.1f" height="12" fill="%s" fill-opacity="%.2f"/>`+"\n", left, y+4, math.Max(c.x(bar.v)-left, 1), col, bar.o)
		}
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" fill="#333">%s</text>`+"\n", c.x(row.p999)+6, y+14,
			xmlEsc(fmt.Sprintf("%s / %s / %s", msLabel(row.p50), msLabel(row.p99), msLabel(row.p999))))
	}
}

// msLabel formats a millisecond value with a unit that keeps it short.
func msLabel(v float64) string {
	switch {
	case v >= 1000:
		return trimZeros(fmt.Sprintf("%.2f", v/1000)) + " s"
	case v >= 1:
		return trimZeros(fmt.Sprintf("%.2f", v)) + " ms"
	default:
		return trimZeros(fmt.Sprintf("%.1f", v*1000)) + " µs"
	}
}

// trimZeros drops a decimal number's trailing zeros, and its point if
// nothing is left after it.
func trimZeros(s string) string {
	if !strings.Contains(s, ".") {
		return s
	}
	return strings.TrimSuffix(strings.TrimRight(s, "0"), ".")
}
