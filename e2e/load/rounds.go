package main

import (
	"fmt"
	"slices"
	"strings"
)

// Rounds (-rounds N). On a machine whose CPUs the load generator, the
// fake, the floor and the gateway share, one leg's CPU per request moves
// by a fifth from run to run, more than most changes a profile points
// at. Running every closed-loop leg N times, round after round, and then
// every open-loop leg N times, has the floor's and the gateway's legs
// take turns with whatever else the machine does; pooling a leg's rounds
// (their requests, CPU seconds and latencies together) puts N times the
// requests behind each ratio and percentile. The targets judge the pooled legs; mdRounds shows how far
// the rounds' own ratios spread.

// rounds is -rounds, at least 1.
func (s settings) rounds() int { return max(1, s.Rounds) }

// roundPool gathers the rounds of each leg, in the order the legs first
// ran.
type roundPool struct {
	order []string
	byLeg map[string]*pooledLeg
}

type pooledLeg struct {
	leg     Leg        // the first round's, less its figures
	samples legSamples // every round's
	proxy   *ProcUsage // nil once a round had no proxy figures
	foreign float64    // -1 once a round's is unknown
	rounds  int
}

// add pools one round's leg l, whose samples are ls (copied, not kept).
func (p *roundPool) add(l Leg, ls legSamples) {
	if p.byLeg == nil {
		p.byLeg = map[string]*pooledLeg{}
	}
	pl := p.byLeg[l.Name]
	if pl == nil {
		pl = &pooledLeg{leg: l, proxy: l.Proxy, foreign: l.ForeignCPUSeconds}
		pl.leg.Round, pl.leg.Proxy = 0, nil
		p.byLeg[l.Name] = pl
		p.order = append(p.order, l.Name)
	} else {
		pl.proxy = mergeUsage(pl.proxy, l.Proxy)
		if pl.foreign < 0 || l.ForeignCPUSeconds < 0 {
			pl.foreign = -1
		} else {
			pl.foreign += l.ForeignCPUSeconds
		}
	}
	pl.samples.add(ls)
	pl.rounds++
}

// legs are the pooled legs: each leg's figures over all its rounds.
func (p *roundPool) legs() []Leg {
	var out []Leg
	for _, name := range p.order {
		pl := p.byLeg[name]
		l := pl.leg
		l.Rounds = pl.rounds
		l.Proxy = pl.proxy
		if pl.proxy != nil && pl.proxy.GC != nil {
			pu, gc := *pl.proxy, *pl.proxy.GC
			gc.CPUFraction /= float64(pl.rounds) // mergeGC summed it
			pu.GC = &gc
			l.Proxy = &pu
		}
		l.ForeignCPUSeconds = pl.foreign
		l.fillFrom(pl.samples)
		out = append(out, l)
	}
	return out
}

// mergeUsage is the proxy's figures over two rounds: CPU time and GC
// cycles summed, peaks the higher, the first's before and the second's
// after. Either nil (not measured) makes the whole unknown.
func mergeUsage(a, b *ProcUsage) *ProcUsage {
	if a == nil || b == nil {
		return nil
	}
	m := *b
	m.RSSBeforeMiB, m.ThreadsBefore = a.RSSBeforeMiB, a.ThreadsBefore
	if a.PeakRSSMiB > b.PeakRSSMiB {
		m.PeakRSSMiB, m.PeakFrom = a.PeakRSSMiB, a.PeakFrom
	}
	m.PeakAnonMiB = max(a.PeakAnonMiB, b.PeakAnonMiB)
	m.PeakFileMiB = max(a.PeakFileMiB, b.PeakFileMiB)
	m.ThreadsPeak = max(a.ThreadsPeak, b.ThreadsPeak)
	m.CPUSeconds = a.CPUSeconds + b.CPUSeconds
	m.GC = mergeGC(a.GC, b.GC)
	return &m
}

// mergeGC is mergeUsage for the gateway's GC figures (nil for the floor).
// The GC's CPU shares are summed; legs takes their mean.
func mergeGC(a, b *GCUsage) *GCUsage {
	if a == nil || b == nil {
		return nil
	}
	m := *b
	m.Cycles = a.Cycles + b.Cycles
	m.CPUFraction = a.CPUFraction + b.CPUFraction
	m.HeapGoalMaxMiB = max(a.HeapGoalMaxMiB, b.HeapGoalMaxMiB)
	m.HeapAllocMaxMiB = max(a.HeapAllocMaxMiB, b.HeapAllocMaxMiB)
	return &m
}

// roundRatio is one ratio of two legs that mdRounds follows round by
// round: what the targets compare.
type roundRatio struct {
	name string
	of   func(leg func(string) *Leg) (float64, bool)
}

func roundRatios(s settings) []roundRatio {
	var rs []roundRatio
	for _, g := range cpuGoals {
		rs = append(rs, roundRatio{
			fmt.Sprintf("CPU per request, %s ÷ %s (target ≤ %.2f)", g.leg, g.floor, g.limit),
			func(leg func(string) *Leg) (float64, bool) {
				l, f := leg(g.leg), leg(g.floor)
				if !usable(l, f) || cpuPerRequest(l) == 0 || cpuPerRequest(f) == 0 {
					return 0, false
				}
				return cpuPerRequest(l) / cpuPerRequest(f), true
			}})
	}
	for _, g := range openGoals {
		if s.TargetRate == 0 {
			break
		}
		prefix := openPrefix(s)
		rs = append(rs, roundRatio{
			fmt.Sprintf("added %s, %s%s ÷ %sfloor (target ≤ %.1f)", g.q, prefix, g.leg, prefix, g.limit),
			func(leg func(string) *Leg) (float64, bool) {
				l, f := g.legs(s, leg)
				if !usable(l, f) {
					return 0, false
				}
				floor := g.added(s, f.Latency)
				if floor <= 0 {
					return 0, false
				}
				return g.added(s, l.Latency) / floor, true
			}})
	}
	return append(rs,
		roundRatio{"p99.9, c=16 llmgate keyed ÷ c=16 llmgate (target ≤ 2)", func(leg func(string) *Leg) (float64, bool) {
			k, u := leg("c=16 llmgate keyed"), leg("c=16 llmgate")
			if !usable(k, u) || u.Latency.P999 == 0 {
				return 0, false
			}
			return k.Latency.P999 / u.Latency.P999, true
		}},
		roundRatio{"req/s, c=16 llmgate ÷ c=16 floor", func(leg func(string) *Leg) (float64, bool) {
			g, f := leg("c=16 llmgate"), leg("c=16 floor")
			if !usable(g, f) || f.RPS == 0 {
				return 0, false
			}
			return g.RPS / f.RPS, true
		}},
	)
}

// roundLeg finds round's leg by name.
func (r *report) roundLeg(round int, name string) *Leg {
	for i := range r.RoundLegs {
		if l := &r.RoundLegs[i]; l.Round == round && l.Name == name {
			return l
		}
	}
	return nil
}

// mdRounds is, with -rounds N > 1, each ratio of roundRatios round by
// round, their median and the pooled legs' (which the targets judge).
func (r *report) mdRounds(b *strings.Builder) {
	n := r.Settings.rounds()
	if n < 2 || len(r.RoundLegs) == 0 {
		return
	}
	fmt.Fprintf(b, "## Rounds\n\nThe closed-loop legs ran %d times over, round after round, and then the open-loop ones. The tables pool each leg's rounds (requests, proxy CPU seconds and latencies together; peaks are the highest), and the targets judge the pooled legs. Each round's ratios, their median and the pooled legs' ratio:\n\n", n)
	b.WriteString("| ratio |")
	for i := 1; i <= n; i++ {
		fmt.Fprintf(b, " round %d |", i)
	}
	b.WriteString(" median | pooled |\n|---|" + strings.Repeat("--:|", n+2) + "\n")
	for _, rr := range roundRatios(r.Settings) {
		var row strings.Builder
		var got []float64
		for i := 1; i <= n; i++ {
			v, ok := rr.of(func(name string) *Leg { return r.roundLeg(i, name) })
			if !ok {
				row.WriteString(" — |")
				continue
			}
			got = append(got, v)
			fmt.Fprintf(&row, " %.2f |", v)
		}
		if len(got) == 0 {
			continue
		}
		pooled := "—"
		if v, ok := rr.of(r.leg); ok {
			pooled = fmt.Sprintf("%.2f", v)
		}
		fmt.Fprintf(b, "| %s |%s %.2f | %s |\n", rr.name, row.String(), median(got), pooled)
	}
	b.WriteString("\n")
}

// median of vs (not empty): the middle one, or the mean of the middle two.
func median(vs []float64) float64 {
	s := slices.Sorted(slices.Values(vs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// profileName is the name a leg's -pprof file takes: the leg's, and its
// round's with -rounds N > 1.
func (m *measurement) profileName(leg string) string {
	if m.s.rounds() > 1 {
		return fmt.Sprintf("%s r%d", leg, m.round)
	}
	return leg
}
