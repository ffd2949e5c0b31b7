package main

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// openLegAt is a synthetic open-loop leg at 500/s against a 1 s upstream,
// with p99 and p99.9 of 1000 ms plus the given added latencies.
func openLegAt(name string, added99, added999 float64, errors int) Leg {
	return Leg{Name: name, Mode: "open", Rate: 500, Requests: 1500, Errors: errors,
		SuccessPct: 100 * float64(1500-errors) / 1500, UpstreamMs: 1000,
		Latency: &Dist{N: 1500 - errors, P50: 1001, P99: 1000 + added99, P999: 1000 + added999}}
}

func openTargetResults(r *report) map[string]Target {
	got := map[string]Target{}
	for _, tg := range openTargets(r) {
		got[tg.Name] = tg
	}
	return got
}

const (
	open99   = "500 in flight (open loop 500/s, upstream 1s), added p99"
	open999  = "500 in flight (open loop 500/s, upstream 1s), added p99.9"
	openKey9 = "500 in flight, keyed (open loop 500/s, upstream 1s), added p99"
)

// TestOpenTargets: at -target-rate, llmgate's added p99 and p99.9 (the
// percentile less the upstream's wait) pass at or under the floor's and
// miss over it; keyed passes up to 1.5 × the floor's added p99; a failed
// llmgate request misses whatever its latency; a missing leg, or a floor
// leg with failures, is n/a.
func TestOpenTargets(t *testing.T) {
	settings := settings{TargetRate: 500, Slow: time.Second}
	r := &report{Settings: settings, Legs: []Leg{
		openLegAt("open 500/s floor", 8, 20, 0),
		openLegAt("open 500/s llmgate", 8, 25, 0),          // p99 at the floor's; p99.9 over it
		openLegAt("open 500/s llmgate keyed", 12.5, 90, 0), // 1.56 × the floor's p99: over 1.5
	}}
	got := openTargetResults(r)
	for name, want := range map[string]string{open99: "PASS", open999: "MISS", openKey9: "MISS"} {
		if got[name].Result != want {
			t.Errorf("%s: %s (%s), want %s", name, got[name].Result, got[name].Got, want)
		}
	}
	if g := got[open999].Got; g != "100.00% success (1500 of 1500), added p99.9 25.0 ms vs limit 20.0 ms (floor 20.0 ms)" {
		t.Errorf("p99.9 reads %q", g)
	}
	if g := got[openKey9].Got; !strings.Contains(g, "added p99 12.5 ms vs limit 12.0 ms") {
		t.Errorf("keyed reads %q", g)
	}

	// Keyed at 1.5 × passes; a failed llmgate request misses although its
	// latency is within the limit.
	r.Legs[2] = openLegAt("open 500/s llmgate keyed", 12, 90, 0)
	r.Legs[1] = openLegAt("open 500/s llmgate", 1, 1, 3)
	got = openTargetResults(r)
	for name, want := range map[string]string{open99: "MISS", open999: "MISS", openKey9: "PASS"} {
		if got[name].Result != want {
			t.Errorf("%s: %s (%s), want %s", name, got[name].Result, got[name].Got, want)
		}
	}

	// No keyed leg; a floor with failures: n/a.
	r.Legs = []Leg{openLegAt("open 500/s floor", 8, 20, 1), openLegAt("open 500/s llmgate", 1, 1, 0)}
	got = openTargetResults(r)
	for _, name := range []string{open99, open999, openKey9} {
		if got[name].Result != "n/a" {
			t.Errorf("%s: %s (%s), want n/a", name, got[name].Result, got[name].Got)
		}
	}
	if len(got) != 3 {
		t.Errorf("%d targets, want 3: %v", len(got), got)
	}
}

// TestOpenLegs: the open-loop legs are direct, floor and llmgate at -rate
// and floor, llmgate and llmgate keyed at -target-rate; the comparison
// legs are left out with -target-rate 0, and run once when the two rates
// are one.
func TestOpenLegs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, []string{"open 2000/s direct", "open 2000/s floor", "open 2000/s llmgate",
			"open 500/s floor", "open 500/s llmgate", "open 500/s llmgate keyed"}},
		{[]string{"-target-rate", "0"}, []string{"open 2000/s direct", "open 2000/s floor", "open 2000/s llmgate"}},
		{[]string{"-target-rate", "2000"}, []string{"open 2000/s direct", "open 2000/s floor", "open 2000/s llmgate", "open 2000/s llmgate keyed"}},
		{[]string{"-quick", "-only", "keyed"}, []string{"open 100/s llmgate keyed"}},
	} {
		s, err := parseFlags(tc.args, io.Discard)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		var names []string
		for _, l := range s.openLegs() {
			names = append(names, l.Name)
			if l.UpstreamMs != ms(s.Slow) || l.Mode != "open" {
				t.Errorf("%q: leg %+v", tc.args, l)
			}
		}
		if !slices.Equal(names, tc.want) {
			t.Errorf("%q: legs %q, want %q", tc.args, names, tc.want)
		}
	}
	if _, err := parseFlags([]string{"-target-rate", "-1"}, io.Discard); err == nil || !strings.Contains(err.Error(), "-target-rate") {
		t.Errorf("-target-rate -1: err %v", err)
	}
}
