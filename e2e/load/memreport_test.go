package main

import "testing"

// TestKeyedP999Target: keyed JSON p99.9 at the widest concurrency passes
// at or under twice the unkeyed p99.9 and misses over it, beside the p99
// target, which reads the p99s.
func TestKeyedP999Target(t *testing.T) {
	leg := func(name string, p99, p999 float64) Leg {
		return Leg{Name: name, Mode: "closed", Concurrency: 16, Requests: 100,
			Latency: &Dist{N: 100, P50: 1, P99: p99, P999: p999}}
	}
	for _, tc := range []struct {
		keyed999 float64
		want     string
	}{{20, "PASS"}, {21, "MISS"}} {
		r := &report{Legs: []Leg{leg("c=16 llmgate", 5, 10), leg("c=16 llmgate keyed", 6, tc.keyed999)}}
		got := map[string]Target{}
		for _, tg := range memTargets(r) {
			got[tg.Name] = tg
		}
		if g := got["keyed JSON p99.9, c=16"]; g.Result != tc.want || g.Goal != "keyed p99.9 ≤ 2 × unkeyed p99.9" {
			t.Errorf("keyed p99.9 %v: %+v, want %s", tc.keyed999, g, tc.want)
		}
		if g := got["keyed JSON p99, c=16"]; g.Got != "1.20×" {
			t.Errorf("keyed p99 reads %q", g.Got)
		}
	}
	r := &report{Legs: []Leg{leg("c=16 llmgate", 5, 10)}}
	for _, tg := range memTargets(r) {
		if tg.Name == "keyed JSON p99.9, c=16" && tg.Result != "n/a" {
			t.Errorf("without the keyed leg: %+v", tg)
		}
	}
}
