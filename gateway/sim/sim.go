// Package sim is a seeded, randomized fault simulation of llmgate's keyed
// path, checked against its history. Many clients send keyed JSON and
// stream requests — repeated keys, other bodies under a key, concurrent
// duplicates, clients that hang up or set a short X-Llmgate-Deadline — to
// the real gateway handler (gateway.New) on a real store behind
// FaultyStore, which fails calls before they apply, applies them and loses
// the reply, answers after the caller's deadline, or stalls; the provider
// answers, fails transiently, cuts its answer, hangs, or refuses the
// connection; and the stores' clock jumps past the lease so that claims
// run out and are taken over. Everything is recorded (History), and Check
// holds the history to the guarantee's properties (see check.go).
//
// The seed reproduces the workload and the fault plan — the same fault for
// the same call of the same key — but not the goroutines' interleaving,
// which real stores, sockets and the scheduler do not allow.
package sim

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway"
)

// Options configure a run. OpenStore and Dir are required.
type Options struct {
	Seed int64
	// Ops is the number of client requests. If <= 0, 2000.
	Ops int
	// Workers is the number of clients sending at once. If <= 0, 64.
	Workers int
	// OpenStore opens the store under test on the simulation's clock (its
	// leases and Wait timers).
	OpenStore func(clk *Clock) (gateway.Store, error)
	// Dir is the gateway's data_dir (spooled bodies).
	Dir string
	// Store and Provider are the fault rates. If zero, DefaultStoreRates
	// and DefaultProviderRates.
	Store    StoreRates
	Provider ProviderRates
	// Logger receives the gateway's logs. If nil, they are discarded.
	Logger *slog.Logger
	// Disrupt, if set, runs once when half the requests have been handed
	// out, and no further request is handed out until it returns (those
	// in flight go on): a test's disruption of the store, such as a Redis
	// failover.
	Disrupt func()
}

// Default fault rates: each kind is common enough to meet every other
// kind and every client mode within a few thousand requests.
var (
	DefaultStoreRates    = StoreRates{FailBefore: 0.02, ReplyLost: 0.02, Late: 0.01, Stall: 0.015}
	DefaultProviderRates = ProviderRates{Transient: 0.06, Cut: 0.05, Hang: 0.01, Refuse: 0.02}
)

// The simulated deployment's timing: short, so faults resolve quickly.
const (
	lease       = time.Second
	opTimeout   = 150 * time.Millisecond
	attemptTime = 2 * time.Second
	bigChunks   = 48 // over maxEvents
	maxEvents   = 40
)

// Result is what a run found.
type Result struct {
	Seed       int64
	Ops        int
	Elapsed    time.Duration // the workload's, without the final checks
	Violations []Violation
	// Faults counts what was injected, by kind: store/<method>/<fault>,
	// provider/<behaviour>, client/<mode>, clock/advance.
	Faults map[string]int
	// Takeovers counts claims taken from another owner, by cause.
	Takeovers map[string]int
	// Runs counts the provider's attempts: completed answers, answers the
	// gateway kept, and the extra completed answers with their cause; and
	// partial streams that ended in a broken connection, by client mode.
	Runs    map[string]int
	History *History
}

// Summary is the one line a run logs.
func (r *Result) Summary() string {
	return fmt.Sprintf("simulation: %d ops, %d violations, faults: %s; takeovers: %s; runs: %s; %.0f ops/s (seed %d)",
		r.Ops, len(r.Violations), counts(r.Faults), counts(r.Takeovers), counts(r.Runs),
		float64(r.Ops)/r.Elapsed.Seconds(), r.Seed)
}

func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s=%d", k, m[k])
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}

// Report is the failure report: the seed, each violation, and the
// histories of the keys involved.
func (r *Result) Report() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d (LLMGATE_SIM_SEED=%d reproduces the workload and fault plan): %d violations\n", r.Seed, r.Seed, len(r.Violations))
	seen := map[string]bool{}
	var keys []string
	for i, v := range r.Violations {
		if i < 20 {
			fmt.Fprintf(&b, "  %s key %s: %s\n", v.Property, v.Key, v.Detail)
		}
		if !seen[v.Key] && len(keys) < 5 {
			seen[v.Key] = true
			keys = append(keys, v.Key)
		}
	}
	b.WriteString(r.History.Describe(keys))
	return b.String()
}

// simConfig is the simulated deployment: one upstream, fast retries, a
// breaker and retry budget that never stop a request (the simulation is
// about the keyed path, not the breaker), short store timings.
func simConfig(upstream, dir string) (config.Config, error) {
	c := config.Default()
	c.DataDir = dir
	c.Upstreams = []config.Upstream{{Name: "sim", BaseURL: upstream + "/v1", APIKey: "sk-sim-provider",
		Models: []string{"*"}, Timeout: config.Duration(attemptTime)}}
	c.Retry.BaseDelay = config.Duration(time.Millisecond)
	c.Retry.MaxDelay = config.Duration(5 * time.Millisecond)
	c.Retry.Deadline = config.Duration(10 * time.Second)
	c.Retry.BudgetMinPerSecond = 1e6
	c.Breaker.ConsecutiveFailures = 1 << 30
	c.Breaker.MinRequests = 1 << 30
	c.Idempotency.Lease = config.Duration(lease)
	c.Idempotency.WaitTimeout = config.Duration(3 * time.Second)
	c.Idempotency.MaxRecordEvents = maxEvents
	c.Idempotency.MaxDetached = 1 << 20
	c.Store.OpTimeout = config.Duration(opTimeout)
	// The provider never stalls mid-stream, so the idle timeout would
	// only fire when a loaded machine starves the relay: far off.
	c.Limits.StreamIdleTimeout = config.Duration(30 * time.Second)
	return c, c.Validate()
}

// Simulate runs the simulation and checks its history.
func Simulate(o Options) (*Result, error) {
	if o.Ops <= 0 {
		o.Ops = 2000
	}
	if o.Workers <= 0 {
		o.Workers = 64
	}
	if o.Store == (StoreRates{}) {
		o.Store = DefaultStoreRates
	}
	if o.Provider == (ProviderRates{}) {
		o.Provider = DefaultProviderRates
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	p, h, clk := plan{seed: o.Seed}, newHistory(), NewClock()
	inner, err := o.OpenStore(clk)
	if err != nil {
		return nil, fmt.Errorf("opening the store: %w", err)
	}
	fs := newFaultyStore(inner, p, o.Store, h, clk)
	prov := newProvider(p, o.Provider, h, bigChunks)
	up := httptest.NewServer(prov)
	defer up.Close()
	cfg, err := simConfig(up.URL, o.Dir)
	if err != nil {
		return nil, fmt.Errorf("simulation config: %w", err)
	}
	w := newWorkload(p, o.Ops)
	res := &Result{Seed: o.Seed, Ops: o.Ops, History: h, Faults: map[string]int{}}
	start := time.Now()
	if err := serveWorkload(gateway.Options{Config: cfg, Store: fs, Logger: o.Logger}, o, w, clk, h); err != nil {
		return nil, err
	}
	res.Elapsed = time.Since(start)
	fs.on.Store(false)
	clk.Advance(lease + time.Second) // every claim left behind runs out
	quiet := settle(fs, w, clk)
	if err := serveFinal(cfg, fs, o, w, h); err != nil {
		return nil, err
	}
	up.Close() // every provider handler has ended and recorded its run
	// A final retry's release can fail too (a real store timeout): its
	// claim is then free once its lease runs out.
	clk.Advance(lease + time.Second)
	final := finalState(fs, w, clk)
	h.mu.Lock()
	h.final = final
	h.mu.Unlock()
	res.Violations, res.Runs = Check(h, quiet)
	collectFaults(res, fs, prov, w, clk)
	return res, nil
}

// serveWorkload serves the workload through one gateway and waits until
// every keyed call it started has ended (Drain).
func serveWorkload(gopts gateway.Options, o Options, w *workload, clk *Clock, h *History) error {
	return through(gopts, o.Workers, func(jobs chan<- job) {
		for i := range w.steps {
			if i == len(w.steps)/2 && o.Disrupt != nil {
				o.Disrupt()
			}
			jobs <- func(hc *http.Client, url string) { w.do(i, hc, url, clk, h) }
		}
	})
}

// job is one request a worker sends to the gateway at url.
type job func(hc *http.Client, url string)

// through builds a gateway from gopts, has workers goroutines send the
// jobs feed gives them, then drains (every keyed call it started ends)
// and closes it.
func through(gopts gateway.Options, workers int, feed func(jobs chan<- job)) error {
	gw, err := gateway.New(gopts)
	if err != nil {
		return err
	}
	srv := httptest.NewServer(gw.Handler())
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers * 2}, Timeout: time.Minute}
	jobs := make(chan job)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				j(hc, srv.URL)
			}
		}()
	}
	feed(jobs)
	close(jobs)
	wg.Wait()
	srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gw.Drain(ctx)
	gw.Close()
	hc.CloseIdleConnections()
	return nil
}

func collectFaults(res *Result, fs *FaultyStore, prov *provider, w *workload, clk *Clock) {
	fs.mu.Lock()
	for k, n := range fs.faults {
		res.Faults["store/"+k] = n
	}
	res.Takeovers = map[string]int{}
	for k, n := range fs.takes {
		res.Takeovers[k] = n
	}
	fs.mu.Unlock()
	prov.mu.Lock()
	for k, n := range prov.counts {
		if k != BehaveAnswer {
			res.Faults["provider/"+k] = n
		}
	}
	prov.mu.Unlock()
	for k, n := range w.modes {
		if k != ModeNormal {
			res.Faults["client/"+k] = n
		}
	}
	res.Faults["clock/advance"] = clk.Advances() - 2 // not the two at quiescence
}

// CommitLatency is the median and 99th percentile of the commits that
// succeeded with no injected fault: what a commit costs (with
// wait_replicas, the replicas' acknowledgement too).
func (r *Result) CommitLatency() (p50, p99 time.Duration) {
	r.History.mu.Lock()
	var d []time.Duration
	for _, c := range r.History.calls {
		if c.Method == "Commit" && c.Fault == "" && c.Applied {
			d = append(d, c.Took)
		}
	}
	r.History.mu.Unlock()
	if len(d) == 0 {
		return 0, 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[len(d)/2], d[len(d)*99/100]
}
