package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

// TestRoundPool: a leg's rounds pool into one leg whose requests, errors,
// elapsed time, proxy CPU and GC cycles are the rounds' sums, whose peaks
// are the highest and whose percentiles are over every round's samples
// (not an average of the rounds' percentiles); a round without proxy
// figures leaves the pooled leg without them rather than with a part.
func TestRoundPool(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		var ds []time.Duration
		for _, v := range vs {
			ds = append(ds, time.Duration(v)*time.Millisecond)
		}
		return ds
	}
	round := func(r int, cpu, peak float64, lat []time.Duration) (Leg, legSamples) {
		return Leg{Name: "c=16 llmgate", Kind: "json", Mode: "closed", Round: r, ForeignCPUSeconds: 0.1,
				Proxy: &ProcUsage{CPUSeconds: cpu, PeakRSSMiB: peak, PeakAnonMiB: peak / 2, RSSBeforeMiB: float64(r),
					GC: &GCUsage{Cycles: 10, HeapGoalMaxMiB: peak, CPUFraction: float64(r) / 100}}},
			legSamples{lat: lat, ttfb: lat, issued: len(lat) + 1, errors: 1, firstErrors: []string{"boom"},
				elapsed: time.Second, bodyBytes: 100}
	}
	var p roundPool
	// Round 1 is fast, round 2 slow: a p99.9 of the pool is round 2's
	// worst, where a mean of the rounds' p99.9 would not be.
	fast := make([]int, 999)
	for i := range fast {
		fast[i] = 1
	}
	p.add(round(1, 1.0, 40, ms(fast...)))
	p.add(round(2, 3.0, 30, ms(50, 60)))
	legs := p.legs()
	if len(legs) != 1 {
		t.Fatalf("%d pooled legs, want 1", len(legs))
	}
	l := legs[0]
	if l.Rounds != 2 || l.Round != 0 || l.Requests != 1003 || l.Errors != 2 || l.ElapsedS != 2 || l.BodyBytes != 200 {
		t.Errorf("pooled leg: rounds %d round %d requests %d errors %d elapsed %v bytes %d", l.Rounds, l.Round, l.Requests, l.Errors, l.ElapsedS, l.BodyBytes)
	}
	if len(l.FirstErrors) != 1 {
		t.Errorf("first errors %q, want one boom", l.FirstErrors)
	}
	if l.Latency.N != 1001 || l.Latency.P999 != 50 || l.Latency.Max != 60 || l.Latency.P50 != 1 {
		t.Errorf("pooled latency %+v: want the percentiles of all 1,001 samples (p99.9 50 ms)", l.Latency)
	}
	if got := cpuPerRequest(&l); got != 4e6/1003 {
		t.Errorf("CPU per request %v, want the rounds' CPU over their requests", got)
	}
	pu := l.Proxy
	if pu.PeakRSSMiB != 40 || pu.PeakAnonMiB != 20 || pu.RSSBeforeMiB != 1 || pu.GC.Cycles != 20 || pu.GC.HeapGoalMaxMiB != 40 {
		t.Errorf("pooled proxy figures %+v (GC %+v)", pu, pu.GC)
	}
	if l.ForeignCPUSeconds < 0.19 || l.ForeignCPUSeconds > 0.21 {
		t.Errorf("other CPU %v, want the rounds' sum", l.ForeignCPUSeconds)
	}
	p.add(round(3, 1.0, 10, ms(1)))
	three := p.legs()[0]
	if f := three.Proxy.GC.CPUFraction; f < 0.0199 || f > 0.0201 {
		t.Errorf("GC CPU share over rounds of 1%%, 2%% and 3%%: %v, want their mean, 2%%", f)
	}
	if again := p.legs()[0]; again.Proxy.GC.CPUFraction != three.Proxy.GC.CPUFraction {
		t.Errorf("pooling twice changed the GC share: %v then %v", three.Proxy.GC.CPUFraction, again.Proxy.GC.CPUFraction)
	}

	l3, s3 := round(4, 1, 1, ms(1))
	l3.Proxy = nil
	p.add(l3, s3)
	if l := p.legs()[0]; l.Proxy != nil || l.Rounds != 4 {
		t.Errorf("a round without proxy figures: pooled proxy %+v, rounds %d; want none", l.Proxy, l.Rounds)
	}
}

// TestRoundsTable: the rounds table gives each round's ratio, their
// median and the pooled legs' ratio, for each CPU goal measured; a run of
// one round has no table.
func TestRoundsTable(t *testing.T) {
	leg := func(name string, round, requests int, cpu float64) Leg {
		return Leg{Name: name, Round: round, Requests: requests, Latency: &Dist{N: requests, P50: 1, P99: 2, P999: 3},
			Proxy: &ProcUsage{CPUSeconds: cpu}}
	}
	r := &report{Settings: settings{Rounds: 3},
		RoundLegs: []Leg{
			leg("c=16 floor", 1, 1000, 0.1), leg("c=16 llmgate keyed", 1, 1000, 0.15), // 1.50
			leg("c=16 floor", 2, 1000, 0.1), leg("c=16 llmgate keyed", 2, 1000, 0.12), // 1.20
			leg("c=16 floor", 3, 1000, 0.2), leg("c=16 llmgate keyed", 3, 1000, 0.26), // 1.30
		},
		Legs: []Leg{leg("c=16 floor", 0, 3000, 0.4), leg("c=16 llmgate keyed", 0, 3000, 0.54)}, // 1.35
	}
	var b strings.Builder
	r.mdRounds(&b)
	want := "| CPU per request, c=16 llmgate keyed ÷ c=16 floor (target ≤ 1.35) | 1.50 | 1.20 | 1.30 | 1.30 | 1.35 |"
	if !strings.Contains(b.String(), want) {
		t.Errorf("rounds table lacks\n%s\n:\n%s", want, b.String())
	}
	if strings.Contains(b.String(), "stream") {
		t.Errorf("rounds table has a row for legs that did not run:\n%s", b.String())
	}
	r.Settings.Rounds = 1
	b.Reset()
	r.mdRounds(&b)
	if b.Len() != 0 {
		t.Errorf("one round wrote a rounds table:\n%s", b.String())
	}
	if median([]float64{3, 1, 2, 10}) != 2.5 || median([]float64{5}) != 5 {
		t.Error("median")
	}
}

// TestRoundsFlag: -rounds takes 1 to 50.
func TestRoundsFlag(t *testing.T) {
	for _, bad := range []string{"0", "51", "-1"} {
		if _, err := parseFlags([]string{"-rounds", bad}, io.Discard); err == nil || !strings.Contains(err.Error(), "-rounds") {
			t.Errorf("-rounds %s: err %v, want one naming -rounds", bad, err)
		}
	}
	if s, err := parseFlags([]string{"-rounds", "3"}, io.Discard); err != nil || s.rounds() != 3 {
		t.Errorf("-rounds 3: %d, %v", s.rounds(), err)
	}
}

// TestQuickRounds runs two rounds of a few closed-loop and open-loop legs
// against the real gateway: the second round's fresh keys are new to the
// store (a key replayed would fail the leg), results.json keeps every
// round's legs beside the pooled ones, each pooled leg has its rounds'
// requests, and the rounds table follows both kinds of leg.
func TestQuickRounds(t *testing.T) {
	rep, stdout, _ := runTool(t, "-quick", "-rounds", "2", "-c", "16", "-apis", "chat",
		"-only", "^(c=16 (floor|llmgate keyed|llmgate replay|stream llmgate keyed)|open 100/s (floor|llmgate keyed))$")
	names := []string{"c=16 floor", "c=16 llmgate keyed", "c=16 llmgate replay", "c=16 stream llmgate keyed",
		"open 100/s floor", "open 100/s llmgate keyed"}
	if len(rep.Legs) != len(names) || len(rep.RoundLegs) != 2*len(names) {
		t.Fatalf("%d legs and %d round legs, want %d and %d", len(rep.Legs), len(rep.RoundLegs), len(names), 2*len(names))
	}
	for _, name := range names {
		l := rep.leg(name)
		r1, r2 := rep.roundLeg(1, name), rep.roundLeg(2, name)
		if l == nil || r1 == nil || r2 == nil {
			t.Errorf("%s: pooled %v, round 1 %v, round 2 %v", name, l != nil, r1 != nil, r2 != nil)
			continue
		}
		if l.Errors+r1.Errors+r2.Errors > 0 {
			t.Errorf("%s: errors %v %v", name, r1.FirstErrors, r2.FirstErrors)
		}
		if l.Rounds != 2 || l.Requests != r1.Requests+r2.Requests || l.Requests == 0 {
			t.Errorf("%s: pooled %d requests over %d rounds, rounds had %d and %d", name, l.Requests, l.Rounds, r1.Requests, r2.Requests)
		}
		if l.Proxy == nil || l.Proxy.CPUSeconds <= r1.Proxy.CPUSeconds {
			t.Errorf("%s: pooled proxy figures %+v", name, l.Proxy)
		}
	}
	for _, row := range []string{"| CPU per request, c=16 llmgate keyed ÷ c=16 floor (target ≤ 1.35) |",
		"| added p99, open 100/s llmgate keyed ÷ open 100/s floor (target ≤ 1.5) |"} {
		if !strings.Contains(stdout, row) {
			t.Errorf("the rounds table has no row %s:\n%s", row, stdout)
		}
	}
}
