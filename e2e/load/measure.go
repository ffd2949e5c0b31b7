package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/llmgate/llmgate/e2e/load/cgroup"
)

// Dist summarises a latency distribution, in milliseconds.
type Dist struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	P999 float64 `json:"p999_ms"`
	Max  float64 `json:"max_ms"`
	Mean float64 `json:"mean_ms"`
}

func dist(ds []time.Duration) *Dist {
	if len(ds) == 0 {
		return nil
	}
	slices.Sort(ds)
	// Nearest rank: the smallest value with at least q of the samples at
	// or below it.
	q := func(p float64) float64 {
		i := int(p*float64(len(ds))+0.999999) - 1
		return ms(ds[min(max(i, 0), len(ds)-1)])
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return &Dist{
		N: len(ds), P50: q(0.50), P90: q(0.90), P99: q(0.99), P999: q(0.999),
		Max: ms(ds[len(ds)-1]), Mean: ms(sum / time.Duration(len(ds))),
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Leg is one measured leg.
type Leg struct {
	Name string  `json:"name"`
	Path string  `json:"path"` // direct, floor or llmgate
	Kind string  `json:"kind"` // json, stream or big
	API  string  `json:"api"`  // chat or messages (only closed-loop legs call messages)
	Keys keyMode `json:"keys"`
	// Budgeted: the requests are the budgeted client's (gatewayConfig).
	Budgeted    bool   `json:"budgeted,omitempty"`
	Mode        string `json:"mode"` // closed or open
	Concurrency int    `json:"concurrency,omitempty"`
	// Round is the round (-rounds) this leg ran in, from 1;
	// Rounds, on a leg pooled over rounds, how many it pools. Zero for a
	// run of one round.
	Round       int        `json:"round,omitempty"`
	Rounds      int        `json:"rounds,omitempty"`
	Rate        int        `json:"rate,omitempty"`
	UpstreamMs  float64    `json:"upstream_latency_ms,omitempty"`
	Requests    int        `json:"requests"`
	Errors      int        `json:"errors"`
	FirstErrors []string   `json:"first_errors,omitempty"`
	SuccessPct  float64    `json:"success_pct"`
	ElapsedS    float64    `json:"elapsed_s"`
	RPS         float64    `json:"rps"` // successes per second
	Latency     *Dist      `json:"latency"`
	TTFB        *Dist      `json:"ttfb,omitempty"`
	BodyBytes   int64      `json:"body_bytes"` // received, over successful requests
	MaxInFlight int64      `json:"max_in_flight"`
	MaxLagMs    float64    `json:"max_send_lag_ms,omitempty"`
	Proxy       *ProcUsage `json:"proxy,omitempty"`
	// ForeignCPUSeconds is the CPU time processes other than this tool
	// and its children used during the leg (machine user+system time from
	// /proc/stat minus ours); -1 if unknown. Anything well above zero means
	// the leg competed with other work for the CPUs.
	ForeignCPUSeconds float64 `json:"foreign_cpu_seconds"`
}

// legSamples is what a leg's figures are computed from: the latencies of
// its successes, its failures and its totals. Rounds of one leg (-rounds)
// add up into one.
type legSamples struct {
	lat, ttfb   []time.Duration
	errors      int
	firstErrors []string
	bodyBytes   int64
	issued      int
	elapsed     time.Duration
	maxInFlight int64
	maxLag      time.Duration
}

// samplesOf keeps of o what the leg's figures need.
func samplesOf(o outcome) legSamples {
	ls := legSamples{issued: o.issued, elapsed: o.elapsed, maxInFlight: o.maxInFlight, maxLag: o.maxLag}
	for _, s := range o.samples {
		if s.err != nil {
			ls.errors++
			ls.noteError(s.err.Error())
			continue
		}
		ls.lat = append(ls.lat, s.lat)
		ls.bodyBytes += s.n
		ls.ttfb = append(ls.ttfb, s.ttfb)
	}
	return ls
}

// noteError keeps e among the first distinct errors (up to five).
func (ls *legSamples) noteError(e string) {
	if len(ls.firstErrors) < 5 && !slices.Contains(ls.firstErrors, e) {
		ls.firstErrors = append(ls.firstErrors, e)
	}
}

// add pools b into ls: the samples of both, their totals summed, their
// worsts the worse.
func (ls *legSamples) add(b legSamples) {
	ls.lat = append(ls.lat, b.lat...)
	ls.ttfb = append(ls.ttfb, b.ttfb...)
	ls.errors += b.errors
	for _, e := range b.firstErrors {
		ls.noteError(e)
	}
	ls.bodyBytes += b.bodyBytes
	ls.issued += b.issued
	ls.elapsed += b.elapsed
	ls.maxInFlight = max(ls.maxInFlight, b.maxInFlight)
	ls.maxLag = max(ls.maxLag, b.maxLag)
}

// fillFrom sets l's figures from ls (whose latencies it sorts).
func (l *Leg) fillFrom(ls legSamples) {
	l.Errors, l.FirstErrors, l.BodyBytes = ls.errors, ls.firstErrors, ls.bodyBytes
	l.Requests = ls.issued
	if ls.issued > 0 {
		l.SuccessPct = 100 * float64(ls.issued-ls.errors) / float64(ls.issued)
	}
	l.ElapsedS = ls.elapsed.Seconds()
	if ls.elapsed > 0 {
		l.RPS = float64(ls.issued-ls.errors) / ls.elapsed.Seconds()
	}
	l.Latency = dist(ls.lat)
	if l.Kind != "json" {
		l.TTFB = dist(ls.ttfb)
	}
	l.MaxInFlight = ls.maxInFlight
	l.MaxLagMs = ms(ls.maxLag)
}

// GatewayInfo is the gateway's startup and idle footprint.
type GatewayInfo struct {
	Binary          string  `json:"binary"`
	StartupMs       float64 `json:"startup_to_ready_ms"` // exec to the first /readyz 200
	ListeningMs     float64 `json:"startup_to_listening_ms"`
	RSSAtReadyMiB   float64 `json:"rss_at_ready_mib"`
	IdleRSSMiB      float64 `json:"idle_rss_mib"` // after -settle
	IdleThreads     int     `json:"idle_threads"`
	IdleAnonMiB     float64 `json:"idle_anon_mib"`
	IdleFileMiB     float64 `json:"idle_file_mib"`
	RSSAtEndMiB     float64 `json:"rss_at_end_mib"`
	AnonAtEndMiB    float64 `json:"anon_at_end_mib"`
	FileAtEndMiB    float64 `json:"file_at_end_mib"`
	ThreadsAtEnd    int     `json:"threads_at_end"`
	CPUTotalSeconds float64 `json:"cpu_total_seconds"`
	// After the last leg and -idle-after with no requests.
	AfterIdleRSSMiB  float64  `json:"after_idle_rss_mib"`
	AfterIdleAnonMiB float64  `json:"after_idle_anon_mib"`
	AfterIdleFileMiB float64  `json:"after_idle_file_mib"`
	DataDir          *DirSize `json:"data_dir,omitempty"` // at the end (Badger)
}

// paths are the three ways to the fake: directly, through the floor, and
// through the gateway (whose models route to the fakes).
type paths struct {
	fake, slow, big          *child
	floor, floorSlow, floorB *child
	gw                       *child
}

func (p *paths) all() []*child {
	var out []*child
	for _, c := range []*child{p.gw, p.floor, p.floorSlow, p.floorB, p.fake, p.slow, p.big} {
		if c != nil {
			out = append(out, c)
		}
	}
	return out
}

// pids are this process's and every child's.
func (p *paths) pids() []int {
	pids := []int{os.Getpid()}
	for _, c := range p.all() {
		pids = append(pids, c.pid())
	}
	return pids
}

// base returns the URL of model's endpoint (/v1/messages for
// modelMessages, /v1/chat/completions for the others) on path for model's
// fake, and the proxy process on that path (nil for direct).
func (p *paths) base(path, model string) (string, *child) {
	fake, floor := p.fake, p.floor
	endpoint := "/v1/chat/completions"
	switch model {
	case modelSlow:
		fake, floor = p.slow, p.floorSlow
	case modelBig:
		fake, floor = p.big, p.floorB
	case modelMessages:
		endpoint = "/v1/messages"
	}
	switch path {
	case "floor":
		return floor.URL + endpoint, floor
	case "llmgate":
		return p.gw.URL + endpoint, p.gw
	}
	return fake.URL + endpoint, nil
}

// measurement is one run of the tool: what the steps of measure share.
type measurement struct {
	ctx   context.Context
	s     settings
	rep   *report
	logf  func(format string, a ...any)
	p     *paths
	runID string
	self  string        // this executable, which is its own fakes and floors
	env   []string      // the children's environment
	cg    *cgroup.Group // the gateway's cgroup, or nil
	// round is the round under way (from 1; 0 outside the rounds); pool
	// gathers each leg's rounds when there are several.
	round int
	pool  roundPool
	// cleanups run last in, first out when measure returns, as defers in
	// measure itself would.
	cleanups []func()
}

// onEnd arranges for f to run when measure returns.
func (m *measurement) onEnd(f func()) { m.cleanups = append(m.cleanups, f) }

func (m *measurement) cleanup() {
	for i := len(m.cleanups) - 1; i >= 0; i-- {
		m.cleanups[i]()
	}
}

// measure starts the processes and runs every leg into rep.
func measure(ctx context.Context, s settings, rep *report, logw io.Writer) error {
	tmp, err := os.MkdirTemp("", "llmgate-load-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	self, err := os.Executable()
	if err != nil {
		return err
	}
	m := &measurement{ctx: ctx, s: s, rep: rep, p: &paths{}, self: self, env: childEnv(),
		runID: strconv.FormatInt(time.Now().UnixNano(), 36),
		logf:  func(format string, a ...any) { fmt.Fprintf(logw, "load: "+format+"\n", a...) }}
	defer m.cleanup()
	m.onEnd(func() {
		for _, c := range m.p.all() {
			c.stop()
		}
	})
	if err := m.startFakes(); err != nil {
		return err
	}
	dataDir := filepath.Join(tmp, "data")
	cpu0, err := m.launchGateway(tmp, dataDir)
	if err != nil {
		return err
	}

	rep.LoadAvgStart = loadAvg()
	m.onEnd(func() { rep.LoadAvgEnd = loadAvg() })
	if err := m.inRounds(m.closedLegs); err != nil {
		return err
	}
	var tl *timeline
	if s.Sustain > 0 {
		if tl, err = m.sustainLegs(); err != nil {
			tl.stop()
			return err
		}
	}
	if err := m.inRounds(m.openLegs); err != nil {
		return err
	}
	if err := m.bigLegs(); err != nil {
		return err
	}
	m.logFailures()
	if end, err := readProc(m.p.gw.pid()); err == nil {
		rep.Gateway.RSSAtEndMiB = mib(end.RSSKiB)
		rep.Gateway.AnonAtEndMiB, rep.Gateway.FileAtEndMiB = mib(end.AnonKiB), mib(end.FileKiB)
		rep.Gateway.ThreadsAtEnd = end.Threads
		rep.Gateway.CPUTotalSeconds = (end.CPU - cpu0.CPU).Seconds()
	}
	return m.settleEnd(dataDir, tl)
}

// startFakes starts the fakes (the ordinary one, the slow one and, with
// -big, the big one) and a floor in front of each.
func (m *measurement) startFakes() error {
	s, p := m.s, m.p
	fake := func(name string, args ...string) (*child, error) {
		args = append([]string{"-serve-fake", "127.0.0.1:0"}, args...)
		return startChild(m.ctx, childSpec{name: name, bin: m.self, args: args, env: m.env, ready: childLine})
	}
	floor := func(name string, target *child) (*child, error) {
		return startChild(m.ctx, childSpec{name: name, bin: m.self,
			args: []string{"-serve-floor", "127.0.0.1:0", "-target", target.URL}, env: m.env, ready: childLine})
	}
	var err error
	cb := strconv.Itoa(s.ContentBytes)
	if p.fake, err = fake("fake", "-content-bytes", cb); err != nil {
		return err
	}
	if p.slow, err = fake("fake-slow", "-content-bytes", cb, "-latency", s.Slow.String()); err != nil {
		return err
	}
	if p.floor, err = floor("floor", p.fake); err != nil {
		return err
	}
	if p.floorSlow, err = floor("floor-slow", p.slow); err != nil {
		return err
	}
	if s.Big {
		chunks := strconv.Itoa(max(1, s.BigBytes/s.BigChunkBytes))
		if p.big, err = fake("fake-big", "-content-bytes", strconv.Itoa(s.BigBytes), "-chunks", chunks); err != nil {
			return err
		}
		if p.floorB, err = floor("floor-big", p.big); err != nil {
			return err
		}
	}
	return nil
}

// launchGateway builds the gateway (unless -gateway names one), writes its
// config, starts it (in its cgroup, if any) and waits for it to be ready.
// It returns the gateway's process figures at ready.
func (m *measurement) launchGateway(tmp, dataDir string) (procStatus, error) {
	bin := m.s.Gateway
	if bin == "" {
		m.logf("building ./cmd/gateway")
		var err error
		if bin, err = buildGateway(m.ctx, tmp); err != nil {
			return procStatus{}, err
		}
	}
	cfgPath := filepath.Join(tmp, "gateway.yaml")
	token, err := m.writeConfig(cfgPath, dataDir)
	if err != nil {
		return procStatus{}, err
	}
	if err := m.setupCgroup(); err != nil {
		return procStatus{}, err
	}
	launch := []string{bin, "-config", cfgPath}
	if m.cg != nil {
		launch = append([]string{m.self, inCgroup, m.cg.Dir}, launch...)
	}
	gi, err := startGateway(m.ctx, m.p, launch, m.env, m.s.Settle)
	if err != nil {
		return procStatus{}, err
	}
	m.p.gw.metricsURL, m.p.gw.adminToken = m.p.gw.URL+"/metrics", token
	m.rep.Gateway = gi
	m.logf("gateway ready in %.0f ms, idle RSS %.1f MiB", gi.StartupMs, gi.IdleRSSMiB)
	cpu0, _ := readProc(m.p.gw.pid())
	if m.cg != nil {
		m.rep.Cgroup.Start, _ = m.cg.Stats()
	}
	return cpu0, nil
}

// writeConfig writes the gateway's config to path, with a fresh admin
// token, which it returns. On Redis the run gets a key prefix of its own,
// whose keys are deleted when measure returns.
func (m *measurement) writeConfig(path, dataDir string) (string, error) {
	store, token := m.s.Store, randomToken()
	if store.Kind == "redis" {
		store.RedisPrefix = "llmgate-load-" + m.runID + ":"
	}
	m.rep.Store = store
	if store.Kind == "redis" {
		m.onEnd(func() {
			n, err := dropRedisPrefix(context.WithoutCancel(m.ctx), store.RedisURL, store.RedisPrefix)
			m.logf("deleted %d Redis keys under %s (err: %v)", n, store.RedisPrefix, err)
		})
	}
	gs := gatewaySetup{dataDir: dataDir, adminToken: token, store: store, fake: m.p.fake.URL, slow: m.p.slow.URL}
	if m.p.big != nil {
		gs.big = m.p.big.URL
	}
	if err := os.WriteFile(path, []byte(gatewayConfig(gs)+m.s.ConfigExtra+"\n"), 0o600); err != nil {
		return "", err
	}
	return token, nil
}

// setupCgroup opens or makes the gateway's cgroup (see gatewayCgroup), if
// one is asked for, and records it in the report.
func (m *measurement) setupCgroup() error {
	cg, made, err := gatewayCgroup(m.s, m.runID)
	if err != nil {
		return err
	}
	m.cg = cg
	if made {
		// Runs before the stop of every child (last in, first out), so it
		// stops the gateway itself: a group with a process in it cannot be
		// removed.
		m.onEnd(func() {
			if m.p.gw != nil {
				m.p.gw.stop()
			}
			if err := cg.Remove(); err != nil {
				m.logf("removing cgroup %s: %v", cg.Dir, err)
			}
		})
	}
	if cg != nil {
		// However the run ends (a killed gateway ends it early), say what
		// the kernel counted.
		m.onEnd(func() {
			if st, err := cg.Stats(); err == nil && st.OOMKills > 0 {
				m.logf("the gateway's cgroup counted %d OOM kills", st.OOMKills)
			}
		})
		m.rep.Cgroup = &CgroupInfo{Dir: cg.Dir, V2: cg.V2, Made: made}
	}
	return nil
}

// add records a finished leg, and reports an error if a process has
// exited or the run is cancelled.
func (m *measurement) add(l Leg) error {
	m.rep.Legs = append(m.rep.Legs, l)
	m.logf("%-34s n=%-7d err=%-4d p50=%.3fms", l.Name, l.Requests, l.Errors, latP50(l))
	for _, c := range m.p.all() {
		if err := c.alive(); err != nil {
			return err
		}
	}
	return m.ctx.Err()
}

// closedLegs runs the closed-loop legs: at each concurrency, JSON then
// streams, for each API of -apis (chat, then /v1/messages, next to each
// other so that both meet the machine in the same state), direct, through
// the floor and through the gateway (unkeyed, fresh keys, replays of one
// key).
func (m *measurement) closedLegs() error {
	for _, conc := range m.s.Concurrency {
		for _, kind := range []string{"json", "stream"} {
			for _, api := range m.s.APIs {
				if err := m.closedLegsOf(api, kind, conc); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// inRounds runs legs (the closed-loop or the open-loop ones) -rounds
// times over, one round after the other, so that the floor's and the
// gateway's legs take turns with whatever else the machine does; with
// more than one round it pools each leg's rounds (rounds.go): rep.Legs
// gets the pooled legs, rep.RoundLegs each round's.
func (m *measurement) inRounds(legs func() error) error {
	first := len(m.rep.Legs)
	m.pool = roundPool{}
	for m.round = 1; m.round <= m.s.rounds(); m.round++ {
		if err := legs(); err != nil {
			return err
		}
	}
	m.round = 0 // legs outside the rounds (sustained, big) are not pooled
	if m.s.rounds() > 1 {
		m.rep.RoundLegs = append(m.rep.RoundLegs, m.rep.Legs[first:]...)
		m.rep.Legs = append(m.rep.Legs[:first], m.pool.legs()...)
	}
	return nil
}

// closedLegsOf runs the closed-loop legs of one API, kind and concurrency.
func (m *measurement) closedLegsOf(api, kind string, conc int) error {
	for _, leg := range []struct {
		path     string
		keys     keyMode
		budgeted bool
	}{{"direct", noKey, false}, {"floor", noKey, false}, {"llmgate", noKey, false}, {"llmgate", freshKey, false}, {"llmgate", replay, false},
		{"llmgate", noKey, true}, {"llmgate", freshKey, true}} {
		if kind == "stream" && leg.keys == replay {
			continue // a replayed stream is the replayed JSON's cousin; not asked for
		}
		if leg.budgeted && api != apiChat {
			continue // what a budget costs does not depend on the API
		}
		l := Leg{Path: leg.path, Kind: kind, API: api, Keys: leg.keys, Budgeted: leg.budgeted, Mode: "closed", Concurrency: conc}
		l.Name = legName(l)
		if !m.s.runs(l.Name) {
			continue
		}
		if err := m.closedLeg(l); err != nil {
			return err
		}
	}
	return nil
}

// closedLeg runs one closed-loop leg: -warmup discarded, then -duration
// measured.
func (m *measurement) closedLeg(l Leg) error {
	ctx, s, p := m.ctx, m.s, m.p
	conc, kind := l.Concurrency, l.Kind
	model, body, end := modelFast, chatBody(modelFast, kind == "stream"), chatStreamEnd
	if l.API == apiMessages {
		model, body, end = modelMessages, messagesBody(kind == "stream"), messagesStreamEnd
	}
	url, proxy := p.base(l.Path, model)
	sh := &shot{url: url, body: body, stream: kind == "stream", streamEnd: end, keys: l.Keys,
		key: fmt.Sprintf("load-%s-r%d-c%d-%s-%s-%v-", m.runID, m.round, conc, l.API, kind, l.Budgeted)}
	if l.Budgeted {
		sh.auth = budgetedClientKey
	}
	c := newClient(conc)
	if l.Keys == replay {
		sh.key = fmt.Sprintf("load-%s-r%d-c%d-%s-%s-replayed", m.runID, m.round, conc, l.API, kind)
		first := *sh
		first.keys = freshKey
		first.key = sh.key
		if smp := first.do(ctx, c, "", make([]byte, 32<<10)); smp.err != nil {
			return fmt.Errorf("%s: committing the key to replay: %w", l.Name, smp.err)
		}
	}
	var lw legWatch
	var pf *profile
	o := closedLoop(ctx, c, sh, closedPlan{conc: conc, warm: s.Warmup, dur: s.Duration, measuring: func() {
		lw = watchLeg(p.pids(), proxy)
		pf = startProfile(s, proxy, m.profileName(l.Name), s.Duration)
	}})
	pf.wait()
	return m.endLeg(l, lw, c, o)
}

// legWatch is what a leg measures beside its requests: the CPU other
// processes take, and the proxy's own figures (w nil going direct).
type legWatch struct {
	fg *foreign
	w  *watch
}

// watchLeg starts a leg's legWatch.
func watchLeg(pids []int, proxy *child) legWatch {
	lw := legWatch{fg: startForeign(pids)}
	if proxy != nil {
		lw.w = startWatch(proxy)
	}
	return lw
}

// endLeg stops lw, closes the leg's client's connections, and adds the leg
// with its outcome o.
func (m *measurement) endLeg(l Leg, lw legWatch, c *http.Client, o outcome) error {
	l.ForeignCPUSeconds = lw.fg.stop()
	if lw.w != nil {
		l.Proxy = lw.w.stop()
	}
	c.CloseIdleConnections()
	ls := samplesOf(o)
	if m.s.rounds() > 1 && m.round > 0 {
		l.Round = m.round
		m.pool.add(l, ls)
	}
	l.fillFrom(ls)
	return m.add(l)
}

// openLegs runs the open-loop legs against the slow fake: rate × slow
// calls in flight.
func (m *measurement) openLegs() error {
	for _, l := range m.s.openLegs() {
		if err := m.openLeg(l); err != nil {
			return err
		}
	}
	return nil
}

// openLegs are the open-loop legs -only selects: direct, floor and
// llmgate at -rate, then the comparison at -target-rate: floor,
// llmgate and llmgate with a fresh key per request. A leg both would
// run (-target-rate equal to -rate) runs once.
func (s settings) openLegs() []Leg {
	var out []Leg
	add := func(rate int, path string, keys keyMode) {
		l := Leg{Path: path, Kind: "json", API: apiChat, Keys: keys, Mode: "open", Rate: rate, UpstreamMs: ms(s.Slow)}
		l.Name = legName(l)
		if s.runs(l.Name) && !slices.ContainsFunc(out, func(o Leg) bool { return o.Name == l.Name }) {
			out = append(out, l)
		}
	}
	for _, path := range []string{"direct", "floor", "llmgate"} {
		add(s.Rate, path, noKey)
	}
	if s.TargetRate > 0 {
		add(s.TargetRate, "floor", noKey)
		add(s.TargetRate, "llmgate", noKey)
		add(s.TargetRate, "llmgate", freshKey)
	}
	return out
}

// openLeg runs one open-loop leg: l.Rate requests a second for
// -open-duration, then until the last one has finished.
func (m *measurement) openLeg(l Leg) error {
	s, p := m.s, m.p
	url, proxy := p.base(l.Path, modelSlow)
	sh := &shot{url: url, body: chatBody(modelSlow, false), keys: l.Keys, key: fmt.Sprintf("load-%s-r%d-open%d-", m.runID, m.round, l.Rate)}
	c := newClient(4 * l.Rate)
	lw := watchLeg(p.pids(), proxy)
	o := openLoop(m.ctx, c, sh, openPlan{rate: l.Rate, dur: s.OpenDuration, timeout: s.Slow + 30*time.Second})
	return m.endLeg(l, lw, c, o)
}

// bigLegs runs, with -big, one big stream per path, for memory.
func (m *measurement) bigLegs() error {
	if !m.s.Big {
		return nil
	}
	for _, path := range []string{"direct", "floor", "llmgate"} {
		l := Leg{Path: path, Kind: "big", API: apiChat, Keys: noKey, Mode: "closed", Concurrency: 1}
		l.Name = legName(l)
		if !m.s.runs(l.Name) {
			continue
		}
		url, proxy := m.p.base(path, modelBig)
		sh := &shot{url: url, body: chatBody(modelBig, true), stream: true, keys: noKey}
		c := newClient(1)
		lw := watchLeg(m.p.pids(), proxy)
		start := time.Now()
		rctx, cancel := context.WithTimeout(m.ctx, 5*time.Minute)
		smp := sh.do(rctx, c, "", make([]byte, 64<<10))
		cancel()
		o := outcome{samples: []sample{smp}, elapsed: time.Since(start), issued: 1, maxInFlight: 1}
		if err := m.endLeg(l, lw, c, o); err != nil {
			return err
		}
	}
	return nil
}

// logFailures logs the tail of every process's stderr when a leg had
// errors: what the processes said is the first clue.
func (m *measurement) logFailures() {
	failed := false
	for _, l := range m.rep.Legs {
		failed = failed || l.Errors > 0
	}
	if !failed {
		return
	}
	for _, c := range m.p.all() {
		if t := c.stderr.String(); t != "" {
			m.logf("%s stderr (tail):\n%s", c.name, t[max(0, len(t)-4096):])
		}
	}
}

// settleEnd waits -idle-after with the gateway idle, then reads its RSS,
// its data dir's size, its cgroup's figures, and stops the timeline.
func (m *measurement) settleEnd(dataDir string, tl *timeline) error {
	rep, cg := m.rep, m.cg
	select {
	case <-time.After(m.s.IdleAfter):
	case <-m.ctx.Done():
	}
	if tl != nil {
		rep.Timeline = tl.stop()
	}
	if st, err := readProc(m.p.gw.pid()); err == nil {
		rep.Gateway.AfterIdleRSSMiB = mib(st.RSSKiB)
		rep.Gateway.AfterIdleAnonMiB, rep.Gateway.AfterIdleFileMiB = mib(st.AnonKiB), mib(st.FileKiB)
	}
	if rep.Store.Kind == "badger" {
		d := dirSize(dataDir)
		rep.Gateway.DataDir = &d
	}
	if cg != nil {
		rep.Cgroup.End, _ = cg.Stats()
		for _, tp := range rep.Timeline {
			rep.Cgroup.PeakSampledMiB = max(rep.Cgroup.PeakSampledMiB, tp.CgroupMiB)
		}
	}
	if err := m.p.gw.alive(); err != nil {
		return err
	}
	return m.ctx.Err()
}

// runs reports whether -only selects the leg.
func (s settings) runs(name string) bool { return s.only == nil || s.only.MatchString(name) }

func latP50(l Leg) float64 {
	if l.Latency == nil {
		return 0
	}
	return l.Latency.P50
}

func legName(l Leg) string {
	var name string
	switch l.Mode {
	case "open":
		name = fmt.Sprintf("open %d/s", l.Rate)
	case "sustained":
		name = fmt.Sprintf("sustained c=%d", l.Concurrency)
	default:
		name = fmt.Sprintf("c=%d", l.Concurrency)
	}
	if l.API == apiMessages {
		name += " messages"
	}
	switch l.Kind {
	case "stream":
		name += " stream"
	case "big":
		name = "big stream"
	}
	name += " " + l.Path
	switch l.Keys {
	case freshKey:
		name += " keyed"
	case replay:
		name += " replay"
	}
	if l.Budgeted {
		name += " budgeted"
	}
	return name
}

// startGateway starts the gateway and measures exec → listening → /readyz
// 200, then its RSS at ready and after settle.
// launch is the command line: the gateway binary and its flags, perhaps
// behind the tool's own -in-cgroup.
func startGateway(ctx context.Context, p *paths, launch []string, env []string, settle time.Duration) (GatewayInfo, error) {
	gi := GatewayInfo{Binary: launch[0]}
	gw, err := startChild(ctx, childSpec{name: "llmgate", bin: launch[0], args: launch[1:], env: env, ready: "llmgate listening on "})
	if err != nil {
		return gi, err
	}
	p.gw = gw
	gi.ListeningMs = ms(time.Since(gw.started))
	c := &http.Client{Transport: &http.Transport{}, Timeout: time.Second}
	defer c.CloseIdleConnections()
	ready := false
	// Poll every millisecond for at most ~10s.
	for range 10000 {
		res, err := c.Get(gw.URL + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				ready = true
				break
			}
		}
		if err := gw.alive(); err != nil {
			return gi, err
		}
		time.Sleep(time.Millisecond)
	}
	if !ready {
		return gi, fmt.Errorf("gateway not ready within 10s\n%s", gw.stderr)
	}
	gi.StartupMs = ms(time.Since(gw.started))
	st, err := readProc(gw.pid())
	if err != nil {
		return gi, err
	}
	gi.RSSAtReadyMiB = mib(st.RSSKiB)
	select {
	case <-time.After(settle):
	case <-ctx.Done():
		return gi, ctx.Err()
	}
	if st, err = readProc(gw.pid()); err != nil {
		return gi, err
	}
	gi.IdleRSSMiB, gi.IdleThreads = mib(st.RSSKiB), st.Threads
	gi.IdleAnonMiB, gi.IdleFileMiB = mib(st.AnonKiB), mib(st.FileKiB)
	return gi, nil
}
