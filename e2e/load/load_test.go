package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary be the tool's own children: run re-executes
// os.Executable() with -serve-fake or -serve-floor, which here is this
// binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && (isChildMode(os.Args[1]) || os.Args[1] == inCgroup) {
		if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
			os.Stderr.WriteString("load child: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestQuick runs the whole tool in -quick mode, end to end (building and
// starting the real gateway), and checks that its outputs are well formed,
// that every leg ran and that no request failed. It asserts nothing about
// timing.
func TestQuick(t *testing.T) {
	rep, stdout, out := runTool(t, "-quick", "-sustain", "300ms")
	want := []string{}
	for _, c := range []string{"c=1", "c=16"} {
		for _, api := range []string{c, c + " messages"} {
			want = append(want, api+" direct", api+" floor", api+" llmgate", api+" llmgate keyed", api+" llmgate replay",
				api+" stream direct", api+" stream floor", api+" stream llmgate", api+" stream llmgate keyed")
		}
		want = append(want, c+" llmgate budgeted", c+" llmgate keyed budgeted", c+" stream llmgate budgeted", c+" stream llmgate keyed budgeted")
	}
	want = append(want, "sustained c=16 llmgate keyed", "sustained c=16 stream llmgate keyed",
		"open 400/s direct", "open 400/s floor", "open 400/s llmgate",
		"open 100/s floor", "open 100/s llmgate", "open 100/s llmgate keyed")
	if len(rep.Legs) != len(want) {
		t.Errorf("%d legs, want %d", len(rep.Legs), len(want))
	}
	md := string(readFile(t, out, "results.md"))
	if md != stdout {
		t.Error("results.md differs from what was printed")
	}
	if _, cmp, ok := strings.Cut(md, "## /v1/messages against /v1/chat/completions"); !ok || !strings.Contains(cmp, "| c=16 stream llmgate keyed | ") {
		t.Error("results.md does not compare the /v1/messages legs with the chat legs")
	}
	if _, cmp, ok := strings.Cut(md, "## Budgets on against off"); !ok || !strings.Contains(cmp, "| c=16 stream llmgate keyed | ") {
		t.Error("results.md does not compare the budgeted legs with the unbudgeted ones")
	}
	for _, name := range want {
		l := rep.leg(name)
		if l == nil {
			t.Errorf("leg %q missing", name)
			continue
		}
		if l.Requests == 0 || l.Latency == nil || l.Latency.N != l.Requests-l.Errors {
			t.Errorf("leg %q: %d requests, latency %+v", name, l.Requests, l.Latency)
		}
		if l.Errors != 0 {
			t.Errorf("leg %q: %d errors: %q", name, l.Errors, l.FirstErrors)
		}
		if (l.Kind == "stream") != (l.TTFB != nil) {
			t.Errorf("leg %q (%s): TTFB %+v", name, l.Kind, l.TTFB)
		}
		if l.Path != "direct" && l.Proxy == nil {
			t.Errorf("leg %q: no process usage for the %s", name, l.Path)
		}
		if !strings.Contains(md, "| "+name+" |") && !strings.Contains(md, "| "+name+" † |") {
			t.Errorf("results.md has no row for %q", name)
		}
	}
	if l := rep.leg("open 400/s llmgate"); l != nil && l.MaxInFlight < 50 {
		t.Errorf("open loop held only %d in flight", l.MaxInFlight)
	}
	if rep.Gateway.StartupMs <= 0 || rep.Gateway.IdleRSSMiB <= 0 {
		t.Errorf("gateway info not measured: %+v", rep.Gateway)
	}
	if len(rep.Targets) != 22 {
		t.Errorf("%d targets, want 22", len(rep.Targets))
	}
	checkMemory(t, &rep, out)
	for _, tg := range rep.Targets {
		if tg.Result != "PASS" && tg.Result != "MISS" {
			t.Errorf("target %q: result %q (%s)", tg.Name, tg.Result, tg.Got)
		}
		if !strings.Contains(md, "**"+tg.Result+"** "+tg.Name) {
			t.Errorf("results.md does not show target %q", tg.Name)
		}
	}

	// The chart is well-formed XML with an <svg> root and a row per leg.
	svg := readFile(t, out, "chart.svg")
	if texts := svgElements(t, "chart.svg", svg)["text"]; texts < len(want) {
		t.Errorf("chart.svg has %d labels for %d legs", texts, len(want))
	}
	for _, name := range want {
		if !bytes.Contains(svg, []byte(">"+name)) {
			t.Errorf("chart.svg has no row for %q", name)
		}
	}
}

// runTool runs the whole tool with args, writing to a temporary -out, and
// returns its report as results.json has it, what it printed and the
// directory. It builds and runs the gateway: skipped with -short.
func runTool(t *testing.T, args ...string) (rep report, stdout, out string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the gateway; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out = t.TempDir()
	var so, se bytes.Buffer
	if err := run(ctx, append(args, "-out", out), &so, &se); err != nil {
		t.Fatalf("run: %v\n%s", err, se.String())
	}
	if err := json.Unmarshal(readFile(t, out, "results.json"), &rep); err != nil {
		t.Fatalf("results.json: %v", err)
	}
	return rep, so.String(), out
}

func readFile(t *testing.T, dir, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDist(t *testing.T) {
	var ds []time.Duration
	for i := 1000; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	d := dist(ds)
	if d.N != 1000 || d.P50 != 500 || d.P99 != 990 || d.P999 != 999 || d.Max != 1000 {
		t.Errorf("dist = %+v", d)
	}
	if dist(nil) != nil {
		t.Error("dist(nil) != nil")
	}
}

func TestGatewayConfigIsLoopback(t *testing.T) {
	cfg := gatewayConfig(gatewaySetup{dataDir: "/tmp/x", adminToken: "tok", store: storeChoice{Kind: "badger"},
		fake: "http://127.0.0.1:1", slow: "http://127.0.0.1:2"})
	if !strings.Contains(cfg, "listen: 127.0.0.1:0") || strings.Contains(cfg, "big-gpt") {
		t.Errorf("config:\n%s", cfg)
	}
	for _, ok := range []string{"127.0.0.1:80", "127.0.0.1", "[::1]:1"} {
		if !isLoopback(ok) {
			t.Errorf("isLoopback(%q) = false", ok)
		}
	}
	for _, bad := range []string{"localhost:80", "10.0.0.1:80", "example.com", ""} {
		if isLoopback(bad) {
			t.Errorf("isLoopback(%q) = true", bad)
		}
	}
}

// svgElements checks that b is well-formed XML with an <svg> root and
// counts its elements by name.
func svgElements(t *testing.T, name string, b []byte) map[string]int {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(b))
	n := map[string]int{}
	root := ""
	for range 1 << 20 {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
			}
			n[se.Name.Local]++
		}
	}
	if root != "svg" {
		t.Errorf("%s root <%s>", name, root)
	}
	return n
}

// checkMemory checks the memory figures: the gateway's Go runtime read
// from its /metrics with the admin token on every llmgate leg, the data
// dir measured, the RSS timeline sampled over the sustained legs and
// drawn in rss.svg with one line per series.
func checkMemory(t *testing.T, rep *report, out string) {
	t.Helper()
	for _, l := range rep.Legs {
		if l.Path != "llmgate" || l.Proxy == nil {
			continue
		}
		if g := l.Proxy.GC; g == nil || g.HeapGoalMaxMiB <= 0 {
			t.Errorf("leg %q: no Go runtime figures from /metrics: %+v", l.Name, g)
		}
		if l.Proxy.PeakAnonMiB <= 0 || l.Proxy.PeakFileMiB <= 0 {
			t.Errorf("leg %q: anonymous/file RSS not sampled: %+v", l.Name, l.Proxy)
		}
	}
	if d := rep.Gateway.DataDir; d == nil || d.Files == 0 || d.ApparentMiB <= 0 {
		t.Errorf("data dir not measured: %+v", d)
	}
	if rep.Gateway.AfterIdleRSSMiB <= 0 || rep.Gateway.AfterIdleAnonMiB <= 0 {
		t.Errorf("RSS after idle not measured: %+v", rep.Gateway)
	}
	if len(rep.Timeline) < 2 {
		t.Fatalf("%d timeline points over the sustained legs", len(rep.Timeline))
	}
	if n := svgElements(t, "rss.svg", readFile(t, out, "rss.svg"))["polyline"]; n != 4 {
		t.Errorf("rss.svg has %d lines, want 4 (RSS, anonymous, file-mapped, heap goal)", n)
	}
}

// TestAPIsFlag: -apis names the closed-loop legs' APIs, both by default;
// anything else is refused.
func TestAPIsFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, []string{apiChat, apiMessages}},
		{[]string{"-apis", "messages"}, []string{apiMessages}},
		{[]string{"-apis", "chat, chat"}, []string{apiChat}},
	} {
		s, err := parseFlags(tc.args, io.Discard)
		if err != nil || !slices.Equal(s.APIs, tc.want) {
			t.Errorf("%q: APIs %q, err %v; want %q", tc.args, s.APIs, err, tc.want)
		}
	}
	if _, err := parseFlags([]string{"-apis", "chat,responses"}, io.Discard); err == nil || !strings.Contains(err.Error(), `-apis: "responses"`) {
		t.Errorf("-apis chat,responses: err %v", err)
	}
}
