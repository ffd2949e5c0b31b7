package main

// -demo: the gateway in front of the simulated upstream (package
// cmd/gateway/demo), with what a newcomer's tour needs — models that fail on
// purpose, the admin API and page opened with a fresh token, and a
// breaker that closes again within seconds — and a banner that says how to
// see each. Nothing here runs without -demo.

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/llmgate/llmgate/cmd/gateway/demo"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/admin"
)

// What -demo changes in the configuration, where the configuration left
// the default. A value the file or the environment set otherwise wins.
const (
	// demoOpenTimeout: the breaker of demo-down half-opens after 10s rather
	// than 30s, so the tour sees it close again soon after the outage.
	demoOpenTimeout = 10 * time.Second
	// demoBaseDelay: the backoff before the first retry is up to 250ms
	// rather than 1s, so the five failing requests that open the breaker
	// take a couple of seconds rather than up to fifteen.
	demoBaseDelay = 250 * time.Millisecond
)

// Upstream names in demo mode. demo-down has an upstream of its own, so
// that the tour can replay its dead letters by upstream; its breaker would
// open alone on the demo upstream too, breakers being per model.
const (
	demoUpstream     = "demo"
	demoDownUpstream = "demo-down"
	// demoAnthropicUpstream answers claude-* models on /v1/messages, in
	// Anthropic's API (claude-demo-* fail as the demo models do).
	demoAnthropicUpstream = "demo-anthropic"
)

// demoMode is what -demo set up.
type demoMode struct {
	baseURL string // the simulated upstream's, with /v1
	stop    func()
	outage  time.Duration
	// tour: the configuration lists no upstream of its own, so the
	// simulated one (and its demo models) serves every request.
	tour bool
	// token is the admin token -demo made; empty when the configuration
	// set one (which is then not printed).
	token string
	// code is the one-time sign-in code (admin.Options.SignInCode).
	code string
	// tempDir is the data_dir -demo made, removed on exit; empty when the
	// configuration named one.
	tempDir string
}

// startDemo serves the simulated upstream in-process, on a loopback port of
// its own, with its demo models on.
func startDemo(outage time.Duration) (*demoMode, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("demo upstream: %w", err)
	}
	fake := demo.New(demo.Options{
		ChunkDelay: 40 * time.Millisecond,
		DemoModels: true,
		DemoOutage: outage,
	})
	srv := &http.Server{Handler: fake, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	d := &demoMode{baseURL: "http://" + ln.Addr().String() + "/v1", outage: outage}
	d.stop = func() {
		// Close first: it releases any request the fake is holding.
		fake.Close()
		srv.Close()
		if d.tempDir != "" {
			_ = os.RemoveAll(d.tempDir)
		}
	}
	return d, nil
}

// env points the zero-config upstream at the simulated one, so that a
// configuration with no upstreams validates; configure then splits it in
// two.
func (d *demoMode) env(getenv func(string) string) func(string) string {
	return func(k string) string {
		switch k {
		case "OPENAI_BASE_URL":
			return d.baseURL
		case "OPENAI_API_KEY":
			return "demo"
		}
		return getenv(k)
	}
}

// configure makes cfg what the tour needs: the demo upstreams, an admin
// token, a one-time sign-in code, a data_dir of its own, and a shorter
// breaker open_timeout and retry backoff. Values the configuration set
// (other than to their defaults) are kept.
func (d *demoMode) configure(cfg *config.Config) error {
	if len(cfg.Upstreams) == 1 && cfg.Upstreams[0].BaseURL == d.baseURL {
		d.tour = true
		down := config.Upstream{Name: demoDownUpstream, BaseURL: d.baseURL, APIKey: "demo", Models: []string{demo.DemoDown}}
		rest := config.Upstream{Name: demoUpstream, BaseURL: d.baseURL, APIKey: "demo", Models: []string{"*"}}
		// Anthropic's base_url has no /v1.
		ant := config.Upstream{Name: demoAnthropicUpstream, BaseURL: strings.TrimSuffix(d.baseURL, "/v1"), APIKey: "demo",
			API: config.APIAnthropic, Models: []string{"claude-*"}}
		cfg.Upstreams = []config.Upstream{down.WithDefaults(), rest.WithDefaults(), ant.WithDefaults()}
	}
	if cfg.AdminToken == "" {
		d.token = randomString(24)
		cfg.AdminToken = d.token
	}
	d.code = randomString(32)
	def := config.Default()
	if cfg.DataDir == def.DataDir {
		// A tour starts afresh: keys and dead letters of an earlier run
		// would replay where the banner promises a retry.
		dir, err := os.MkdirTemp("", "llmgate-demo-")
		if err != nil {
			return fmt.Errorf("demo data_dir: %w", err)
		}
		d.tempDir, cfg.DataDir = dir, dir
	}
	if cfg.Breaker.OpenTimeout == def.Breaker.OpenTimeout {
		cfg.Breaker.OpenTimeout = config.Duration(demoOpenTimeout)
	}
	if cfg.Retry.BaseDelay == def.Retry.BaseDelay {
		cfg.Retry.BaseDelay = config.Duration(demoBaseDelay)
	}
	return cfg.Validate()
}

// randomString is n bytes from crypto/rand, base64url.
func randomString(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (it crashes the program instead)
	return base64.RawURLEncoding.EncodeToString(b)
}

// banner prints, on stdout only, how to take the tour: a curl line per
// demo model, the admin token (here and nowhere else: never in the logs),
// the one-time sign-in link, and where to look.
func (d *demoMode) banner(w io.Writer, cfg config.Config, addr string) {
	base := "http://" + browserAddr(addr)
	auth := `-H "Authorization: Bearer $TOKEN"`
	var b strings.Builder
	if d.tour {
		fmt.Fprintf(&b, "\nDemo: a simulated upstream answers every model at once, except the demo-* ones, which fail on purpose.\n")
		fmt.Fprintf(&b, "Each request's log line (stderr) says how it went: status, class, attempts.\n")
		fmt.Fprintf(&b, "\n  gpt-4o-mini, or any other model: an answer\n    %s\n", demoCurl(base, demo.Demo{Model: "gpt-4o-mini"}, 0))
		for _, m := range demo.Demos(d.outage) {
			fmt.Fprintf(&b, "\n  %s: %s\n    %s\n", m.Model, m.Does, demoCurl(base, m, int(cfg.Breaker.ConsecutiveFailures)+1))
		}
		fmt.Fprintf(&b, "\n  claude-sonnet-4-5, or any claude-* model, on Anthropic's Messages API (claude-demo-* fail as demo-* do)\n    %s\n",
			"curl -si "+base+"/v1/messages -H 'Content-Type: application/json' -H 'anthropic-version: 2023-06-01'"+
				` -d '{"model":"claude-sonnet-4-5","max_tokens":256,"messages":[{"role":"user","content":"Hello"}]}'`)
		fmt.Fprintf(&b, "\n  demo-down is upstream %q, with a circuit breaker of its own: %d failed requests open it,\n"+
			"  which refuses the next at once; %s later it lets one through, and once the outage is over it closes.\n"+
			"  Each failed request with an Idempotency-Key is a dead letter, to replay once demo-down is back.\n",
			demoDownUpstream, cfg.Breaker.ConsecutiveFailures, cfg.Breaker.OpenTimeout)
	} else {
		fmt.Fprintf(&b, "\nDemo: the configuration lists its own upstreams, so the simulated one and its demo models are not used.\n")
	}
	fmt.Fprintf(&b, "\nAdmin API and page:\n")
	if d.token != "" {
		fmt.Fprintf(&b, "  export TOKEN=%s\n  (the admin token, made for this run and shown only here)\n", d.token)
	} else {
		fmt.Fprintf(&b, "  the admin token is the configured one (admin_token or GATEWAY_ADMIN_TOKEN)\n")
	}
	fmt.Fprintf(&b, "  sign in:      %s%s?code=%s\n", base, admin.SignInCodePath, d.code)
	fmt.Fprintf(&b, "                (opens the page in a browser on this machine, once, within %s)\n", roundMinutes(admin.DefaultSignInCodeTTL))
	fmt.Fprintf(&b, "  page:         %s/admin/\n", base)
	fmt.Fprintf(&b, "  breakers:     curl -s %s/admin/breakers %s\n", base, auth)
	fmt.Fprintf(&b, "  dead letters: curl -s %s/admin/deadletters %s\n", base, auth)
	fmt.Fprintf(&b, "  replay one:   curl -s -X POST %s/admin/deadletters/<id>/replay %s\n", base, auth)
	fmt.Fprintf(&b, "  replay all:   curl -s -X POST '%s/admin/deadletters/replay?upstream=%s' %s\n", base, demoDownUpstream, auth)
	_, _ = io.WriteString(w, b.String())
}

// demoCurl is the one command that shows what model m does. downRequests
// is how many requests to demo-down the tour sends: enough to open its
// breaker, and one the open breaker refuses.
func demoCurl(base string, m demo.Demo, downRequests int) string {
	stream := ""
	if m.Stream {
		stream = `"stream":true,`
	}
	body := `{"model":"` + m.Model + `",` + stream + `"messages":[{"role":"user","content":"Hello"}]}`
	url := base + "/v1/chat/completions"
	switch {
	case m.Model == demo.DemoDown:
		// The time says which requests were retried and which the open
		// breaker refused at once.
		return fmt.Sprintf(`for i in $(seq %d); do curl -s -o /dev/null -w '%%{http_code} in %%{time_total}s\n' %s`+
			` -H 'Content-Type: application/json' -H "Idempotency-Key: tour-down-$i" -d '%s'; done`, downRequests, url, body)
	case m.Stream:
		return "curl -sN " + url + " -H 'Content-Type: application/json' -d '" + body + "'"
	}
	return "curl -si " + url + " -H 'Content-Type: application/json' -H 'Idempotency-Key: tour-" + m.Model + "' -d '" + body + "'"
}

// browserAddr is addr as a browser on this machine reaches it: an
// unspecified listen address (0.0.0.0, ::) becomes 127.0.0.1.
func browserAddr(addr string) string {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().IsUnspecified() {
		return addr
	}
	return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ap.Port()).String()
}

// roundMinutes says d in whole minutes: "10 minutes".
func roundMinutes(d time.Duration) string {
	return fmt.Sprintf("%d minutes", int(d.Round(time.Minute)/time.Minute))
}
