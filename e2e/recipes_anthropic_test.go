package e2e

// The Anthropic recipes — anthropic-sdk-go v2 (e2e/recipes/anthropicgo, in
// process) and the TypeScript SDK (e2e/recipes/node/recipe_anthropic.mjs,
// through driver.mjs) — run as written against the real gateway binary in
// front of the fake Anthropic provider, through one suite:
//
//   - messages.create, and messages.stream read whole (finalMessage() in
//     TypeScript, the accumulator in Go), get the provider's answer;
//   - the same Idempotency-Key again (set through the SDK's headers
//     option) is answered with the same message id, byte for byte what the
//     first call got, Idempotent-Replayed: true, and one upstream call —
//     for JSON and for streams;
//   - the key reused with another body raises the SDK's error (422);
//   - an error the gateway itself makes (a 400 for a key too long) is
//     raised as the SDK's APIError with status 400 and Anthropic's type;
//   - a stream that fails mid-way makes finalMessage() / stream.Err()
//     fail, and the same key's next call runs it again;
//   - a failure the gateway has already retried (529 max_attempts times)
//     says x-should-retry: false, so the SDK, its retries left on, makes
//     exactly one HTTP call.
//
// TestRecipeAnthropicTSBatchResults runs the TypeScript SDK's
// batches.results(), which fetches the batch's absolute results_url.
//
// A recording proxy in front of the gateway counts the clients' HTTP calls
// and keeps the bytes of each answer as the client received them.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/e2e/recipes/anthropicgo"
)

// anthropicUpstreamKey is the Anthropic upstream's own key in the
// gateway's config: the provider must see it, never the client's.
const anthropicUpstreamKey = "sk-ant-e2e-upstream-key"

// anthropicRecipeGateway is a gateway process whose one upstream is the
// fake Anthropic provider, behind a recording proxy.
type anthropicRecipeGateway struct {
	t        *testing.T
	ant      *fakeprovider.Anthropic
	upstream string // the fake provider's root
	proxy    *recordingProxy
	url      string // the proxy's root: what a client is given as its base URL
}

func startAnthropicRecipeGateway(t *testing.T) *anthropicRecipeGateway {
	t.Helper()
	ant := fakeprovider.NewAnthropic()
	up := httptest.NewServer(ant)
	t.Cleanup(up.Close)
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
data_dir: %s
admin_token: e2e-admin-token
log: {format: json, level: debug}
upstreams:
  - name: anthropic
    base_url: %s
    api: anthropic
    api_key: %s
    models: ["claude-*"]
    timeout: 10s
retry: {max_attempts: %d, base_delay: 5ms, max_delay: 20ms}
clients:
  - name: %s
    key: %s
server: {shutdown_grace: 10s}
`, t.TempDir(), up.URL, anthropicUpstreamKey, recipeMaxAttempts, recipeClient, recipeClientKey)
	path := t.TempDir() + "/gateway.yaml"
	writeFile(t, path, cfg)
	p := start(t, gatewayBin(t, ""), []string{"-config", path}, nil)
	rp := &recordingProxy{target: p.URL}
	rp.idle.L = &rp.mu
	front := httptest.NewServer(rp)
	t.Cleanup(front.Close)
	return &anthropicRecipeGateway{t: t, ant: ant, upstream: up.URL, proxy: rp, url: front.URL}
}

// upstreamCalls counts the provider's requests whose body holds text.
func (g *anthropicRecipeGateway) upstreamCalls(text string) int {
	n := 0
	for _, r := range g.ant.Requests() {
		if bytes.Contains(r.Body, []byte(text)) {
			n++
		}
	}
	return n
}

// recordingProxy forwards every request to target, its Host kept (as a
// front proxy that passes Host on does, so URLs the gateway builds from it
// name the proxy), and records it with the answer's bytes as they passed,
// flushing each write (streams stay streams).
type recordingProxy struct {
	target string
	mu     sync.Mutex
	// idle is signalled when inFlight drops to 0: a client may have read
	// the whole answer before its handler has recorded it.
	idle     sync.Cond
	inFlight int
	calls    []clientCall
}

// clientCall is one HTTP call a client made, and what it got.
type clientCall struct {
	Method  string
	Path    string
	Request http.Header
	Body    []byte // the request's
	Status  int
	Header  http.Header // the answer's
	Answer  []byte
}

func (p *recordingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	call := clientCall{Method: r.Method, Path: r.URL.Path, Request: r.Header.Clone(), Body: body, Status: http.StatusBadGateway}
	p.mu.Lock()
	p.inFlight++
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.calls = append(p.calls, call)
		if p.inFlight--; p.inFlight == 0 {
			p.idle.Broadcast()
		}
		p.mu.Unlock()
	}()
	req, err := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		w.WriteHeader(call.Status)
		return
	}
	req.Header, req.Host = r.Header.Clone(), r.Host
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		w.WriteHeader(call.Status)
		return
	}
	defer res.Body.Close()
	call.Status, call.Header = res.StatusCode, res.Header.Clone()
	maps.Copy(w.Header(), res.Header)
	w.WriteHeader(res.StatusCode)
	var got bytes.Buffer
	_, _ = io.Copy(io.MultiWriter(&got, flushWriter{w}), res.Body)
	call.Answer = got.Bytes()
}

type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(b []byte) (int, error) {
	n, err := f.w.Write(b)
	_ = http.NewResponseController(f.w).Flush()
	return n, err
}

// callsFor returns the recorded calls whose request body holds text,
// once no call is in flight.
func (p *recordingProxy) callsFor(text string) []clientCall {
	return p.callsWhere(func(c clientCall) bool { return bytes.Contains(c.Body, []byte(text)) })
}

// callsWhere returns the recorded calls that keep holds for, once no call
// is in flight.
func (p *recordingProxy) callsWhere(keep func(clientCall) bool) []clientCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.inFlight > 0 {
		p.idle.Wait()
	}
	var out []clientCall
	for _, c := range p.calls {
		if keep(c) {
			out = append(out, c)
		}
	}
	return out
}

// anthropicRunner runs an Anthropic recipe once: op is "create" or
// "stream" (read whole), the key derived from orderID, the prompt from
// text. It may run off the test goroutine, so it returns errors instead of
// failing the test.
type anthropicRunner func(op, orderID, text string) (recipeResult, error)

// anthropicFakeText is the fake provider's answer, JSON or streamed.
const anthropicFakeText = "Hello from the fake Anthropic provider."

// anthropicRecipeSuite holds an Anthropic recipe to the checks at the top
// of the file, on a gateway of its own; newRunner points the recipe at it.
func anthropicRecipeSuite(t *testing.T, newRunner func(g *anthropicRecipeGateway) anthropicRunner) {
	g := startAnthropicRecipeGateway(t)
	run := newRunner(g)
	must := func(op, orderID, text string) recipeResult {
		t.Helper()
		r, err := run(op, orderID, text)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, op := range []string{"create", "stream"} {
		t.Run(op+" and its replay", func(t *testing.T) {
			text := "the order to " + op
			first := must(op, op, text)
			if !first.OK || first.Content != anthropicFakeText || !strings.HasPrefix(first.ID, "msg_") {
				t.Fatalf("first call: %+v", first)
			}
			second := must(op, op, text)
			if !second.OK || second.ID != first.ID || second.Raw != first.Raw {
				t.Fatalf("the replay differs:\nfirst  %+v\nsecond %+v", first, second)
			}
			if first.Replayed != "" || second.Replayed != "true" {
				t.Errorf("Idempotent-Replayed: first %q, second %q", first.Replayed, second.Replayed)
			}
			calls := g.proxy.callsFor(text)
			if len(calls) != 2 || len(calls[0].Answer) == 0 || !bytes.Equal(calls[0].Answer, calls[1].Answer) {
				t.Fatalf("%d client calls; answers byte-identical: %v", len(calls), len(calls) == 2 && bytes.Equal(calls[0].Answer, calls[1].Answer))
			}
			want := map[string]string{"create": "application/json", "stream": "text/event-stream"}[op]
			if ct := calls[1].Header.Get("Content-Type"); !strings.HasPrefix(ct, want) {
				t.Errorf("the replay's Content-Type is %q, want %s", ct, want)
			}
			if n := g.upstreamCalls(text); n != 1 {
				t.Errorf("upstream calls = %d, want 1", n)
			}
			for _, r := range g.ant.Requests() {
				if r.Header.Get("X-Api-Key") != anthropicUpstreamKey || strings.Contains(fmt.Sprint(r.Header), recipeClientKey) {
					t.Errorf("the provider saw x-api-key %q and headers %v", r.Header.Get("X-Api-Key"), r.Header)
				}
			}
		})
	}

	t.Run("another body under the key is the SDK's 422", func(t *testing.T) {
		r := must("create", "create", "another order under the same key")
		if r.OK || r.Status != http.StatusUnprocessableEntity || r.Type != "invalid_request_error" {
			t.Fatalf("got %+v, want a 422 invalid_request_error", r)
		}
		if n := g.upstreamCalls("another order under the same key"); n != 0 {
			t.Errorf("upstream calls = %d, want 0", n)
		}
	})

	t.Run("the gateway's 400 is the SDK's APIError", func(t *testing.T) {
		long := strings.Repeat("x", cache.MaxIDLen)
		r := must("create", long, "an order with a key too long")
		if r.OK || r.Status != http.StatusBadRequest || r.Type != "invalid_request_error" || !strings.Contains(r.Message, "Idempotency-Key") {
			t.Fatalf("got %+v, want a 400 invalid_request_error about the Idempotency-Key", r)
		}
		calls := g.proxy.callsFor("an order with a key too long")
		if len(calls) != 1 {
			t.Fatalf("%d client calls, want 1", len(calls))
		}
		if a := calls[0].Answer; !json.Valid(a) || !bytes.HasPrefix(a, []byte(`{"type":"error","error":{"type":"invalid_request_error"`)) {
			t.Fatalf("the gateway answered %s", a)
		}
		if n := g.upstreamCalls("an order with a key too long"); n != 0 {
			t.Errorf("upstream calls = %d, want 0", n)
		}
	})

	t.Run("a failed stream is not taken as complete", func(t *testing.T) {
		text := "an order whose stream fails"
		g.ant.Enqueue(fakeprovider.AnthropicStep{Events: fakeprovider.AnthropicErrorAfterTwoDeltas("claude-sonnet-4-5")})
		r := must("stream", "failing-stream", text)
		if r.OK {
			t.Fatalf("the SDK took a failed stream as complete: %+v", r)
		}
		again := must("stream", "failing-stream", text)
		if !again.OK || again.Content != anthropicFakeText || again.Replayed != "" {
			t.Fatalf("the same key's next call: %+v", again)
		}
		if n := g.upstreamCalls(text); n != 2 {
			t.Errorf("upstream calls = %d, want 2 (the failed stream was not committed)", n)
		}
	})

	t.Run("the SDK's retries do not multiply the gateway's", func(t *testing.T) {
		text := "an order the provider is too busy for"
		for range recipeMaxAttempts {
			g.ant.Enqueue(fakeprovider.AnthropicStep{Status: 529, ErrorType: "overloaded_error"})
		}
		r := must("create", "overloaded", text)
		if r.OK || r.Status != 529 || r.Type != "overloaded_error" {
			t.Fatalf("got %+v, want the SDK's 529 overloaded_error", r)
		}
		calls := g.proxy.callsFor(text)
		if len(calls) != 1 {
			t.Fatalf("the SDK made %d HTTP calls, want 1", len(calls))
		}
		if v := calls[0].Header.Get("X-Should-Retry"); v != "false" {
			t.Errorf("x-should-retry %q, want false", v)
		}
		if n := g.upstreamCalls(text); n != recipeMaxAttempts {
			t.Errorf("upstream calls = %d, want the gateway's %d", n, recipeMaxAttempts)
		}
	})
}

// TestRecipeAnthropicGo runs the anthropic-sdk-go recipe
// (e2e/recipes/anthropicgo) in process, its retries at the SDK's default.
func TestRecipeAnthropicGo(t *testing.T) {
	anthropicRecipeSuite(t, func(g *anthropicRecipeGateway) anthropicRunner {
		client := anthropicgo.NewClient(g.url, recipeClientKey)
		return func(op, orderID, text string) (recipeResult, error) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var res *http.Response
			var msg anthropic.Message
			var err error
			start := time.Now()
			switch op {
			case "create":
				var m *anthropic.Message
				if m, err = anthropicgo.Summarize(ctx, client, orderID, text, option.WithResponseInto(&res)); m != nil {
					msg = *m
				}
			case "stream":
				msg, err = anthropicgo.SummarizeStream(ctx, client, orderID, text, option.WithResponseInto(&res))
			default:
				return recipeResult{}, fmt.Errorf("unknown op %q", op)
			}
			return anthropicGoResult(msg, res, err, time.Since(start)), nil
		}
	})
}

// anthropicGoResult is what the Go SDK returned, as the drivers report it.
func anthropicGoResult(msg anthropic.Message, res *http.Response, err error, took time.Duration) recipeResult {
	out := recipeResult{Ms: took.Milliseconds()}
	var ae *anthropic.Error
	switch {
	case err == nil:
		raw, _ := json.Marshal(msg)
		out.OK, out.ID, out.Raw = true, msg.ID, string(raw)
		for _, b := range msg.Content {
			out.Content += b.Text
		}
		if res != nil {
			out.Replayed = res.Header.Get("Idempotent-Replayed")
		}
	case errors.As(err, &ae):
		out.Status, out.Type, out.Message = ae.StatusCode, string(ae.Type()), ae.Message
	default:
		out.Message = err.Error()
	}
	return out
}

// anthropicNodeRunner runs a Node driver for the suite's gateway; op
// "create" is the driver's variant "anthropic", "stream" is
// "anthropic-stream".
func anthropicNodeRunner(t *testing.T, dir string) func(g *anthropicRecipeGateway) anthropicRunner {
	return func(g *anthropicRecipeGateway) anthropicRunner {
		d := startNodeDriver(t, dir, "LLMGATE_ANTHROPIC_BASE_URL="+g.url, "LLMGATE_API_KEY="+recipeClientKey)
		return func(op, orderID, text string) (recipeResult, error) {
			variant := map[string]string{"create": "anthropic", "stream": "anthropic-stream"}[op]
			return d.call(variant, orderID, text, "")
		}
	}
}

// TestRecipeAnthropicTS runs the TypeScript SDK recipe
// (recipe_anthropic.mjs), its retries at the SDK's default.
func TestRecipeAnthropicTS(t *testing.T) {
	anthropicRecipeSuite(t, anthropicNodeRunner(t, nodeRecipes(t)))
}

// TestRecipeAnthropicTSIdempotencyKeyOption: the TypeScript SDK's
// `idempotencyKey` request option sends no Idempotency-Key (the client
// names no idempotency header), so two calls with the same one are two
// upstream calls and two answers, neither replayed. The recipe uses
// `headers` instead.
func TestRecipeAnthropicTSIdempotencyKeyOption(t *testing.T) {
	dir := nodeRecipes(t)
	g := startAnthropicRecipeGateway(t)
	d := startNodeDriver(t, dir, "LLMGATE_ANTHROPIC_BASE_URL="+g.url, "LLMGATE_API_KEY="+recipeClientKey)
	text := "an order keyed by the SDK option"
	for range 2 {
		r, err := d.call("anthropic-idempotencykey", "option", text, "")
		if err != nil {
			t.Fatal(err)
		}
		if !r.OK || r.Replayed != "" {
			t.Fatalf("got %+v, want an answer that is not a replay", r)
		}
	}
	if n := g.upstreamCalls(text); n != 2 {
		t.Fatalf("upstream calls = %d, want 2", n)
	}
	for _, c := range g.proxy.callsFor(text) {
		if k := c.Request.Get("Idempotency-Key"); k != "" {
			t.Fatalf("the SDK sent Idempotency-Key %q", k)
		}
	}
}

// TestRecipeAnthropicTSBatchResults: the TypeScript SDK's
// batches.results(id) retrieves the batch and fetches its results_url, an
// absolute URL, with the client's key. The provider's batch names the
// provider; llmgate rewrites it to its own route, so the SDK reads every
// result line through the gateway, the provider gets the results request
// with the upstream's key, and nothing the SDK received names the
// provider's address.
func TestRecipeAnthropicTSBatchResults(t *testing.T) {
	dir := nodeRecipes(t)
	g := startAnthropicRecipeGateway(t)
	d := startNodeDriver(t, dir, "LLMGATE_ANTHROPIC_BASE_URL="+g.url, "LLMGATE_API_KEY="+recipeClientKey)
	r, err := d.call("anthropic-batches", "nightly", "the nightly orders", "")
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK || !strings.HasPrefix(r.ID, "msgbatch_") {
		t.Fatalf("got %+v, want a batch and its results", r)
	}
	if want := "nightly-1,nightly-2,nightly-3"; r.Content != want {
		t.Errorf("the SDK read the results %q, want %q", r.Content, want)
	}
	resultsPath := "/v1/messages/batches/" + r.ID + "/results"
	var held struct {
		Created, Retrieved struct {
			ResultsURL string `json:"results_url"`
		}
	}
	if err := json.Unmarshal([]byte(r.Raw), &held); err != nil {
		t.Fatalf("the driver's raw %q: %v", r.Raw, err)
	}
	if u := g.url + resultsPath; held.Created.ResultsURL != u || held.Retrieved.ResultsURL != u {
		t.Errorf("results_url created %q, retrieved %q, want the gateway's %q", held.Created.ResultsURL, held.Retrieved.ResultsURL, u)
	}

	results := g.proxy.callsWhere(func(c clientCall) bool { return c.Path == resultsPath })
	switch {
	case len(results) != 1 || results[0].Method != http.MethodGet || results[0].Status != http.StatusOK:
		t.Errorf("the gateway saw %d results requests (%+v), want one GET answered 200", len(results), results)
	case bytes.Count(results[0].Answer, []byte("\n")) != 3:
		t.Errorf("the results answer is not 3 lines: %s", results[0].Answer)
	}
	var upstream []fakeprovider.AnthropicRequest
	for _, q := range g.ant.Requests() {
		if q.Path == resultsPath {
			upstream = append(upstream, q)
		}
	}
	if len(upstream) != 1 {
		t.Errorf("the provider got %d results requests, want 1", len(upstream))
	}
	for _, q := range g.ant.Requests() {
		if q.Header.Get("X-Api-Key") != anthropicUpstreamKey || strings.Contains(fmt.Sprint(q.Header), recipeClientKey) {
			t.Errorf("the provider got %s %s with x-api-key %q and headers %v", q.Method, q.Path, q.Header.Get("X-Api-Key"), q.Header)
		}
	}

	all := g.proxy.callsWhere(func(clientCall) bool { return true })
	if len(all) != 4 { // create, retrieve, and results()'s retrieve and GET
		t.Errorf("the SDK made %d calls through the gateway, want 4", len(all))
	}
	fake := strings.TrimPrefix(g.upstream, "http://")
	for _, c := range all {
		if bytes.Contains(c.Answer, []byte(fake)) {
			t.Errorf("%s %s answered the provider's address %s: %s", c.Method, c.Path, fake, c.Answer)
		}
	}
	if strings.Contains(r.Raw, fake) {
		t.Errorf("the SDK holds the provider's address %s: %s", fake, r.Raw)
	}
}
