package gateway

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/cmd/gateway/demo"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// breakerEntry is one breaker of /admin/breakers as these tests read it.
type breakerEntry struct {
	Name     string `json:"name"`
	Model    string `json:"model"`
	Covers   string `json:"covers"`
	State    string `json:"state"`
	OpenedBy *struct {
		Reason   string    `json:"reason"`
		Failures uint32    `json:"failures"`
		Class    string    `json:"class"`
		At       time.Time `json:"at"`
	} `json:"opened_by"`
	StateSince  *time.Time `json:"state_since"`
	CountsSince *time.Time `json:"counts_since"`
	Rejected    uint32     `json:"rejected"`
	ProbeAt     *time.Time `json:"probe_at"`
}

func breakers(t *testing.T, h *harness) []breakerEntry {
	t.Helper()
	r := h.admin(http.MethodGet, "/admin/breakers")
	if r.status != 200 {
		t.Fatalf("/admin/breakers: %d %s", r.status, r.body)
	}
	var v struct{ Breakers []breakerEntry }
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatal(err)
	}
	return v.Breakers
}

// findBreaker is the breaker of upstream and model ("" for the
// upstream-wide one), or nil.
func findBreaker(bs []breakerEntry, upstream, model string) *breakerEntry {
	for i := range bs {
		if bs[i].Name == upstream && bs[i].Model == model {
			return &bs[i]
		}
	}
	return nil
}

func modelBody(model string, stream bool) string {
	s := ""
	if stream {
		s = `"stream":true,`
	}
	return `{"model":"` + model + `",` + s + `"messages":[{"role":"user","content":"hi"}]}`
}

// One model of an upstream fails until its breaker opens; another model of
// the same upstream keeps answering 200, and the admin view says which
// breaker opened, with what.
func TestBreakerOneModelOpensItsNeighboursStillServe(t *testing.T) {
	h := newHarnessStore(t, func(c *config.Config) {
		c.Retry.MaxAttempts = 1
		c.Breaker.ConsecutiveFailures = 3
	}, nil, fakeprovider.Options{DemoModels: true, DemoOutage: time.Hour})
	for i := range 3 {
		if r := h.chat(modelBody(demo.DemoDown, false), nil); r.status != 503 {
			t.Fatalf("demo-down call %d: %d %s", i, r.status, r.body)
		}
	}
	for i := range 5 {
		if r := h.chat(modelBody("gpt-4o-mini", false), nil); r.status != 200 {
			t.Fatalf("gpt-4o-mini call %d, on the same upstream: %d %s", i, r.status, r.body)
		}
	}
	before := h.fake.Calls("")
	r := h.chat(modelBody(demo.DemoDown, false), nil)
	e := wantOpenAIError(t, r, 503)
	if e["code"] != "upstream_unavailable" || !strings.Contains(e["message"].(string), demo.DemoDown) {
		t.Fatalf("open breaker's answer: %s", r.body)
	}
	if h.fake.Calls("") != before {
		t.Fatal("the open breaker let demo-down reach the upstream")
	}

	bs := breakers(t, h)
	down := findBreaker(bs, "primary", demo.DemoDown)
	if down == nil || down.State != "open" || down.Covers != "model" {
		t.Fatalf("demo-down's breaker: %+v in %+v", down, bs)
	}
	if ob := down.OpenedBy; ob == nil || ob.Failures != 3 || ob.Class != "transient" || ob.Reason != "consecutive_failures" {
		t.Errorf("opened_by = %+v, want 3 consecutive transient failures", ob)
	}
	if down.Rejected != 1 || down.ProbeAt == nil || down.StateSince == nil {
		t.Errorf("demo-down: %+v, want 1 rejected since it opened, a probe time and a state time", down)
	}
	if ok := findBreaker(bs, "primary", "gpt-4o-mini"); ok == nil || ok.State != "closed" {
		t.Errorf("gpt-4o-mini's breaker: %+v", ok)
	}
	if wide := findBreaker(bs, "primary", ""); wide == nil || wide.State != "closed" || wide.Covers != "connection" {
		t.Errorf("the upstream-wide breaker: %+v, want closed, counting connection failures", wide)
	}
}

// A connection-level failure (nothing listens) counts against the
// upstream as a whole: a model never sent opens as soon as it does.
func TestBreakerConnectionFailureOpensEveryModel(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close() // connection refused from now on
	h := newHarness(t, func(c *config.Config) {
		c.Retry.MaxAttempts = 1
		c.Breaker.ConsecutiveFailures = 3
		// First: routing takes the first upstream whose wildcard matches.
		c.Upstreams = append([]config.Upstream{{Name: "dead", BaseURL: dead + "/v1",
			Models: []string{"dead-*"}, Timeout: config.Duration(5 * time.Second)}}, c.Upstreams...)
	})
	for i := range 3 {
		if r := h.chat(modelBody("dead-a", false), nil); r.status != 502 {
			t.Fatalf("dead-a call %d: %d %s", i, r.status, r.body)
		}
	}
	r := h.chat(modelBody("dead-b", false), nil)
	if e := wantOpenAIError(t, r, 503); e["code"] != "upstream_unavailable" || r.header.Get("Retry-After") == "" {
		t.Fatalf("dead-b after the upstream's connection failures: %s (Retry-After %q)", r.body, r.header.Get("Retry-After"))
	}
	bs := breakers(t, h)
	if wide := findBreaker(bs, "dead", ""); wide == nil || wide.State != "open" || wide.OpenedBy == nil || wide.OpenedBy.Failures != 3 {
		t.Fatalf("the upstream-wide breaker of dead: %+v", wide)
	}
	if a := findBreaker(bs, "dead", "dead-a"); a == nil || a.State != "closed" {
		t.Errorf("dead-a's own breaker: %+v, want closed (the failures were the connection's)", a)
	}
	// Another upstream is not touched.
	if r := h.chat(chatBody, nil); r.status != 200 {
		t.Fatalf("primary: %d", r.status)
	}
}

// The tour's failure models, tried in any order, no longer take the
// healthy models of their upstream down: a stream cut five times opens
// demo-cut's breaker only.
func TestDemoFailureModelsLeaveHealthyOnesServing(t *testing.T) {
	h := newHarnessStore(t, func(c *config.Config) {
		c.Upstreams[0].Name = "demo"
	}, nil, fakeprovider.Options{DemoModels: true})
	for i := range 6 {
		r := h.chat(modelBody(demo.DemoCut, true), nil)
		if r.status != 200 && r.status != 503 {
			t.Fatalf("demo-cut call %d: %d %s", i, r.status, r.body)
		}
	}
	if b := findBreaker(breakers(t, h), "demo", demo.DemoCut); b == nil || b.State != "open" {
		t.Fatalf("demo-cut's breaker after six cut streams: %+v", b)
	}
	for _, m := range []string{"gpt-4o-mini", demo.DemoEmpty, demo.DemoFiltered} {
		if r := h.chat(modelBody(m, false), nil); r.status != 200 {
			t.Errorf("%s after demo-cut's breaker opened: %d %s", m, r.status, r.body)
		}
	}
}

// The page shows each breaker from the same Snapshot as /admin/breakers:
// the model's row carries what opened it and the counts since, equal to
// the JSON's.
func TestBreakerPageMatchesJSON(t *testing.T) {
	h := newHarnessStore(t, func(c *config.Config) {
		c.Retry.MaxAttempts = 1
		c.Breaker.ConsecutiveFailures = 3
	}, nil, fakeprovider.Options{DemoModels: true, DemoOutage: time.Hour})
	for range 5 { // 3 failures open it, 2 are refused
		h.chat(modelBody(demo.DemoDown, false), nil)
	}
	down := findBreaker(breakers(t, h), "primary", demo.DemoDown)
	if down == nil || down.State != "open" || down.Rejected != 2 || down.OpenedBy == nil {
		t.Fatalf("JSON: %+v", down)
	}
	r := h.page(http.MethodGet, "/admin/", nil, h.login(), nil)
	body := string(r.body)
	_, row, ok := strings.Cut(body, `<tr id="breaker-primary/demo-down">`)
	row, _, _ = strings.Cut(row, "</tr>")
	if !ok {
		t.Fatalf("no row for demo-down's breaker:\n%s", body)
	}
	for _, want := range []string{
		`<span class="badge state open">open</span>`,
		`3 failures in a row (last: transient), ` + down.OpenedBy.At.UTC().Format("15:04:05"),
		`<td class="num requests">0</td>`,
		`<td class="num rejected">2</td>`,
		`half-open at ` + down.ProbeAt.UTC().Format("15:04:05"),
		`action="/admin/ui/breakers/primary/close?model=demo-down"`,
	} {
		if !strings.Contains(row, want) {
			t.Errorf("demo-down's row lacks %s:\n%s", want, row)
		}
	}
	if !strings.Contains(body, `<tr id="breaker-primary">`) {
		t.Error("no row for the upstream's own breaker")
	}
	// /metrics carries the same breaker, by model.
	m := string(h.admin(http.MethodGet, "/metrics").body)
	for _, want := range []string{
		`llmgate_breaker_state{model="demo-down",upstream="primary"} 2`,
		`llmgate_breaker_rejections_total{model="demo-down",upstream="primary"} 2`,
		`llmgate_breaker_transitions_total{from="closed",model="demo-down",to="open",upstream="primary"} 1`,
		`llmgate_breaker_state{model="",upstream="primary"} 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// An operator forces one model open, through the API: that model is
// refused, the others of the upstream are not; closing it lets it through.
func TestForceOpenOneModel(t *testing.T) {
	h := newHarness(t, nil)
	if r := h.admin(http.MethodPost, "/admin/breakers/primary/open?model=gpt-4o"); r.status != 200 || !strings.Contains(string(r.body), `"model":"gpt-4o"`) {
		t.Fatalf("force open gpt-4o: %d %s", r.status, r.body)
	}
	if r := h.chat(modelBody("gpt-4o", false), nil); r.status != 503 {
		t.Fatalf("forced-open model: %d %s", r.status, r.body)
	}
	if r := h.chat(modelBody("gpt-4o-mini", false), nil); r.status != 200 {
		t.Fatalf("its neighbour: %d %s", r.status, r.body)
	}
	if r := h.admin(http.MethodPost, "/admin/breakers/primary/close?model=gpt-4o"); r.status != 200 {
		t.Fatalf("close: %d %s", r.status, r.body)
	}
	if r := h.chat(modelBody("gpt-4o", false), nil); r.status != 200 {
		t.Fatalf("after close: %d %s", r.status, r.body)
	}
}

// Which failures count against the upstream as a whole: those where no
// HTTP answer came for a reason of the connection's. A model that hangs
// to its timeout is the model's own failure.
func TestBreakerConnectionLevelFailures(t *testing.T) {
	closing, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closing.Close() })
	go func() { // accepts, reads the request, closes without an answer
		for {
			c, err := closing.Accept()
			if err != nil {
				return
			}
			_, _ = c.Read(make([]byte, 4096))
			c.Close()
		}
	}()
	untrusted := newTLSTestServer(t)
	for _, tc := range []struct {
		name, url string
		hang      bool
		wide      bool // the upstream-wide breaker opens
	}{
		{name: "closed before a response", url: "http://" + closing.Addr().String(), wide: true},
		{name: "TLS certificate not trusted", url: untrusted, wide: true},
		{name: "model hangs to its timeout", hang: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *config.Config) {
				c.Retry.MaxAttempts = 1
				c.Breaker.ConsecutiveFailures = 2
				if tc.url != "" {
					c.Upstreams[0].BaseURL = tc.url + "/v1"
				}
				c.Upstreams[0].Timeout = config.Duration(5 * time.Second) // a TLS handshake under -race is slow
				if tc.hang {
					c.Upstreams[0].Timeout = config.Duration(300 * time.Millisecond)
				}
			})
			if tc.hang {
				h.fake.SetDefault(fakeprovider.Step{Hang: true})
			}
			for range 2 {
				if r := h.chat(modelBody("m-a", false), nil); r.status < 500 {
					t.Fatalf("m-a: %d %s", r.status, r.body)
				}
			}
			bs := breakers(t, h)
			wide, a := findBreaker(bs, "primary", ""), findBreaker(bs, "primary", "m-a")
			if wide == nil || a == nil {
				t.Fatalf("breakers %+v", bs)
			}
			if got := wide.State == "open"; got != tc.wide {
				t.Errorf("upstream-wide breaker %+v, model's %+v; want the upstream's open: %v", *wide, *a, tc.wide)
			}
			if got := a.State == "open"; got == tc.wide {
				t.Errorf("model's breaker %s; want it open: %v", a.State, !tc.wide)
			}
		})
	}
}

// newTLSTestServer is an HTTPS server whose certificate the gateway does
// not trust.
func newTLSTestServer(t *testing.T) string {
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestLearnedBreakersSharedByClients: a tenant naming many models (all the
// upstream's 64 learned-model slots and more) takes at most half of them:
// another tenant's failing model still gets a breaker of its own, which
// opens. Before, the flood took every slot, and the other tenant's
// failing model was sent on and on (8 requests, 16 provider calls with
// retries, in the attack that found it).
func TestLearnedBreakersSharedByClients(t *testing.T) {
	h := newHarnessStore(t, func(c *config.Config) {
		c.Retry.MaxAttempts = 1
		c.Breaker.ConsecutiveFailures = 3
		c.Clients = []config.Client{{Name: "mallory", Key: "key-mallory"}, {Name: "alice", Key: "key-alice"}}
	}, nil, fakeprovider.Options{DemoModels: true, DemoOutage: time.Hour})
	mallory := map[string]string{"Authorization": "Bearer key-mallory"}
	alice := map[string]string{"Authorization": "Bearer key-alice"}
	for i := range breaker.DefaultMaxLearnedModels + 6 {
		if r := h.chat(modelBody(fmt.Sprintf("gpt-flood-%d", i), false), mallory); r.status != 200 {
			t.Fatalf("mallory's model %d: %d %s", i, r.status, r.body)
		}
	}
	for i := range 3 {
		if r := h.chat(modelBody(demo.DemoDown, false), alice); r.status != 503 {
			t.Fatalf("alice's demo-down call %d: %d %s", i, r.status, r.body)
		}
	}
	before := h.fake.Calls("")
	r := h.chat(modelBody(demo.DemoDown, false), alice)
	if e := wantOpenAIError(t, r, 503); e["code"] != "upstream_unavailable" {
		t.Fatalf("alice's failing model after three failures: %s, want its open breaker's 503", r.body)
	}
	if h.fake.Calls("") != before {
		t.Fatal("alice's failing model still reached the upstream: it got no breaker of its own")
	}
	learned := 0
	for _, b := range breakers(t, h) {
		if strings.HasPrefix(b.Model, "gpt-flood-") {
			learned++
		}
	}
	if learned != breaker.DefaultMaxLearnedModels/2 {
		t.Errorf("mallory's models have %d breakers, want her share, %d", learned, breaker.DefaultMaxLearnedModels/2)
	}
}
