package main

import "fmt"

// cpuTarget is one of the CPU-per-request goals: the proxy's CPU per
// request in leg, at most limit times the floor's in floor.
type cpuTarget struct {
	leg, floor string
	limit      float64
}

// cpuGoals are the CPU-per-request ratios at 16 clients: llmgate's CPU
// per request in a leg against the floor proxy's in the same run (keyed
// legs against the floor's unkeyed twin: the floor has no keys).
var cpuGoals = []cpuTarget{
	{"c=16 llmgate", "c=16 floor", 1.10},
	{"c=16 stream llmgate", "c=16 stream floor", 1.15},
	{"c=16 llmgate keyed", "c=16 floor", 1.35},
	{"c=16 stream llmgate keyed", "c=16 stream floor", 1.6},
}

// cpuTargets are the CPU-per-request goals, measured (the proxy process's
// CPU time in the leg over the leg's requests).
func cpuTargets(r *report) []Target {
	var ts []Target
	for _, g := range cpuGoals {
		name := "CPU per request, " + g.leg
		goal := fmt.Sprintf("≤ %.2f × %s's", g.limit, g.floor)
		l, f := r.leg(g.leg), r.leg(g.floor)
		if !usable(l, f) || l.Proxy == nil || f.Proxy == nil || l.Requests == 0 || cpuPerRequest(f) == 0 {
			ts = append(ts, Target{name, goal, "legs missing or with errors", "n/a"})
			continue
		}
		got, floor := cpuPerRequest(l), cpuPerRequest(f)
		ts = append(ts, Target{name, goal, fmt.Sprintf("%.0f µs vs %.0f µs (%.2f×)", got, floor, got/floor), verdict(got <= g.limit*floor)})
	}
	return ts
}
