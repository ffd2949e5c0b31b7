package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"strings"
)

// memSummary is the table: the gateway's memory over the run and
// its keyed/unkeyed ratios at the widest concurrency.
type memSummary struct {
	PeakRSS, PeakAnon, PeakFile float64 // over every llmgate leg
	KeyedJSON, KeyedStream      float64 // keyed p99 / unkeyed p99 (0: n/a)
	KeyedJSON999                float64 // keyed p99.9 / unkeyed p99.9 (0: n/a)
	KeyedRPS, UnkeyedRPS        float64
	FloorRPS                    float64
	Conc                        int
}

func (r *report) memSummary() memSummary {
	var m memSummary
	for _, l := range r.Legs {
		if l.Path == "llmgate" && l.Proxy != nil {
			m.PeakRSS = max(m.PeakRSS, l.Proxy.PeakRSSMiB)
			m.PeakAnon = max(m.PeakAnon, l.Proxy.PeakAnonMiB)
			m.PeakFile = max(m.PeakFile, l.Proxy.PeakFileMiB)
		}
		if l.Mode == "closed" {
			m.Conc = max(m.Conc, l.Concurrency)
		}
	}
	c := fmt.Sprintf("c=%d ", m.Conc)
	p99 := func(d *Dist) float64 { return d.P99 }
	ratio := func(keyed, plain string, q func(*Dist) float64) float64 {
		k, u := r.leg(c+keyed), r.leg(c+plain)
		if !usable(k, u) || q(u.Latency) <= 0 {
			return 0
		}
		return q(k.Latency) / q(u.Latency)
	}
	m.KeyedJSON, m.KeyedStream = ratio("llmgate keyed", "llmgate", p99), ratio("stream llmgate keyed", "stream llmgate", p99)
	m.KeyedJSON999 = ratio("llmgate keyed", "llmgate", func(d *Dist) float64 { return d.P999 })
	if l := r.leg(c + "llmgate keyed"); l != nil {
		m.KeyedRPS = l.RPS
	}
	if l := r.leg(c + "llmgate"); l != nil {
		m.UnkeyedRPS = l.RPS
	}
	if l := r.leg(c + "floor"); l != nil {
		m.FloorRPS = l.RPS
	}
	return m
}

// memTargets are the memory and tail-latency goals.
func memTargets(r *report) []Target {
	m := r.memSummary()
	gi := r.Gateway
	c := fmt.Sprintf("c=%d", m.Conc)
	ts := []Target{
		{"peak anonymous RSS", "≤ 128 MiB over every llmgate leg", fmt.Sprintf("%.1f MiB (peak RSS %.1f, file-mapped up to %.1f)", m.PeakAnon, m.PeakRSS, m.PeakFile), verdict(m.PeakAnon <= 128)},
		{"anonymous RSS after idle", "≤ 64 MiB after -idle-after", fmt.Sprintf("%.1f MiB after %v (RSS %.1f)", gi.AfterIdleAnonMiB, r.Settings.IdleAfter, gi.AfterIdleRSSMiB), verdict(gi.AfterIdleAnonMiB <= 64)},
	}
	for _, t := range []struct {
		name, q string
		v       float64
		lim     float64
	}{{"keyed JSON p99, " + c, "p99", m.KeyedJSON, 2}, {"keyed JSON p99.9, " + c, "p99.9", m.KeyedJSON999, 2},
		{"keyed streams p99, " + c, "p99", m.KeyedStream, 3}} {
		goal := fmt.Sprintf("keyed %s ≤ %.0f × unkeyed %s", t.q, t.lim, t.q)
		if t.v == 0 {
			ts = append(ts, Target{t.name, goal, "legs missing or with errors", "n/a"})
			continue
		}
		ts = append(ts, Target{t.name, goal, fmt.Sprintf("%.2f×", t.v), verdict(t.v <= t.lim)})
	}
	if m.FloorRPS > 0 && m.UnkeyedRPS > 0 {
		ts = append(ts, Target{"unkeyed throughput vs floor, " + c, "llmgate req/s ≥ 0.9 × floor req/s",
			fmt.Sprintf("%.0f vs %.0f req/s (%.2f×)", m.UnkeyedRPS, m.FloorRPS, m.UnkeyedRPS/m.FloorRPS), verdict(m.UnkeyedRPS >= 0.9*m.FloorRPS)})
	}
	if cg := r.Cgroup; cg != nil {
		ts = append(ts, Target{"no OOM kill in the cgroup", "0 OOM kills, 0 errors", fmt.Sprintf("%d OOM kills, %d errors", cg.End.OOMKills-cg.Start.OOMKills, r.errors()), verdict(cg.End.OOMKills == cg.Start.OOMKills && r.errors() == 0)})
	}
	return ts
}

func (r *report) errors() int {
	n := 0
	for _, l := range r.Legs {
		n += l.Errors
	}
	return n
}

// memoryMarkdown is the report's memory sections.
func (r *report) memoryMarkdown(b *strings.Builder) {
	m, gi := r.memSummary(), r.Gateway
	fmt.Fprintf(b, "\n## Memory (store: %s)\n\n", r.Store.Kind)
	b.WriteString("Per leg, for the process on the path: peak RSS (VmHWM, reset at the leg's start), peak anonymous and file-mapped RSS (RssAnon, RssFile, sampled every 50 ms), anonymous RSS at the leg's end; for llmgate its Go runtime from /metrics: GC cycles, the share of its CPU time GC took, the highest heap goal and heap seen (sampled every second), and its soft memory limit.\n\n")
	b.WriteString("| leg | peak RSS MiB | peak anon MiB | peak file MiB | anon at end MiB | GC cycles | GC CPU % | heap goal max MiB | heap max MiB | GOMEMLIMIT MiB |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, l := range r.Legs {
		p := l.Proxy
		if p == nil {
			continue
		}
		gc := "| | | | | "
		if g := p.GC; g != nil {
			lim := "none"
			if g.MemLimitMiB > 0 {
				lim = fmt.Sprintf("%.0f", g.MemLimitMiB)
			}
			gc = fmt.Sprintf("| %d | %.1f | %.1f | %.1f | %s ", g.Cycles, 100*g.CPUFraction, g.HeapGoalMaxMiB, g.HeapAllocMaxMiB, lim)
		}
		fmt.Fprintf(b, "| %s | %.1f | %.1f | %.1f | %.1f %s|\n", r.legLabel(l), p.PeakRSSMiB, p.PeakAnonMiB, p.PeakFileMiB, p.AnonAfterMiB, gc)
	}
	b.WriteString("\n| figure | llmgate |\n|---|--:|\n")
	fmt.Fprintf(b, "| RSS at ready | %.1f MiB |\n", gi.RSSAtReadyMiB)
	fmt.Fprintf(b, "| peak RSS (VmHWM) | %.1f MiB |\n| peak anonymous RSS | %.1f MiB |\n", m.PeakRSS, m.PeakAnon)
	fmt.Fprintf(b, "| RSS after %v idle | %.1f MiB (anonymous %.1f, file %.1f) |\n", r.Settings.IdleAfter, gi.AfterIdleRSSMiB, gi.AfterIdleAnonMiB, gi.AfterIdleFileMiB)
	if d := gi.DataDir; d != nil {
		fmt.Fprintf(b, "| data dir at the end | %.1f MiB allocated (%.1f MiB apparent, %d files) |\n", d.AllocatedMiB, d.ApparentMiB, d.Files)
	}
	ratio := func(v float64) string {
		if v == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.2f×", v)
	}
	fmt.Fprintf(b, "| keyed JSON p99 / unkeyed p99 (c=%d) | %s |\n| keyed JSON p99.9 / unkeyed p99.9 | %s |\n| keyed streams p99 / unkeyed p99 | %s |\n",
		m.Conc, ratio(m.KeyedJSON), ratio(m.KeyedJSON999), ratio(m.KeyedStream))
	fmt.Fprintf(b, "| throughput keyed / unkeyed JSON | %.0f / %.0f req/s |\n| floor throughput | %.0f req/s |\n", m.KeyedRPS, m.UnkeyedRPS, m.FloorRPS)
	if cg := r.Cgroup; cg != nil {
		peak := "n/a"
		if cg.End.PeakBytes > 0 {
			peak = fmt.Sprintf("%.1f MiB", float64(cg.End.PeakBytes)/(1<<20))
		}
		fmt.Fprintf(b, "\nIn the memory cgroup %s (v2: %v): limit %.0f MiB; peak usage %s (sampled %.1f MiB); at the end usage %.1f MiB (anon %.1f, file %.1f); OOM kills during the run: %d.\n",
			cg.Dir, cg.V2, float64(cg.End.LimitBytes)/(1<<20), peak, cg.PeakSampledMiB, float64(cg.End.UsageBytes)/(1<<20),
			float64(cg.End.AnonBytes)/(1<<20), float64(cg.End.FileBytes)/(1<<20), cg.End.OOMKills-cg.Start.OOMKills)
	}
}

func (r *report) legLabel(l Leg) string {
	if r.contended(l) {
		return l.Name + " †"
	}
	return l.Name
}

// rssChartSVG draws the gateway's RSS, anonymous RSS, file-mapped RSS,
// its cgroup's usage and its heap goal over the sustained legs and the
// idle time after them; nil when there was no sustained leg.
func rssChartSVG(r *report) []byte {
	pts := r.Timeline
	if len(pts) < 2 {
		return nil
	}
	const left, plotW, top, plotH = 70.0, 820.0, 70.0, 360.0
	tmax, vmax := pts[len(pts)-1].Seconds, 1.0
	for _, p := range pts {
		vmax = math.Max(vmax, math.Max(p.RSSMiB, math.Max(p.CgroupMiB, p.HeapGoalMiB)))
	}
	if r.Cgroup != nil && r.Cgroup.End.LimitBytes > 0 {
		vmax = math.Max(vmax, float64(r.Cgroup.End.LimitBytes)/(1<<20))
	}
	vmax = math.Ceil(vmax*1.1/64) * 64
	x := func(t float64) float64 { return left + plotW*t/math.Max(tmax, 1e-9) }
	y := func(v float64) float64 { return top + plotH*(1-v/vmax) }
	var b bytes.Buffer
	esc := func(s string) string {
		var e bytes.Buffer
		_ = xml.EscapeText(&e, []byte(s))
		return e.String()
	}
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="960" height="500" viewBox="0 0 960 500" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n")
	b.WriteString(`<rect width="100%" height="100%" fill="#ffffff"/>` + "\n")
	title := fmt.Sprintf("llmgate memory over sustained keyed load (%d clients, %d B completions, store %s)", r.Settings.SustainC, r.Settings.ContentBytes, r.Store.Kind)
	fmt.Fprintf(&b, `<text x="%.0f" y="24" font-size="16" font-weight="bold">%s</text>`+"\n", left, esc(title))
	series := []struct {
		name, color string
		v           func(TimePoint) float64
	}{
		{"RSS", "#e6550d", func(p TimePoint) float64 { return p.RSSMiB }},
		{"anonymous", "#31a354", func(p TimePoint) float64 { return p.AnonMiB }},
		{"file-mapped", "#1f77b4", func(p TimePoint) float64 { return p.FileMiB }},
		{"heap goal", "#756bb1", func(p TimePoint) float64 { return p.HeapGoalMiB }},
	}
	if r.Cgroup != nil {
		series = append(series, struct {
			name, color string
			v           func(TimePoint) float64
		}{"cgroup usage", "#636363", func(p TimePoint) float64 { return p.CgroupMiB }})
	}
	for i, s := range series {
		fmt.Fprintf(&b, `<rect x="%.0f" y="38" width="14" height="4" fill="%s"/><text x="%.0f" y="46">%s</text>`+"\n", left+float64(i)*130, s.color, left+float64(i)*130+18, s.name)
	}
	for v := 0.0; v <= vmax; v += vmax / 8 {
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#e4e4e4"/><text x="%.0f" y="%.1f" text-anchor="end" fill="#333">%.0f MiB</text>`+"\n", left, y(v), left+plotW, y(v), left-6, y(v)+4, v)
	}
	if r.Cgroup != nil && r.Cgroup.End.LimitBytes > 0 {
		lim := float64(r.Cgroup.End.LimitBytes) / (1 << 20)
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#d62728" stroke-dasharray="6 4"/><text x="%.0f" y="%.1f" fill="#d62728">cgroup limit %.0f MiB</text>`+"\n", left, y(lim), left+plotW, y(lim), left+plotW-150, y(lim)-4, lim)
	}
	// Leg boundaries.
	for i, p := range pts {
		if i == 0 || p.Leg != pts[i-1].Leg {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#999" stroke-dasharray="2 3"/><text x="%.1f" y="%.0f" fill="#555">%s</text>`+"\n", x(p.Seconds), top, x(p.Seconds), top+plotH, x(p.Seconds)+4, top+12, esc(p.Leg))
		}
	}
	for _, s := range series {
		var pl strings.Builder
		for _, p := range pts {
			fmt.Fprintf(&pl, "%.1f,%.1f ", x(p.Seconds), y(s.v(p)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", s.color, strings.TrimSpace(pl.String()))
	}
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#333"/>`+"\n", left, top+plotH, left+plotW, top+plotH)
	for t := 0.0; t <= tmax; t += math.Max(1, math.Ceil(tmax/10)) {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle" fill="#333">%.0f s</text>`+"\n", x(t), top+plotH+18, t)
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}
