package main

import (
	"strings"
	"testing"
)

// TestCPUTargets: each CPU-per-request ratio is the leg's proxy CPU time
// over its requests against the floor's, PASS at or under its limit and
// MISS over it; a leg that did not run or had errors makes it n/a. The
// legs table shows the same µs per request.
func TestCPUTargets(t *testing.T) {
	leg := func(name string, requests int, cpuSeconds float64) Leg {
		return Leg{Name: name, Requests: requests, Latency: &Dist{N: requests, P50: 1, P99: 2, P999: 3},
			Proxy: &ProcUsage{CPUSeconds: cpuSeconds}}
	}
	r := &report{Legs: []Leg{
		leg("c=16 floor", 10000, 1.0),          // 100 µs
		leg("c=16 llmgate", 10000, 1.1),        // 110 µs: 1.10×, at the limit
		leg("c=16 stream floor", 1000, 0.2),    // 200 µs
		leg("c=16 stream llmgate", 1000, 0.24), // 240 µs: 1.20× > 1.15
		leg("c=16 llmgate keyed", 1000, 0.13),  // 130 µs: 1.30× the floor's JSON
		leg("c=16 stream llmgate keyed", 0, 0), // did not run
	}}
	got := map[string]Target{}
	for _, tg := range cpuTargets(r) {
		got[tg.Name] = tg
	}
	for name, want := range map[string]string{
		"CPU per request, c=16 llmgate":              "PASS",
		"CPU per request, c=16 stream llmgate":       "MISS",
		"CPU per request, c=16 llmgate keyed":        "PASS",
		"CPU per request, c=16 stream llmgate keyed": "n/a",
	} {
		if got[name].Result != want {
			t.Errorf("%s: %s (%s), want %s", name, got[name].Result, got[name].Got, want)
		}
	}
	if g := got["CPU per request, c=16 stream llmgate"].Got; g != "240 µs vs 200 µs (1.20×)" {
		t.Errorf("stream ratio reads %q", g)
	}
	var b strings.Builder
	r.mdLegs(&b)
	if !strings.Contains(b.String(), "| proxy CPU µs/req |") || !strings.Contains(b.String(), "| 1.10 | 110 |") {
		t.Errorf("legs table has no CPU per request column:\n%s", b.String())
	}
}
