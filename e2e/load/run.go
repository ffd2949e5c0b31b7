package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// settings are the run's parameters, after -quick and the flags.
type settings struct {
	Quick         bool          `json:"quick"`
	Duration      time.Duration `json:"duration_ns"`
	Warmup        time.Duration `json:"warmup_ns"`
	Concurrency   []int         `json:"concurrency"`
	APIs          []string      `json:"apis"`
	ContentBytes  int           `json:"content_bytes"`
	Slow          time.Duration `json:"slow_ns"`
	Rate          int           `json:"rate"`
	TargetRate    int           `json:"target_rate"`
	OpenDuration  time.Duration `json:"open_duration_ns"`
	Big           bool          `json:"big"`
	BigBytes      int           `json:"big_bytes"`
	BigChunkBytes int           `json:"big_chunk_bytes"`
	Settle        time.Duration `json:"settle_ns"`
	Gateway       string        `json:"gateway"`
	Only          string        `json:"only,omitempty"`
	Sustain       time.Duration `json:"sustain_ns,omitempty"`
	SustainC      int           `json:"sustain_concurrency,omitempty"`
	IdleAfter     time.Duration `json:"idle_after_ns"`
	Store         storeChoice   `json:"store"`
	Cgroup        string        `json:"cgroup,omitempty"`
	Pprof         string        `json:"pprof,omitempty"`
	ConfigExtra   string        `json:"config_extra,omitempty"`
	CgroupLimit   int64         `json:"cgroup_limit_bytes,omitempty"`
	// Rounds is how many times the closed-loop and the open-loop legs
	// run (-rounds); their figures are pooled over them.
	Rounds int    `json:"rounds,omitempty"`
	Out    string `json:"-"`

	only *regexp.Regexp // compiled Only
}

// run is the whole tool. A first argument of -serve-fake or -serve-floor
// makes it one of its own child processes instead.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && isChildMode(args[0]) {
		return runChild(ctx, args, stdout, stderr)
	}
	if len(args) > 0 && args[0] == inCgroup {
		return execInCgroup(args[1:], os.Environ())
	}
	s, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	raiseFileLimit()

	rep := &report{
		Started:  time.Now().UTC(),
		Settings: s,
		Host: hostInfo{
			GoVersion:  runtime.Version(),
			OS:         runtime.GOOS,
			Arch:       runtime.GOARCH,
			NumCPU:     runtime.NumCPU(),
			GOMAXPROCS: runtime.GOMAXPROCS(0),
		},
	}
	if err := measure(ctx, s, rep, stderr); err != nil {
		return err
	}
	rep.Targets = slices.Concat(targets(rep), memTargets(rep), cpuTargets(rep), openTargets(rep))

	md := rep.markdown()
	if _, err := io.WriteString(stdout, md); err != nil {
		return err
	}
	if s.Out == "" {
		return nil
	}
	if err := os.MkdirAll(s.Out, 0o755); err != nil {
		return err
	}
	js, err := rep.json()
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"results.md":   []byte(md),
		"results.json": js,
		"chart.svg":    chartSVG(rep),
	}
	if svg := rssChartSVG(rep); svg != nil {
		files["rss.svg"] = svg
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(s.Out, name), b, 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(stderr, "load: wrote results.md, results.json and chart.svg to %s\n", s.Out)
	return nil
}

func parseFlags(args []string, stderr io.Writer) (settings, error) {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "write results.md, results.json and chart.svg to this `dir`")
	gw := fs.String("gateway", "", "gateway binary `path` (default: go build ./cmd/gateway into a temp dir)")
	quick := fs.Bool("quick", false, "tiny durations and 100 in flight, for checking the tool (numbers meaningless); no -big")
	dur := fs.Duration("duration", 5*time.Second, "measured time of each closed-loop leg")
	warm := fs.Duration("warmup", time.Second, "unmeasured warm-up before each closed-loop leg")
	conc := fs.String("c", "1,16", "closed-loop concurrencies, comma-separated")
	apis := fs.String("apis", "chat,messages", "the APIs of the closed-loop legs, comma-separated: chat (/v1/chat/completions), messages (/v1/messages); with -only '^c=' just the closed-loop legs run")
	content := fs.Int("content-bytes", 1024, "size of the fake's completion content")
	slow := fs.Duration("slow", time.Second, "the slow fake's latency, for the open-loop legs")
	rate := fs.Int("rate", 2000, "open-loop request rate per second (rate × slow calls in flight)")
	targetRate := fs.Int("target-rate", 500, "open-loop rate per second of the issue's comparison legs: floor, llmgate and llmgate keyed (a fresh Idempotency-Key per request), target-rate × slow in flight; 0: none")
	openDur := fs.Duration("open-duration", 3*time.Second, "how long the open-loop legs fire requests")
	big := fs.Bool("big", true, "stream a -big-bytes response through each path and report peak RSS growth (default false with -quick)")
	bigBytes := fs.Int("big-bytes", 50<<20, "content size of the -big stream")
	bigChunk := fs.Int("big-chunk-bytes", 64, "content bytes per event of the -big stream")
	settle := fs.Duration("settle", time.Second, "idle time after the gateway is ready before its idle RSS is read")
	only := fs.String("only", "", "run only the legs whose names match this `regexp` (e.g. 'open|big'); targets needing others show n/a")
	sustain := fs.Duration("sustain", 0, "after the closed-loop legs, a sustained keyed leg of this `duration` each for JSON then streams (a new key every request), with an RSS-over-time chart (rss.svg); 0: none")
	sustainC := fs.Int("sustain-c", 16, "clients of the sustained legs")
	idleAfter := fs.Duration("idle-after", 15*time.Second, "idle time after the last leg before the gateway's idle RSS is read again")
	store := fs.String("store", "badger", "the gateway's store: badger (in a temp data dir) or redis")
	redisURL := fs.String("redis-url", "redis://127.0.0.1:6379/0", "with -store redis: the server (a fresh key prefix is used per run)")
	cg := fs.String("cgroup", "", "run the gateway inside this existing cgroup `dir` (its memory figures and OOM kills are reported)")
	cgLimit := fs.String("cgroup-limit", "", "run the gateway in a new memory cgroup with this limit (e.g. 256MiB) and swap off, made inside the tool's own cgroup and removed at the end")
	pprofKind := fs.String("pprof", "", "profile the gateway over each of its legs: `kind` profile (CPU), trace (execution trace), or heap, allocs, block, mutex (the change over the leg), written to -out as <leg>.<kind>")
	rounds := fs.Int("rounds", 1, "run the closed-loop legs, then the open-loop ones, this many times over, round after round, and pool each leg's rounds: the floor and the gateway take turns, the ratios and percentiles rest on N times the requests, and a table gives each round's ratios")
	extra := fs.String("config-extra", "", "YAML appended to the gateway's config, top-level keys it does not set (e.g. 'memory: {limit_ratio: 0.7}')")
	if err := fs.Parse(args); err != nil {
		return settings{}, err
	}
	if fs.NArg() > 0 {
		return settings{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	s := settings{
		Quick: *quick, Duration: *dur, Warmup: *warm, ContentBytes: *content,
		Slow: *slow, Rate: *rate, TargetRate: *targetRate, OpenDuration: *openDur, Big: *big,
		BigBytes: *bigBytes, BigChunkBytes: *bigChunk, Settle: *settle,
		Gateway: *gw, Out: *out, Only: *only, Sustain: *sustain, SustainC: *sustainC, IdleAfter: *idleAfter,
		Store: storeChoice{Kind: *store}, Cgroup: *cg, Pprof: *pprofKind, ConfigExtra: *extra,
		Rounds: *rounds,
	}
	if *quick {
		s.quickDefaults(set)
	}
	// A bad -only is reported alone.
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			return settings{}, fmt.Errorf("-only: %w", err)
		}
		s.only = re
	}
	return s, errors.Join(s.complete(*redisURL, *cgLimit, *conc), s.parseAPIs(*apis))
}

// quickDefaults shrinks, for -quick, each default not in set (the flags
// given explicitly). Quick mode checks the tool, not the gateway: 400/s
// against a 250ms upstream for 250ms holds ~100 calls in flight, and the
// comparison legs' 100/s (a quarter of it, as 500/s is of 2000/s) ~25.
func (s *settings) quickDefaults(set map[string]bool) {
	short := func(name string, p *time.Duration, v time.Duration) {
		if !set[name] {
			*p = v
		}
	}
	short("duration", &s.Duration, 300*time.Millisecond)
	short("warmup", &s.Warmup, 100*time.Millisecond)
	short("slow", &s.Slow, 250*time.Millisecond)
	short("open-duration", &s.OpenDuration, 250*time.Millisecond)
	short("settle", &s.Settle, 200*time.Millisecond)
	if !set["rate"] {
		s.Rate = 400
	}
	if !set["target-rate"] {
		s.TargetRate = 100
	}
	if !set["big"] {
		s.Big = false
	}
	short("idle-after", &s.IdleAfter, 200*time.Millisecond)
}

// complete fills in what the flags -redis-url, -cgroup-limit and -c give,
// and checks every setting, joining every problem found.
func (s *settings) complete(redisURL, cgLimit, conc string) error {
	var errs []error
	switch s.Store.Kind {
	case "badger":
	case "redis":
		s.Store.RedisURL = redisURL
	default:
		errs = append(errs, fmt.Errorf("-store: %q is not badger or redis", s.Store.Kind))
	}
	if cgLimit != "" {
		n, err := parseBytes(cgLimit)
		if err != nil || n < 16<<20 {
			errs = append(errs, fmt.Errorf("-cgroup-limit: %q is not a size of at least 16MiB (e.g. 256MiB)", cgLimit))
		}
		s.CgroupLimit = n
		if s.Cgroup != "" {
			errs = append(errs, errors.New("-cgroup and -cgroup-limit: give one"))
		}
	}
	if s.Pprof != "" && (s.Out == "" || !slices.Contains([]string{"profile", "trace", "heap", "allocs", "block", "mutex"}, s.Pprof)) {
		errs = append(errs, fmt.Errorf("-pprof: %q wants profile, trace, heap, allocs, block or mutex, and -out", s.Pprof))
	}
	if s.Sustain < 0 || s.Sustain > time.Hour {
		errs = append(errs, fmt.Errorf("-sustain: %v is not in [0, 1h]", s.Sustain))
	}
	if s.SustainC < 1 || s.SustainC > 4096 {
		errs = append(errs, fmt.Errorf("-sustain-c: %d is not in [1, 4096]", s.SustainC))
	}
	if s.IdleAfter < 0 || s.IdleAfter > 10*time.Minute {
		errs = append(errs, fmt.Errorf("-idle-after: %v is not in [0, 10m]", s.IdleAfter))
	}
	for f := range strings.SplitSeq(conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 4096 {
			errs = append(errs, fmt.Errorf("-c: %q is not a concurrency in [1, 4096]", f))
			continue
		}
		s.Concurrency = append(s.Concurrency, n)
	}
	return errors.Join(append(errs, s.rangeErrors()...)...)
}

// parseAPIs fills in s.APIs from -apis.
func (s *settings) parseAPIs(apis string) error {
	var errs []error
	for f := range strings.SplitSeq(apis, ",") {
		f = strings.TrimSpace(f)
		switch {
		case f != apiChat && f != apiMessages:
			errs = append(errs, fmt.Errorf("-apis: %q is not chat or messages", f))
		case !slices.Contains(s.APIs, f):
			s.APIs = append(s.APIs, f)
		}
	}
	return errors.Join(errs...)
}

// rangeErrors checks the legs' durations, rates and sizes.
func (s *settings) rangeErrors() []error {
	var errs []error
	if s.Duration <= 0 || s.Duration > 10*time.Minute {
		errs = append(errs, fmt.Errorf("-duration: %v is not in (0, 10m]", s.Duration))
	}
	if s.Warmup < 0 || s.Warmup > time.Minute {
		errs = append(errs, fmt.Errorf("-warmup: %v is not in [0, 1m]", s.Warmup))
	}
	if s.Rate < 1 || s.Rate > 20000 {
		errs = append(errs, fmt.Errorf("-rate: %d is not in [1, 20000]", s.Rate))
	}
	if s.TargetRate < 0 || s.TargetRate > 20000 {
		errs = append(errs, fmt.Errorf("-target-rate: %d is not in [0, 20000]", s.TargetRate))
	}
	if s.OpenDuration <= 0 || s.OpenDuration > time.Minute {
		errs = append(errs, fmt.Errorf("-open-duration: %v is not in (0, 1m]", s.OpenDuration))
	}
	if s.Slow < 0 || s.Slow > time.Minute {
		errs = append(errs, fmt.Errorf("-slow: %v is not in [0, 1m]", s.Slow))
	}
	if s.ContentBytes < 0 || s.ContentBytes > 8<<20 {
		errs = append(errs, fmt.Errorf("-content-bytes: %d is not in [0, 8 MiB]", s.ContentBytes))
	}
	if s.BigBytes < 1 || s.BigBytes > 1<<30 {
		errs = append(errs, fmt.Errorf("-big-bytes: %d is not in [1, 1 GiB]", s.BigBytes))
	}
	if s.BigChunkBytes < 1 {
		errs = append(errs, fmt.Errorf("-big-chunk-bytes: %d is not positive", s.BigChunkBytes))
	}
	if s.Rounds < 1 || s.Rounds > 50 {
		errs = append(errs, fmt.Errorf("-rounds: %d is not in [1, 50]", s.Rounds))
	}
	if s.Settle < 0 || s.Settle > time.Minute {
		errs = append(errs, fmt.Errorf("-settle: %v is not in [0, 1m]", s.Settle))
	}
	return errs
}

// raiseFileLimit lifts the soft RLIMIT_NOFILE to the hard limit. Calling
// Setrlimit explicitly (rather than relying on the Go runtime's own raise)
// also makes children inherit the raised limit: the runtime restores the
// original soft limit in children only when the program never set it.
func raiseFileLimit() {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
}

// parseBytes reads a size: a number of bytes, or with a KiB, MiB or GiB
// suffix.
func parseBytes(v string) (int64, error) {
	mult := int64(1)
	for suffix, m := range map[string]int64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if n, ok := strings.CutSuffix(v, suffix); ok {
			v, mult = n, m
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("bad size %q", v)
	}
	return n * mult, nil
}
