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
	if testing.Short() {
		t.Skip("builds and runs the gateway; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	if err := run(ctx, []string{"-quick", "-out", out}, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}

	var rep report
	js := readFile(t, out, "results.json")
	if err := json.Unmarshal(js, &rep); err != nil {
		t.Fatalf("results.json: %v", err)
	}
	want := []string{}
	for _, c := range []string{"c=1", "c=16"} {
		want = append(want, c+" direct", c+" floor", c+" llmgate", c+" llmgate keyed", c+" llmgate replay",
			c+" stream direct", c+" stream floor", c+" stream llmgate", c+" stream llmgate keyed")
	}
	want = append(want, "open 400/s direct", "open 400/s floor", "open 400/s llmgate")
	if len(rep.Legs) != len(want) {
		t.Errorf("%d legs, want %d", len(rep.Legs), len(want))
	}
	md := string(readFile(t, out, "results.md"))
	if md != stdout.String() {
		t.Error("results.md differs from what was printed")
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
	if len(rep.Targets) != 9 {
		t.Errorf("%d targets, want 9", len(rep.Targets))
	}
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
	dec := xml.NewDecoder(bytes.NewReader(svg))
	root := ""
	texts := 0
	for range 1 << 20 {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("chart.svg: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
			}
			if se.Name.Local == "text" {
				texts++
			}
		}
	}
	if root != "svg" {
		t.Errorf("chart.svg root <%s>", root)
	}
	if texts < len(want) {
		t.Errorf("chart.svg has %d labels for %d legs", texts, len(want))
	}
	for _, name := range want {
		if !bytes.Contains(svg, []byte(">"+name)) {
			t.Errorf("chart.svg has no row for %q", name)
		}
	}
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
	cfg := gatewayConfig("/tmp/x", "http://127.0.0.1:1", "http://127.0.0.1:2", "", storeChoice{Kind: "badger"}, "tok")
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
