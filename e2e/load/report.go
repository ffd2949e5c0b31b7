package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

type hostInfo struct {
	GoVersion  string `json:"go_version"`
	OS         string `json:"os"`
	Arch       string `json:"arch"`
	NumCPU     int    `json:"num_cpu"`
	GOMAXPROCS int    `json:"gomaxprocs"`
}

type report struct {
	Started  time.Time   `json:"started"`
	Settings settings    `json:"settings"`
	Host     hostInfo    `json:"host"`
	Gateway  GatewayInfo `json:"gateway"`
	Legs     []Leg       `json:"legs"`
	// RoundLegs are the closed-loop and open-loop legs of each round, with
	// -rounds N > 1 (Legs then holds each pooled over its rounds).
	RoundLegs []Leg       `json:"round_legs,omitempty"`
	Targets   []Target    `json:"targets"`
	Store     storeChoice `json:"store"`
	Cgroup    *CgroupInfo `json:"cgroup,omitempty"`
	// Timeline is the gateway's memory every 250 ms from the first
	// sustained leg to the end of -idle-after.
	Timeline []TimePoint `json:"timeline,omitempty"`
	// 1-minute load averages when the legs began and ended.
	LoadAvgStart string `json:"loadavg_start"`
	LoadAvgEnd   string `json:"loadavg_end"`
}

// Target is one goal and whether this run met it.
type Target struct {
	Name   string `json:"name"`
	Goal   string `json:"goal"`
	Got    string `json:"got"`
	Result string `json:"result"` // PASS, MISS, or n/a when a leg it needs did not run or failed
}

func (r *report) json() ([]byte, error) {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// leg finds a leg by name.
func (r *report) leg(name string) *Leg {
	for i := range r.Legs {
		if r.Legs[i].Name == name {
			return &r.Legs[i]
		}
	}
	return nil
}

// usable reports whether every leg has a latency and no errors: a target
// computed from a leg with failures would flatter or slander.
func usable(ls ...*Leg) bool {
	for _, l := range ls {
		if l == nil || l.Latency == nil || l.Errors > 0 {
			return false
		}
	}
	return true
}

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

func targets(r *report) []Target {
	var ts []Target
	na := func(name, goal, why string) {
		ts = append(ts, Target{Name: name, Goal: goal, Got: why, Result: "n/a"})
	}

	direct1, floor1, gw1 := r.leg("c=1 direct"), r.leg("c=1 floor"), r.leg("c=1 llmgate")
	floorOver := func() float64 { return floor1.Latency.P50 - direct1.Latency.P50 }
	{
		name, goal := "unkeyed overhead, c=1", "llmgate p50 − direct p50 ≤ 1.25 × (floor p50 − direct p50)"
		if usable(direct1, floor1, gw1) {
			got, lim := gw1.Latency.P50-direct1.Latency.P50, 1.25*floorOver()
			ts = append(ts, Target{name, goal, fmt.Sprintf("%.3f ms vs limit %.3f ms (floor overhead %.3f ms)", got, lim, floorOver()), verdict(got <= lim)})
		} else {
			na(name, goal, "c=1 legs missing or with errors")
		}
	}
	{
		name, goal := "throughput, c=16", "llmgate req/s ≥ 0.8 × floor req/s"
		f, g := r.leg("c=16 floor"), r.leg("c=16 llmgate")
		if usable(f, g) {
			ts = append(ts, Target{name, goal, fmt.Sprintf("%.0f req/s vs limit %.0f (floor %.0f)", g.RPS, 0.8*f.RPS, f.RPS), verdict(g.RPS >= 0.8*f.RPS)})
		} else {
			na(name, goal, "c=16 legs missing or with errors")
		}
	}
	{
		name, goal := "keyed (new key) overhead, c=1", "llmgate keyed p50 − direct p50 ≤ 1.5 × floor overhead"
		k := r.leg("c=1 llmgate keyed")
		if usable(direct1, floor1, k) {
			got, lim := k.Latency.P50-direct1.Latency.P50, 1.5*floorOver()
			ts = append(ts, Target{name, goal, fmt.Sprintf("%.3f ms vs limit %.3f ms", got, lim), verdict(got <= lim)})
		} else {
			na(name, goal, "c=1 legs missing or with errors")
		}
	}
	{
		name, goal := "replay, c=1", "llmgate replay p50 ≤ floor p50"
		rp := r.leg("c=1 llmgate replay")
		if usable(floor1, rp) {
			ts = append(ts, Target{name, goal, fmt.Sprintf("%.3f ms vs floor %.3f ms", rp.Latency.P50, floor1.Latency.P50), verdict(rp.Latency.P50 <= floor1.Latency.P50)})
		} else {
			na(name, goal, "c=1 legs missing or with errors")
		}
	}
	for _, keyed := range []string{"", " keyed"} {
		name, goal := "stream TTFB"+keyed+", c=1", "llmgate"+keyed+" TTFB p50 ≤ floor TTFB p50 + 0.5 ms"
		f, g := r.leg("c=1 stream floor"), r.leg("c=1 stream llmgate"+keyed)
		if usable(f, g) && f.TTFB != nil && g.TTFB != nil {
			ts = append(ts, Target{name, goal, fmt.Sprintf("%.3f ms vs limit %.3f ms", g.TTFB.P50, f.TTFB.P50+0.5), verdict(g.TTFB.P50 <= f.TTFB.P50+0.5)})
		} else {
			na(name, goal, "c=1 stream legs missing or with errors")
		}
	}
	{
		s := r.Settings
		inflight := int(float64(s.Rate) * s.Slow.Seconds())
		name := fmt.Sprintf("%d in flight (open loop %d/s, upstream %v)", inflight, s.Rate, s.Slow)
		goal := "100% success and p99 − upstream latency ≤ 20 ms"
		g := r.leg(fmt.Sprintf("open %d/s llmgate", s.Rate))
		switch {
		case g == nil:
			na(name, goal, "leg missing")
		case g.Latency == nil:
			ts = append(ts, Target{name, goal, fmt.Sprintf("%.2f%% success, no successful request", g.SuccessPct), "MISS"})
		default:
			over := g.Latency.P99 - ms(s.Slow)
			ok := g.Errors == 0 && over <= 20
			ts = append(ts, Target{name, goal, fmt.Sprintf("%.2f%% success (%d of %d), p99 overhead %.1f ms, peak %d in flight", g.SuccessPct, g.Requests-g.Errors, g.Requests, over, g.MaxInFlight), verdict(ok)})
		}
	}
	gi := r.Gateway
	ts = append(ts,
		Target{"idle RSS", "≤ 64 MiB", fmt.Sprintf("%.1f MiB after %v idle (%.1f MiB at ready)", gi.IdleRSSMiB, r.Settings.Settle, gi.RSSAtReadyMiB), verdict(max(gi.IdleRSSMiB, gi.RSSAtReadyMiB) <= 64)},
		Target{"startup", "exec → /readyz 200 ≤ 500 ms", fmt.Sprintf("%.0f ms (listening after %.0f ms)", gi.StartupMs, gi.ListeningMs), verdict(gi.StartupMs <= 500)},
	)
	return ts
}

// contended reports whether other processes took more than 10% of the
// machine's CPU time during the leg.
func (r *report) contended(l Leg) bool {
	return l.ElapsedS > 0 && l.ForeignCPUSeconds > 0.1*l.ElapsedS*float64(r.Host.NumCPU)
}

func f3(v float64) string { return fmt.Sprintf("%.3f", v) }

// markdown is results.md: the legs, the open loop, the big stream, the
// gateway process, its memory, the errors and the targets.
func (r *report) markdown() string {
	var b strings.Builder
	r.mdHeader(&b)
	r.mdLegs(&b)
	r.mdRounds(&b)
	r.mdAPIs(&b)
	r.mdBudgets(&b)
	r.mdOpenLoop(&b)
	r.mdBigStream(&b)
	r.mdGateway(&b)
	r.memoryMarkdown(&b)
	r.mdErrors(&b)
	r.mdTargets(&b)
	return b.String()
}

// mdHeader is the title and how to read the tables.
func (r *report) mdHeader(b *strings.Builder) {
	s := r.Settings
	fmt.Fprintf(b, "# llmgate load results\n\n")
	if s.Quick {
		b.WriteString("**Quick mode: a check of the tool. These numbers mean nothing.**\n\n")
	}
	rounds := ""
	if s.rounds() > 1 {
		rounds = fmt.Sprintf(", %d rounds of each pooled (see Rounds)", s.rounds())
	}
	fmt.Fprintf(b, "%s · %s %s/%s · %d CPUs (GOMAXPROCS %d) · closed-loop legs %v after %v warm-up%s · fake content %d B\n\n",
		r.Started.Format(time.RFC3339), r.Host.GoVersion, r.Host.OS, r.Host.Arch, r.Host.NumCPU, r.Host.GOMAXPROCS,
		s.Duration, s.Warmup, rounds, s.ContentBytes)
	b.WriteString("The load generator, the fake upstream, the floor proxy and the gateway share this machine's CPUs. ")
	b.WriteString("Latency is send → last byte (streams: TTFB is send → first body byte); percentiles over successful requests; ")
	b.WriteString("req/s counts successes. Proxy columns are the process on the path (floor or llmgate): peak RSS during the leg (in brackets its anonymous part, sampled every 50 ms; the rest is file-mapped), CPU seconds used in it, and those per request served in µs.\n\n")

	fmt.Fprintf(b, "1-minute load average %s when the legs began, %s when they ended. ", r.LoadAvgStart, r.LoadAvgEnd)
	b.WriteString("\"Other CPU s\" is the CPU time processes other than this tool and its children took during the leg; ")
	b.WriteString("† marks legs where that exceeds 10% of the machine, whose numbers are contaminated by other work.\n\n")
}

// mdLegs is the table of every leg.
func (r *report) mdLegs(b *strings.Builder) {
	b.WriteString("| leg | requests | errors | req/s | p50 ms | p99 ms | p99.9 ms | TTFB p50 ms | TTFB p99 ms | proxy peak RSS MiB (anon) | proxy CPU s | proxy CPU µs/req | other CPU s |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, l := range r.Legs {
		p50, p99, p999 := "—", "—", "—"
		if l.Latency != nil {
			p50, p99, p999 = f3(l.Latency.P50), f3(l.Latency.P99), f3(l.Latency.P999)
		}
		t50, t99 := "", ""
		if l.TTFB != nil {
			t50, t99 = f3(l.TTFB.P50), f3(l.TTFB.P99)
		}
		rss, cpu, perReq := "", "", ""
		if l.Proxy != nil {
			rss, cpu = fmt.Sprintf("%.1f (%.1f)", l.Proxy.PeakRSSMiB, l.Proxy.PeakAnonMiB), fmt.Sprintf("%.2f", l.Proxy.CPUSeconds)
			if l.Requests > 0 {
				perReq = fmt.Sprintf("%.0f", cpuPerRequest(&l))
			}
		}
		other := "?"
		if l.ForeignCPUSeconds >= 0 {
			other = fmt.Sprintf("%.2f", l.ForeignCPUSeconds)
		}
		name := l.Name
		if r.contended(l) {
			name += " †"
		}
		fmt.Fprintf(b, "| %s | %d | %d | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			name, l.Requests, l.Errors, l.RPS, p50, p99, p999, t50, t99, rss, cpu, perReq, other)
	}
}

// mdAPIs compares each /v1/messages leg through a proxy with its chat
// twin of the same run: latency, and the proxy's CPU per request (its CPU
// seconds in the leg over the leg's requests). Without messages legs it
// writes nothing.
func (r *report) mdAPIs(b *strings.Builder) {
	r.mdTwins(b, twinTable{
		is:   func(l Leg) bool { return l.API == apiMessages },
		twin: func(name string) string { return strings.Replace(name, " messages", "", 1) },
		head: "\n## /v1/messages against /v1/chat/completions\n\n" +
			"Each /v1/messages leg beside its chat twin, same run, same fake (same content, same chunks). " +
			"CPU per request is the proxy process's CPU time in the leg over the leg's requests.\n\n" +
			"| leg | p50 ms chat / messages | p99 ms chat / messages | proxy CPU µs per request chat / messages |\n" +
			"|---|--:|--:|--:|\n",
		row: func(c, m *Leg) string {
			return fmt.Sprintf("| %s | %s / %s | %s / %s | %.0f / %.0f |\n", c.Name,
				latQ(c, 0.5), latQ(m, 0.5), latQ(c, 0.99), latQ(m, 0.99), cpuPerRequest(c), cpuPerRequest(m))
		},
	})
}

// mdBudgets compares each budgeted leg (the client with budgets that
// never run out) with the same leg of the unbudgeted client, same run:
// what reserving before and settling after each call costs. Without
// budgeted legs it writes nothing.
func (r *report) mdBudgets(b *strings.Builder) {
	r.mdTwins(b, twinTable{
		is:   func(l Leg) bool { return l.Budgeted },
		twin: func(name string) string { return strings.TrimSuffix(name, " budgeted") },
		head: "\n## Budgets on against off\n\n" +
			"Each budgeted leg (a client with a day and a minute token budget that never run out: a reservation before " +
			"and a settlement after every call) beside the same leg of a client without budgets, same run.\n\n" +
			"| leg | req/s off / on | p50 ms off / on | p99 ms off / on | proxy CPU µs per request off / on |\n" +
			"|---|--:|--:|--:|--:|\n",
		row: func(c, m *Leg) string {
			return fmt.Sprintf("| %s | %.0f / %.0f | %s / %s | %s / %s | %.0f / %.0f |\n", c.Name, c.RPS, m.RPS,
				latQ(c, 0.5), latQ(m, 0.5), latQ(c, 0.99), latQ(m, 0.99), cpuPerRequest(c), cpuPerRequest(m))
		},
	})
}

// twinTable is a table of legs beside their twins of the same run: the
// legs is picks, each beside the leg named twin(its name), under head
// (written once, before the first row), a row each.
type twinTable struct {
	is   func(Leg) bool
	twin func(name string) string
	head string
	row  func(twin, leg *Leg) string
}

// mdTwins writes t; with no leg and twin both through a proxy, nothing.
func (r *report) mdTwins(b *strings.Builder, t twinTable) {
	header := false
	for _, m := range r.Legs {
		if !t.is(m) || m.Proxy == nil {
			continue
		}
		c := r.leg(t.twin(m.Name))
		if c == nil || c.Proxy == nil {
			continue
		}
		if !header {
			header = true
			b.WriteString(t.head)
		}
		b.WriteString(t.row(c, &m))
	}
}

// latQ is a leg's p50 (q 0.5) or p99 (any other q) latency, or "—".
func latQ(l *Leg, q float64) string {
	if l.Latency == nil {
		return "—"
	}
	if q == 0.5 {
		return f3(l.Latency.P50)
	}
	return f3(l.Latency.P99)
}

// cpuPerRequest is the proxy's CPU microseconds per request in the leg.
func cpuPerRequest(l *Leg) float64 {
	if l.Proxy == nil || l.Requests == 0 {
		return 0
	}
	return l.Proxy.CPUSeconds * 1e6 / float64(l.Requests)
}

// mdOpenLoop is the open-loop legs' table.
func (r *report) mdOpenLoop(b *strings.Builder) {
	s := r.Settings
	inFlight := func(rate int) int { return int(float64(rate) * s.Slow.Seconds()) }
	b.WriteString("\n## Open loop\n\n")
	fmt.Fprintf(b, "Each leg fires its rate of requests a second for %v against an upstream that waits %v before answering: %d/s holds ≈%d in flight",
		s.OpenDuration, s.Slow, s.Rate, inFlight(s.Rate))
	if s.TargetRate > 0 {
		fmt.Fprintf(b, ", %d/s ≈%d", s.TargetRate, inFlight(s.TargetRate))
	}
	b.WriteString(". \"Added\" latency is the percentile less the upstream's wait.\n\n")
	b.WriteString("| leg | success % | peak in flight | worst send lag ms | p50 − upstream ms | p99 − upstream ms | p99.9 − upstream ms | proxy RSS before → after MiB (peak) | proxy threads before → after (peak) |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, l := range r.Legs {
		if l.Mode != "open" {
			continue
		}
		over := [3]string{"—", "—", "—"}
		if l.Latency != nil {
			up := ms(s.Slow)
			over = [3]string{fmt.Sprintf("%.1f", l.Latency.P50-up), fmt.Sprintf("%.1f", l.Latency.P99-up), fmt.Sprintf("%.1f", l.Latency.P999-up)}
		}
		rss, thr := "", ""
		if p := l.Proxy; p != nil {
			rss = fmt.Sprintf("%.1f → %.1f (%.1f)", p.RSSBeforeMiB, p.RSSAfterMiB, p.PeakRSSMiB)
			thr = fmt.Sprintf("%d → %d (%d)", p.ThreadsBefore, p.ThreadsAfter, p.ThreadsPeak)
		}
		fmt.Fprintf(b, "| %s | %.2f | %d | %.1f | %s | %s | %s | %s | %s |\n",
			r.legLabel(l), l.SuccessPct, l.MaxInFlight, l.MaxLagMs, over[0], over[1], over[2], rss, thr)
	}
}

// mdBigStream is, with -big, the big stream's table.
func (r *report) mdBigStream(b *strings.Builder) {
	s := r.Settings
	if s.Big {
		fmt.Fprintf(b, "\n## %d MiB stream\n\n", s.BigBytes>>20)
		fmt.Fprintf(b, "One unkeyed stream of %d content bytes in ~%d-byte events, per path.\n\n", s.BigBytes, s.BigChunkBytes)
		b.WriteString("| path | ok | body MiB | seconds | proxy RSS before MiB | proxy peak MiB | growth MiB |\n|---|---|--:|--:|--:|--:|--:|\n")
		for _, l := range r.Legs {
			if l.Kind != "big" {
				continue
			}
			before, peak, growth := "", "", ""
			if p := l.Proxy; p != nil {
				before, peak, growth = fmt.Sprintf("%.1f", p.RSSBeforeMiB), fmt.Sprintf("%.1f", p.PeakRSSMiB), fmt.Sprintf("%+.1f", p.PeakRSSMiB-p.RSSBeforeMiB)
			}
			ok := "yes"
			if l.Errors > 0 {
				ok = "no: " + strings.Join(l.FirstErrors, "; ")
			}
			fmt.Fprintf(b, "| %s | %s | %.1f | %.2f | %s | %s | %s |\n", l.Path, ok, float64(l.BodyBytes)/(1<<20), l.ElapsedS, before, peak, growth)
		}
	}
}

// mdGateway is the gateway process's startup, RSS and threads.
func (r *report) mdGateway(b *strings.Builder) {
	s := r.Settings
	gi := r.Gateway
	b.WriteString("\n## Gateway process\n\n")
	fmt.Fprintf(b, "- startup: exec → listening %.0f ms, → /readyz 200 %.0f ms\n", gi.ListeningMs, gi.StartupMs)
	fmt.Fprintf(b, "- RSS at ready %.1f MiB; after %v idle %.1f MiB (anonymous %.1f, file-mapped %.1f), %d threads\n",
		gi.RSSAtReadyMiB, s.Settle, gi.IdleRSSMiB, gi.IdleAnonMiB, gi.IdleFileMiB, gi.IdleThreads)
	fmt.Fprintf(b, "- at the end: RSS %.1f MiB (anonymous %.1f, file-mapped %.1f: Badger maps its files), %d threads; %.1f CPU seconds over the whole run\n",
		gi.RSSAtEndMiB, gi.AnonAtEndMiB, gi.FileAtEndMiB, gi.ThreadsAtEnd, gi.CPUTotalSeconds)
	b.WriteString("- threads are from /proc/PID/status; the Go runtime's figures (GC, heap goal) are in the memory section, from /metrics\n")
}

// mdErrors lists the legs that had errors, if any.
func (r *report) mdErrors(b *strings.Builder) {
	var errs []string
	for _, l := range r.Legs {
		if l.Errors > 0 {
			errs = append(errs, fmt.Sprintf("- %s: %d errors, e.g. %s", l.Name, l.Errors, strings.Join(l.FirstErrors, "; ")))
		}
	}
	if len(errs) > 0 {
		b.WriteString("\n## Errors\n\n" + strings.Join(errs, "\n") + "\n")
	}
}

// mdTargets is the targets' verdicts.
func (r *report) mdTargets(b *strings.Builder) {
	s := r.Settings
	b.WriteString("\n## Targets\n\n")
	if s.Quick {
		b.WriteString("(Quick mode: verdicts below are computed but meaningless.)\n\n")
	}
	var dirty []string
	for _, l := range r.Legs {
		if r.contended(l) {
			dirty = append(dirty, l.Name)
		}
	}
	if len(dirty) > 0 {
		fmt.Fprintf(b, "(Other processes competed for the CPUs during %d of %d legs (%s); verdicts that rest on them are not clean.)\n\n",
			len(dirty), len(r.Legs), strings.Join(dirty, ", "))
	}
	for _, t := range r.Targets {
		fmt.Fprintf(b, "- **%s** %s — %s: %s\n", t.Result, t.Name, t.Goal, t.Got)
	}
}
