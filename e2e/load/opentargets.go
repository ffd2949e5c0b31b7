package main

import "fmt"

// openGoal is one of the open-loop goals at -target-rate: the
// latency leg adds to the upstream's wait at percentile q, at most limit
// times what the floor adds in the same run.
type openGoal struct {
	label string // "" or ", keyed"
	leg   string // the leg's name after "open <rate>/s "
	q     string // p99 or p99.9
	limit float64
}

var openGoals = []openGoal{
	{"", "llmgate", "p99", 1},
	{"", "llmgate", "p99.9", 1},
	{", keyed", "llmgate keyed", "p99", 1.5},
}

// openPrefix is what the names of the open-loop legs at -target-rate
// begin with.
func openPrefix(s settings) string { return fmt.Sprintf("open %d/s ", s.TargetRate) }

// legs are g's two legs, found by leg: llmgate's and the floor's.
func (g openGoal) legs(s settings, leg func(string) *Leg) (l, floor *Leg) {
	return leg(openPrefix(s) + g.leg), leg(openPrefix(s) + "floor")
}

// added is what a leg of latencies d added to the upstream's wait at g's
// percentile.
func (g openGoal) added(s settings, d *Dist) float64 { return quantile(d, g.q) - ms(s.Slow) }

// quantile is d's p99 or p99.9.
func quantile(d *Dist, q string) float64 {
	if q == "p99.9" {
		return d.P999
	}
	return d.P99
}

// openTargets are the open-loop goals: at -target-rate against the
// slow fake, the latency llmgate adds to the upstream's wait (a
// percentile less the wait) against the floor's, every request a success.
// A failed llmgate request is a MISS; a missing leg, or a floor leg with
// failures (no honest baseline), makes it n/a.
func openTargets(r *report) []Target {
	s := r.Settings
	var ts []Target
	for _, g := range openGoals {
		inflight := int(float64(s.TargetRate) * s.Slow.Seconds())
		name := fmt.Sprintf("%d in flight%s (open loop %d/s, upstream %v), added %s", inflight, g.label, s.TargetRate, s.Slow, g.q)
		goal := fmt.Sprintf("100%% success and %s added %s ≤ floor's added %s", g.leg, g.q, g.q)
		if g.limit != 1 {
			goal = fmt.Sprintf("100%% success and %s added %s ≤ %.1f × floor's added %s", g.leg, g.q, g.limit, g.q)
		}
		l, f := g.legs(s, r.leg)
		switch {
		case s.TargetRate == 0 || l == nil || f == nil:
			ts = append(ts, Target{name, goal, "legs missing", "n/a"})
			continue
		case !usable(f):
			ts = append(ts, Target{name, goal, fmt.Sprintf("the floor's leg failed (%.2f%% success)", f.SuccessPct), "n/a"})
			continue
		case l.Latency == nil:
			ts = append(ts, Target{name, goal, fmt.Sprintf("%.2f%% success, no successful request", l.SuccessPct), "MISS"})
			continue
		}
		got, floor := g.added(s, l.Latency), g.added(s, f.Latency)
		lim := g.limit * floor
		ts = append(ts, Target{name, goal, fmt.Sprintf("%.2f%% success (%d of %d), added %s %.1f ms vs limit %.1f ms (floor %.1f ms)",
			l.SuccessPct, l.Requests-l.Errors, l.Requests, g.q, got, lim, floor), verdict(l.Errors == 0 && got <= lim)})
	}
	return ts
}
