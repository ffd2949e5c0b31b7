package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway/idempotency"
)

// The fairness run's sizes. The store's cap is small enough that mallory's
// dead letters would fill it within a second of the flood without their
// per-client bound (a letter keeps up to 256 KiB of its body, stored at
// about 4/3 of it; mallory's rate limit admits 20 a second).
const (
	fairStoreMax     = 4 << 20
	fairLetterBytes  = 1 << 20 // dead_letters.max_bytes_per_client
	fairMaxDetached  = 8       // mallory's share: 4
	fairMaxBody      = 20 << 20
	fairAliceRate    = 20 // alice's keyed requests a second
	fairAliceSlowMod = 20 // every 20th of alice's calls outlives her deadline
	fairAdmin        = "e2e-admin-token"
	// fairAliceDownBytes is the prompt of alice's calls to her failing
	// model: a long prompt, as a real client's often is.
	fairAliceDownBytes = 64 << 10
	fairSpaceBound     = time.Second // store.space_interval, the README's bound
)

// fairnessFlood is how long mallory floods: 8s, or LLMGATE_FAIRNESS (a
// duration) when run by hand.
func fairnessFlood(t *testing.T) (time.Duration, bool) {
	v := os.Getenv("LLMGATE_FAIRNESS")
	if v == "" {
		return 8 * time.Second, true
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("LLMGATE_FAIRNESS=%q: want a duration such as 20s", v)
	}
	return d, false
}

// TestFairness is the fairness run: tenant mallory floods the gateway —
// keyed requests on a failing model, each a dead letter; bodies over and
// near limits.max_body_bytes; keyed calls on a hanging model whose clients
// drop, each a detached call; all of it past her rate limit — while tenant
// alice sends keyed requests at a steady rate to a healthy model, a few of
// them outliving her own X-Llmgate-Deadline (detached calls of hers).
// Alice's keyed calls must all commit and replay: no idempotency_store_full
// (mallory's letters stay inside their per-client bound), no detached call
// of hers cancelled (mallory's hanging calls stay inside their share of
// idempotency.max_detached). Her latency, alone and during the flood, is
// reported, not asserted: two shared cores measure contention. Then
// mallory, whose stored-bytes quota equals the store's cap, fills the
// store with committed answers; the operator purges her data and the store
// must leave the full state within store.space_interval.
func TestFairness(t *testing.T) {
	if testing.Short() {
		t.Skip("the fairness run takes about 20 s")
	}
	flood, isDefault := fairnessFlood(t)
	bin := gatewayBin(t, "")
	began := time.Now()
	g := startFairGateway(t, bin)

	alone := g.runAlice(3 * time.Second)
	alone.check(t, "alone")

	w := g.watch()
	stopMallory := g.flood()
	during := g.runAlice(flood)
	mal := stopMallory()
	peaks := w.stop()
	during.check(t, "during the flood")
	g.checkAliceUntouched(append(alone.downKeys, during.downKeys...))

	t.Logf("alice alone: %s", alone.summary())
	t.Logf("alice during the flood: %s", during.summary())
	t.Logf("alice latency: p50 %v, p99 %v during the flood; p99 %v alone", during.pct(50), during.pct(99), alone.pct(99))
	t.Logf("mallory's answers: %s", mal)
	g.logLetters()
	t.Logf("peaks during the flood: llmgate_store_live_bytes %.0f (cap %d), llmgate_detached_calls %.0f (cap %d), llmgate_store_full=1 in %d of %d samples",
		peaks.live, fairStoreMax, peaks.detached, fairMaxDetached, peaks.fullSamples, peaks.samples)
	aliceRefused, malRefused, fulls := g.capEvents()
	t.Logf("gateway log: dead letters refused at store.max_bytes: mallory's %d, alice's %d; the store entered the full state %d times", malRefused, aliceRefused, fulls)
	aliceCut, malCut := g.capCancels()
	t.Logf("detached calls cancelled at the cap (gateway log): mallory %d, alice %d", malCut, aliceCut)

	g.fillAndPurge()
	if d := time.Since(began); isDefault && d > 40*time.Second {
		t.Errorf("the fairness run took %v, more than the 40 s CI allows it", d)
	}
}

// fairGateway is the gateway of the fairness run and its tenants' clients.
type fairGateway struct {
	t       *testing.T
	p       *proc
	url     string
	alice   *http.Client
	mallory *http.Client
	admin   *http.Client

	mu sync.Mutex
	// aliceKeys holds the hashes of alice's keys, as the gateway's log
	// names them.
	aliceKeys map[string]bool
}

// startFairGateway starts the fake upstreams and the gateway: alice's
// models on upstreams of their own (breakers are per upstream and shared
// by tenants: a failing model on alice's upstream would open her breaker
// too, a documented limit this run does not measure), mallory's failing,
// hanging and bulk models on theirs.
func startFairGateway(t *testing.T, bin string) *fairGateway {
	t.Helper()
	quiet := fakeprovider.Options{KeepRequests: -1}
	_, healthy := newFake(t, quiet)
	slowOpts := quiet
	slowOpts.Latency = 500 * time.Millisecond
	_, slow := newFake(t, slowOpts)
	down, downURL := newFake(t, quiet)
	down.SetDefault(fakeprovider.Step{Status: 503})
	failing, failingURL := newFake(t, quiet)
	failing.SetDefault(fakeprovider.Step{Status: 503})
	hanging, hangingURL := newFake(t, quiet)
	hanging.SetDefault(fakeprovider.Step{Hang: true})
	bulkOpts := quiet
	bulkOpts.ContentBytes = 256 << 10
	_, bulk := newFake(t, bulkOpts)

	dir := t.TempDir()
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
data_dir: %s
admin_token: %s
log: {format: json, level: info}
upstreams:
  - {name: healthy, base_url: %s/v1, api_key: sk-up, models: [gpt-4o-mini], timeout: 10s}
  - {name: slow, base_url: %s/v1, api_key: sk-up, models: [alice-slow], timeout: 10s}
  - {name: alice-down, base_url: %s/v1, api_key: sk-up, models: [alice-down], timeout: 10s}
  - {name: failing, base_url: %s/v1, api_key: sk-up, models: [mal-failing], timeout: 5s}
  - {name: hanging, base_url: %s/v1, api_key: sk-up, models: [mal-hang], timeout: 1s}
  - {name: bulk, base_url: %s/v1, api_key: sk-up, models: [mal-bulk], timeout: 10s}
clients:
  - {name: alice, key: key-alice}
  - name: mallory
    key: key-mallory
    limits: {requests_per_second: 20, burst: 20, max_stored_bytes: %d}
retry: {max_attempts: 3, base_delay: 5ms, max_delay: 20ms}
store: {max_bytes: %d}
dead_letters: {max_per_client: 100, max_bytes_per_client: %d}
idempotency: {max_detached: %d}
limits: {max_body_bytes: %d}
server: {shutdown_grace: 5s}
`, filepath.Join(dir, "data"), fairAdmin, healthy, slow, downURL, failingURL, hangingURL, bulk,
		fairStoreMax, fairStoreMax, fairLetterBytes, fairMaxDetached, fairMaxBody)
	path := filepath.Join(dir, "gateway.yaml")
	writeFile(t, path, cfg)
	p := start(t, bin, []string{"-config", path}, nil)
	client := func() *http.Client {
		return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	}
	return &fairGateway{t: t, p: p, url: p.URL, alice: client(), mallory: client(), admin: client(), aliceKeys: map[string]bool{}}
}

// answer is one HTTP answer as the run classifies it.
type answer struct {
	status   int
	code     string // error.code
	message  string // error.message
	replayed bool
	err      error
}

func (a answer) String() string {
	if a.err != nil {
		return a.err.Error()
	}
	return fmt.Sprintf("%d %s replayed=%v", a.status, a.code, a.replayed)
}

// send posts body to the chat endpoint as the client with key.
func send(ctx context.Context, c *http.Client, url, key, idemKey string, body io.Reader, hdr map[string]string) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", body)
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := c.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return answer{status: res.StatusCode, err: err}
	}
	var e struct {
		Error struct{ Code, Message string }
	}
	_ = json.Unmarshal(b, &e)
	return answer{status: res.StatusCode, code: e.Error.Code, message: e.Error.Message,
		replayed: res.Header.Get("Idempotent-Replayed") == "true"}
}

func fairBody(model, content string) string {
	return `{"model":"` + model + `","messages":[{"role":"user","content":"` + content + `"}]}`
}

// aliceRun is what alice saw in one run.
type aliceRun struct {
	mu        sync.Mutex
	ops       int             // keyed calls, each with its retry
	ok        int             // calls that committed and whose retry replayed
	storeFull int             // idempotency_store_full answers
	cut       int             // her calls past her deadline that did not go on
	notReplay int             // retries that did not replay
	detached  int             // her calls that outlived her deadline and went on
	lat       []time.Duration // first answers of her calls to the healthy model
	downKeys  []string        // her keyed calls to her failing model
	bad       []string
}

// runAlice sends alice's keyed calls at fairAliceRate for d, each followed
// by a retry under the same key, and waits for the last to end.
func (g *fairGateway) runAlice(d time.Duration) *aliceRun {
	r := &aliceRun{}
	tick := time.NewTicker(time.Second / fairAliceRate)
	defer tick.Stop()
	end := time.After(d)
	var wg sync.WaitGroup
	for i := 0; ; i++ {
		select {
		case <-end:
			wg.Wait()
			return r
		case <-tick.C:
		}
		key := fmt.Sprintf("alice-%d", time.Now().UnixNano())
		if i%fairAliceSlowMod == fairAliceSlowMod/2 {
			wg.Go(func() { r.recordDown(key, g.aliceDown(key)) })
			continue
		}
		wg.Go(func() { r.record(g.aliceCall(key, i%fairAliceSlowMod == fairAliceSlowMod-1)) })
	}
}

// aliceOutcome is one of alice's calls and its retry.
type aliceOutcome struct {
	key          string
	first, retry answer
	slow         bool
	took         time.Duration
}

// aliceCall makes one of alice's keyed calls and retries it under the same
// key: a call to the healthy model must be answered 200 and its retry
// replayed; a call to her slow model, with a deadline shorter than the
// model, must be answered 504 client_deadline_exceeded saying the call goes
// on, and its retry must replay the committed answer.
func (g *fairGateway) aliceCall(key string, slow bool) aliceOutcome {
	ctx := context.Background()
	model, hdr := "gpt-4o-mini", map[string]string(nil)
	if slow {
		model, hdr = "alice-slow", map[string]string{"X-Llmgate-Deadline": "0.15"}
	}
	body := fairBody(model, "alice "+key)
	o := aliceOutcome{key: key, slow: slow}
	g.mu.Lock()
	g.aliceKeys[idempotency.HashKey(cache.Key{Scope: "alice", ID: key})] = true
	g.mu.Unlock()
	t0 := time.Now()
	o.first = send(ctx, g.alice, g.url, "key-alice", key, strings.NewReader(body), hdr)
	o.took = time.Since(t0)
	o.retry = send(ctx, g.alice, g.url, "key-alice", key, strings.NewReader(body), nil)
	return o
}

// aliceDown makes one of alice's keyed calls to her failing model: it
// fails, and her dead letter must be recorded.
func (g *fairGateway) aliceDown(key string) answer {
	g.mu.Lock()
	g.aliceKeys[idempotency.HashKey(cache.Key{Scope: "alice", ID: key})] = true
	g.mu.Unlock()
	body := fairBody("alice-down", key+" "+strings.Repeat("a", fairAliceDownBytes))
	return send(context.Background(), g.alice, g.url, "key-alice", key, strings.NewReader(body), nil)
}

func (r *aliceRun) recordDown(key string, a answer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.downKeys = append(r.downKeys, key)
	if a.status != 503 && len(r.bad) < 20 {
		r.bad = append(r.bad, fmt.Sprintf("%s (alice-down): %v, want 503", key, a))
	}
}

func (r *aliceRun) record(o aliceOutcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops++
	for _, a := range []answer{o.first, o.retry} {
		if a.code == "idempotency_store_full" {
			r.storeFull++
		}
	}
	firstOK := o.first.status == 200 && !o.first.replayed
	if o.slow {
		r.detached++
		goesOn := strings.Contains(o.first.message, "The call goes on")
		firstOK = o.first.status == 504 && o.first.code == "client_deadline_exceeded" && goesOn
		if o.first.status == 504 && !goesOn {
			r.cut++
		}
	} else if o.first.err == nil {
		r.lat = append(r.lat, o.took)
	}
	retryOK := o.retry.status == 200 && o.retry.replayed
	if firstOK && !retryOK {
		r.notReplay++
	}
	if firstOK && retryOK {
		r.ok++
		return
	}
	if len(r.bad) < 20 {
		r.bad = append(r.bad, fmt.Sprintf("%s (slow=%v): first %v %q, retry %v %q", o.key, o.slow, o.first, o.first.message, o.retry, o.retry.message))
	}
}

// check asserts what alice is owed: at least 99.9% of her calls commit and
// replay; none is refused for a full store; none of her detached calls is
// cancelled; every retry of a committed call replays.
func (r *aliceRun) check(t *testing.T, phase string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ops == 0 {
		t.Fatalf("alice %s: no calls made", phase)
	}
	if rate := float64(r.ok) / float64(r.ops); rate < 0.999 {
		t.Errorf("alice %s: %d of %d calls committed and replayed (%.2f%%, want >= 99.9%%); first failures: %q", phase, r.ok, r.ops, 100*rate, r.bad)
	}
	if r.storeFull > 0 {
		t.Errorf("alice %s: %d answers idempotency_store_full", phase, r.storeFull)
	}
	if r.cut > 0 {
		t.Errorf("alice %s: %d of her calls past her deadline did not go on (detached call cancelled)", phase, r.cut)
	}
	if r.notReplay > 0 {
		t.Errorf("alice %s: %d retries of committed calls did not replay", phase, r.notReplay)
	}
}

func (r *aliceRun) summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprintf("%d keyed calls (%d past her deadline, detached), %d committed and replayed (%.2f%%), %d store_full, %d detached cancelled, %d retries not replayed",
		r.ops, r.detached, r.ok, 100*float64(r.ok)/float64(max(r.ops, 1)), r.storeFull, r.cut, r.notReplay)
}

// pct is the p-th percentile of alice's latency to the healthy model.
func (r *aliceRun) pct(p int) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.lat) == 0 {
		return 0
	}
	s := slices.Clone(r.lat)
	slices.Sort(s)
	i := min(len(s)-1, (len(s)*p+99)/100-1)
	return s[max(i, 0)].Round(100 * time.Microsecond)
}

// malloryCounts counts mallory's answers by what she sent and status.
type malloryCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (m *malloryCounts) add(kind string, a answer) {
	what := fmt.Sprint(a.status)
	switch {
	case a.err != nil && a.status == 0:
		what = "dropped"
	case a.code != "":
		what += " " + a.code
	}
	m.mu.Lock()
	m.n[kind+": "+what]++
	m.mu.Unlock()
}

func (m *malloryCounts) String() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range m.n {
			if !yield(k) {
				return
			}
		}
	})
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s ×%d", k, m.n[k])
	}
	return b.String()
}

// flood starts mallory's loops; the function returned stops them, waits
// for them and returns her counts. Every loop is paced (about 100 offered
// requests a second in all, five times her rate limit) so the run stays
// bounded on two shared cores.
func (g *fairGateway) flood() func() *malloryCounts {
	m := &malloryCounts{n: map[string]int{}}
	done := make(chan struct{})
	var wg sync.WaitGroup
	loop := func(pace time.Duration, one func(i int)) {
		wg.Go(func() {
			tick := time.NewTicker(pace)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				case <-tick.C:
				}
				one(i)
			}
		})
	}
	letter := fairBody("mal-failing", strings.Repeat("x", 200<<10))
	for w := range 2 {
		loop(25*time.Millisecond, func(i int) {
			key := fmt.Sprintf("mal-fail-%d-%d", w, i)
			m.add("failing", send(context.Background(), g.mallory, g.url, "key-mallory", key, strings.NewReader(letter), nil))
		})
		loop(50*time.Millisecond, func(i int) {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			key := fmt.Sprintf("mal-hang-%d-%d", w, i)
			m.add("hanging, client drops", send(ctx, g.mallory, g.url, "key-mallory", key, strings.NewReader(fairBody("mal-hang", key)), nil))
		})
	}
	over, near := bigBody(21_000_000), bigBody(20_000_000)
	loop(200*time.Millisecond, func(i int) {
		kind, body := "21 MB body", over
		if i%2 == 1 {
			kind, body = "20 MB body", near
		}
		// Her other loops take most of her rate's tokens: a body refused
		// for her rate is sent again at once, a few times.
		for try := range 4 {
			key := fmt.Sprintf("mal-big-%d-%d", i, try)
			a := send(context.Background(), g.mallory, g.url, "key-mallory", key, bytes.NewReader(body), nil)
			m.add(kind, a)
			if a.status != 429 {
				break
			}
		}
	})
	return func() *malloryCounts {
		close(done)
		wg.Wait()
		return m
	}
}

// bigBody is a chat request for mallory's failing model of exactly n bytes.
func bigBody(n int) []byte {
	head, tail := `{"model":"mal-failing","messages":[{"role":"user","content":"`, `"}]}`
	b := make([]byte, 0, n)
	b = append(b, head...)
	b = append(b, bytes.Repeat([]byte("y"), n-len(head)-len(tail))...)
	return append(b, tail...)
}

// scrape reads /metrics: each series' value by "name{labels}" (labels
// sorted, as name="value"), and each family's sum by name.
func (g *fairGateway) scrape() (map[string]float64, error) {
	req, _ := http.NewRequest(http.MethodGet, g.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+fairAdmin)
	res, err := g.admin.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		return nil, fmt.Errorf("GET /metrics: %d", res.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+fmt.Sprintf("%q", l.GetValue()))
			}
			slices.Sort(labels)
			out[name+"{"+strings.Join(labels, ",")+"}"] = v
			out[name] += v
		}
	}
	return out, nil
}

func (g *fairGateway) mustScrape() map[string]float64 {
	g.t.Helper()
	m, err := g.scrape()
	if err != nil {
		g.t.Fatal(err)
	}
	return m
}

// peaks are the highest values of the store's and detached calls' gauges
// seen while watching.
type peaks struct {
	live, detached       float64
	samples, fullSamples int
}

// watcher samples /metrics every 100 ms until stopped.
type watcher struct {
	done chan struct{}
	out  chan peaks
}

func (g *fairGateway) watch() *watcher {
	w := &watcher{done: make(chan struct{}), out: make(chan peaks, 1)}
	go func() {
		var p peaks
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.done:
				w.out <- p
				return
			case <-tick.C:
			}
			m, err := g.scrape()
			if err != nil {
				continue
			}
			p.samples++
			p.live = max(p.live, m["llmgate_store_live_bytes"])
			p.detached = max(p.detached, m["llmgate_detached_calls"])
			if m["llmgate_store_full"] > 0 {
				p.fullSamples++
			}
		}
	}()
	return w
}

func (w *watcher) stop() peaks {
	close(w.done)
	return <-w.out
}

// clientView is one client of GET /admin/clients.
type clientView struct {
	Client             string `json:"client"`
	DeadLetters        int    `json:"dead_letters"`
	DeadLetterBytes    int64  `json:"dead_letter_bytes"`
	MaxDeadLetterBytes int64  `json:"max_dead_letter_bytes"`
	DeadLettersDropped int64  `json:"dead_letters_dropped"`
}

func (g *fairGateway) clients() map[string]clientView {
	g.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, g.url+"/admin/clients", nil)
	req.Header.Set("Authorization", "Bearer "+fairAdmin)
	res, err := g.admin.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer res.Body.Close()
	var v struct{ Clients []clientView }
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil || res.StatusCode != 200 {
		g.t.Fatalf("GET /admin/clients: %d %v", res.StatusCode, err)
	}
	out := map[string]clientView{}
	for _, c := range v.Clients {
		out[c.Client] = c
	}
	return out
}

// checkAliceUntouched asserts what the gateway itself says of alice after
// the flood: her dead letters are those of her calls to her failing model,
// less her own oldest dropped to keep her within her bound (a cancelled
// detached call would add one; a letter refused for want of room mallory
// took would be missing); none of her requests limited; and no log line
// cancelling a detached call of hers or refusing a letter of hers.
func (g *fairGateway) checkAliceUntouched(downKeys []string) {
	g.t.Helper()
	want := map[string]bool{}
	for _, k := range downKeys {
		want[k] = true
	}
	kept := 0
	for _, d := range g.deadLetters("alice") {
		if !want[d.Key] || d.Model != "alice-down" {
			g.t.Errorf("alice has a dead letter for %s on %s: a call of hers that should have committed", d.Key, d.Model)
			continue
		}
		kept++
	}
	a := g.clients()["alice"]
	g.t.Logf("alice's dead letters (her own failing model): %d calls, %d letters kept, %d of her own dropped (bound %d bytes)",
		len(downKeys), kept, a.DeadLettersDropped, a.MaxDeadLetterBytes)
	if kept+int(a.DeadLettersDropped) != len(downKeys) {
		g.t.Errorf("alice's %d failing calls left %d dead letters and dropped %d: the others were refused", len(downKeys), kept, a.DeadLettersDropped)
	}
	if n, _, _ := g.capEvents(); n > 0 {
		g.t.Errorf("%d of alice's dead letters were refused at store.max_bytes (gateway log)", n)
	}
	m := g.mustScrape()
	for _, s := range []string{`llmgate_client_limited_total{client="alice",limit="rate"}`,
		`llmgate_client_limited_total{client="alice",limit="storage"}`, `llmgate_client_limited_total{client="alice",limit="concurrency"}`} {
		if m[s] != 0 {
			g.t.Errorf("%s = %v, want 0", s, m[s])
		}
	}
	if n, _ := g.capCancels(); n > 0 {
		g.t.Errorf("%d of alice's detached calls were cancelled at the cap (gateway log)", n)
	}
}

// letterView is a dead letter in GET /admin/deadletters.
type letterView struct {
	Key   string `json:"idempotency_key"`
	Model string `json:"model"`
}

func (g *fairGateway) deadLetters(client string) []letterView {
	g.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, g.url+"/admin/deadletters?limit=1000&client="+client, nil)
	req.Header.Set("Authorization", "Bearer "+fairAdmin)
	res, err := g.admin.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer res.Body.Close()
	var v struct {
		DeadLetters []letterView `json:"dead_letters"`
	}
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil || res.StatusCode != 200 {
		g.t.Fatalf("GET /admin/deadletters: %d %v", res.StatusCode, err)
	}
	return v.DeadLetters
}

// capCancels counts the gateway's log lines cancelling a detached call at
// the cap (they name the key by its hash): alice's and the others'.
func (g *fairGateway) capCancels() (alice, others int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for line := range strings.Lines(g.p.stderr.String()) {
		var l struct {
			Msg string `json:"msg"`
			Key string `json:"idempotency_key"`
		}
		if json.Unmarshal([]byte(line), &l) != nil || !strings.Contains(l.Msg, "too many detached calls") {
			continue
		}
		if g.aliceKeys[l.Key] {
			alice++
		} else {
			others++
		}
	}
	return alice, others
}

// capEvents counts the gateway's log lines refusing a dead letter at
// store.max_bytes, alice's and the others', and those saying the store
// became full.
func (g *fairGateway) capEvents() (aliceRefused, othersRefused, fulls int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for line := range strings.Lines(g.p.stderr.String()) {
		var l struct {
			Msg string `json:"msg"`
			Key string `json:"idempotency_key"`
			Err string `json:"err"`
		}
		if json.Unmarshal([]byte(line), &l) != nil {
			continue
		}
		switch {
		case l.Msg == "recording dead letter failed" && strings.Contains(l.Err, "store.max_bytes") && g.aliceKeys[l.Key]:
			aliceRefused++
		case l.Msg == "recording dead letter failed" && strings.Contains(l.Err, "store.max_bytes"):
			othersRefused++
		case strings.HasPrefix(l.Msg, "store full:"):
			fulls++
		}
	}
	return aliceRefused, othersRefused, fulls
}

// logLetters logs mallory's dead letters kept against their bound and
// those dropped to keep her within it.
func (g *fairGateway) logLetters() {
	g.t.Helper()
	mal := g.clients()["mallory"]
	m := g.mustScrape()
	g.t.Logf("mallory's dead letters: %.0f recorded, %d kept (%d bytes, bound %d), %.0f dropped (llmgate_deadletters_dropped_total)",
		m["llmgate_deadletters_recorded_total"], mal.DeadLetters, mal.DeadLetterBytes, mal.MaxDeadLetterBytes,
		m[`llmgate_deadletters_dropped_total{client="mallory"}`])
	if mal.DeadLetterBytes > mal.MaxDeadLetterBytes {
		g.t.Errorf("mallory keeps %d bytes of dead letters, over her bound of %d", mal.DeadLetterBytes, mal.MaxDeadLetterBytes)
	}
}

// fillAndPurge has mallory fill the store with committed answers (her
// stored-bytes quota equals the store's cap, an operator's choice), checks
// the full state, purges her data and measures how long the store takes to
// leave the full state: the README says at once, within store.space_interval.
func (g *fairGateway) fillAndPurge() {
	t := g.t
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; g.mustScrape()["llmgate_store_full"] == 0; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("the store did not fill within 15 s: live bytes %.0f", g.mustScrape()["llmgate_store_live_bytes"])
		}
		key := fmt.Sprintf("mal-bulk-%d", i)
		if a := send(ctx, g.mallory, g.url, "key-mallory", key, strings.NewReader(fairBody("mal-bulk", key)), nil); a.status == 429 {
			time.Sleep(50 * time.Millisecond) // pacing under her rate limit
		}
	}
	if a := send(ctx, g.alice, g.url, "key-alice", "alice-while-full", strings.NewReader(fairBody("gpt-4o-mini", "full")), nil); a.code != "idempotency_store_full" {
		t.Fatalf("alice's keyed call on the full store: %v, want 503 idempotency_store_full", a)
	}
	live := g.mustScrape()["llmgate_store_live_bytes"]

	req, _ := http.NewRequest(http.MethodDelete, g.url+"/admin/clients/mallory/data", nil)
	req.Header.Set("Authorization", "Bearer "+fairAdmin)
	t0 := time.Now()
	res, err := g.admin.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	purged, _ := io.ReadAll(res.Body)
	res.Body.Close()
	purgeTook := time.Since(t0)
	if res.StatusCode != 200 {
		t.Fatalf("purge: %d %s", res.StatusCode, purged)
	}
	t1 := time.Now()
	polls := 1
	for ; !g.storeHasRoom(); polls++ {
		if time.Since(t1) > 5*fairSpaceBound {
			t.Fatalf("the store still full %v after the purge", time.Since(t1))
		}
		time.Sleep(10 * time.Millisecond) // polling the gauge
	}
	left := time.Since(t1)
	after := g.mustScrape()["llmgate_store_live_bytes"]
	t.Logf("purge of mallory: %s in %v; the store left the full state %v after it returned, at poll %d of /metrics and /readyz (bound %v); live bytes %.0f -> %.0f",
		bytes.TrimSpace(purged), purgeTook.Round(time.Millisecond), left.Round(time.Millisecond), polls, fairSpaceBound, live, after)
	if left > fairSpaceBound {
		t.Errorf("the store left the full state %v after the purge, more than store.space_interval (%v)", left, fairSpaceBound)
	}
	if a := send(ctx, g.alice, g.url, "key-alice", "alice-after-purge", strings.NewReader(fairBody("gpt-4o-mini", "after")), nil); a.status != 200 || a.replayed {
		t.Errorf("alice's keyed call after the purge: %v, want a new 200", a)
	}
}

// storeHasRoom reports whether both /metrics and /readyz say the store is
// not full.
func (g *fairGateway) storeHasRoom() bool {
	m, err := g.scrape()
	if err != nil || m["llmgate_store_full"] != 0 {
		return false
	}
	res, err := g.admin.Get(g.url + "/readyz")
	if err != nil {
		return false
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return !strings.Contains(string(b), "store full")
}
