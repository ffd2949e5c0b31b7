package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/llmgate/llmgate/e2e/load/cgroup"
)

// CgroupInfo is the memory cgroup the gateway ran in, and what the kernel
// said about it at the end.
type CgroupInfo struct {
	Dir   string       `json:"dir"`
	V2    bool         `json:"v2"`
	Made  bool         `json:"made_by_tool"`
	Start cgroup.Stats `json:"at_ready"`
	End   cgroup.Stats `json:"at_end"`
	// PeakSampledMiB is the highest usage the timeline saw (a kernel
	// without a peak file still gets a figure).
	PeakSampledMiB float64 `json:"peak_sampled_mib,omitempty"`
}

// gatewayCgroup is the cgroup -cgroup names or -cgroup-limit makes, or
// nil. remove undoes what the tool made (call it after the gateway exited).
func gatewayCgroup(s settings, runID string) (g *cgroup.Group, made bool, err error) {
	switch {
	case s.Cgroup != "":
		return cgroup.Open(s.Cgroup), false, nil
	case s.CgroupLimit > 0:
		g, err := cgroup.New("llmgate-load-"+runID, s.CgroupLimit)
		return g, err == nil, err
	}
	return nil, false, nil
}

// randomToken is a fresh admin token for the run's gateway.
func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// sustainLegs runs the sustained keyed legs — JSON, then streams, a new key
// every request, -sustain-c clients for -sustain each — sampling the
// gateway's memory every 250 ms on the returned timeline, which the caller
// stops after the idle time that follows.
func (m *measurement) sustainLegs() (*timeline, error) {
	ctx, s, p, runID, cg := m.ctx, m.s, m.p, m.runID, m.cg
	start := time.Now()
	var usage func() float64
	if cg != nil {
		usage = func() float64 {
			st, _ := cg.Stats()
			return float64(st.UsageBytes) / (1 << 20)
		}
	}
	tl := startTimeline(p.gw, usage, start, 250*time.Millisecond)
	for _, kind := range []string{"json", "stream"} {
		l := Leg{Path: "llmgate", Kind: kind, API: apiChat, Keys: freshKey, Mode: "sustained", Concurrency: s.SustainC}
		l.Name = legName(l)
		if !s.runs(l.Name) {
			continue
		}
		tl.setLeg(l.Name)
		url, proxy := p.base("llmgate", modelFast)
		sh := &shot{url: url, body: chatBody(modelFast, kind == "stream"), stream: kind == "stream", keys: freshKey,
			key: fmt.Sprintf("load-%s-sustain-%s-", runID, kind)}
		c := newClient(s.SustainC)
		var lw legWatch
		var pf *profile
		o := closedLoop(ctx, c, sh, closedPlan{conc: s.SustainC, dur: s.Sustain, measuring: func() {
			lw = watchLeg(p.pids(), proxy)
			pf = startProfile(s, proxy, l.Name, s.Sustain)
		}})
		pf.wait()
		if err := m.endLeg(l, lw, c, o); err != nil {
			return tl, err
		}
	}
	tl.setLeg("idle")
	return tl, nil
}
