package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/llmgate/llmgate/cache"
	badgerstore "github.com/llmgate/llmgate/cache/badger"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway/idempotency"
	"github.com/llmgate/llmgate/gateway/tracing"
	"github.com/llmgate/llmgate/gateway/tracing/receivertest"
)

// tracedHarness is a harness whose gateway exports its spans over
// OTLP/HTTP to an in-process receiver, built by tracing.Setup from the
// config as the binary builds it, plus a second fake upstream, "inner",
// marked internal.
type tracedHarness struct {
	*harness
	rec    *receivertest.Receiver
	tracer *tracing.Tracer
	inner  *fakeprovider.Server
}

const (
	traceClientKey = "sk-client-alice-0123456789"
	// tracePrompt and traceIdemKey must never appear in a span.
	tracePrompt  = "zebra-prompt-7731 about the quarterly numbers"
	traceIdemKey = "order-4711/secret-idem-key"
	innerModel   = "inner-llama"
)

func newTracedHarness(t *testing.T, mutate func(c *config.Config)) *tracedHarness {
	t.Helper()
	return newTracedHarnessStore(t, mutate, nil)
}

// newTracedHarnessStore is newTracedHarness with the store wrapped by wrap.
func newTracedHarnessStore(t *testing.T, mutate func(c *config.Config), wrap func(Store) Store) *tracedHarness {
	t.Helper()
	th := &tracedHarness{rec: receivertest.New(t), inner: fakeprovider.New(fakeprovider.Options{})}
	innerSrv := httptest.NewServer(th.inner)
	t.Cleanup(innerSrv.Close)
	t.Cleanup(th.inner.Close)
	var tr *tracing.Tracer
	h := newHarnessOptions(t, func(c *config.Config) {
		// No path: Setup adds /v1/traces, as it does for the operator.
		c.Tracing.Endpoint = th.rec.Base
		c.Clients = []config.Client{{Name: "alice", Key: traceClientKey}}
		c.Upstreams = append(c.Upstreams, config.Upstream{Name: "inner", BaseURL: innerSrv.URL + "/v1",
			Models: []string{innerModel}, Timeout: config.Duration(5 * time.Second), Internal: true})
		if mutate != nil {
			mutate(c)
		}
	}, wrap, fakeprovider.Options{}, func(o *Options) {
		var err error
		if tr, err = tracing.Setup(o.Config.Tracing, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(tr.Close)
		o.Tracer = tr
	})
	th.harness, th.tracer = h, tr
	return th
}

// spans ends the traffic and returns what was exported: closing the
// gateway's server waits for every handler to return (its request span
// ends in a defer), and closing the tracer flushes the batch processor.
func (th *tracedHarness) spans() []receivertest.Span {
	th.t.Helper()
	th.srv.Close()
	th.tracer.Close()
	spans := th.rec.Spans()
	assertNoSecrets(th.t, spans, tracePrompt, traceIdemKey, traceClientKey, upstreamKey, adminToken,
		"simulated upstream" /* the completion's content */, "Bearer")
	return spans
}

// assertNoSecrets fails if any string of any span contains a secret.
func assertNoSecrets(t *testing.T, spans []receivertest.Span, secrets ...string) {
	t.Helper()
	for _, s := range spans {
		for _, v := range s.Strings() {
			for _, secret := range secrets {
				if strings.Contains(v, secret) {
					t.Errorf("span %q carries %q in %q", s.Name, secret, v)
				}
			}
		}
	}
}

func (th *tracedHarness) post(path, body, requestID string, hdr map[string]string) result {
	th.t.Helper()
	all := map[string]string{"Authorization": "Bearer " + traceClientKey, "X-Request-Id": requestID}
	for k, v := range hdr {
		all[k] = v
	}
	return th.do(http.MethodPost, path, body, all)
}

// requestSpan is the SERVER span of the request with that id.
func requestSpan(t *testing.T, spans []receivertest.Span, id string) receivertest.Span {
	t.Helper()
	for _, s := range spans {
		if s.Kind == tracepb.Span_SPAN_KIND_SERVER && s.Attrs["llmgate.request_id"] == id {
			return s
		}
	}
	t.Fatalf("no request span for %s among %d spans", id, len(spans))
	return receivertest.Span{}
}

// children are the spans whose parent is s, in export order.
func children(spans []receivertest.Span, s receivertest.Span) []receivertest.Span {
	var out []receivertest.Span
	for _, c := range spans {
		if c.ParentSpanID == s.SpanID && c.TraceID == s.TraceID {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b receivertest.Span) int {
		return int(a.Attrs["llmgate.attempt"].(int64) - b.Attrs["llmgate.attempt"].(int64))
	})
	return out
}

// wantAttrs checks that s has each attribute with the value given.
func wantAttrs(t *testing.T, s receivertest.Span, want map[string]any) {
	t.Helper()
	for k, v := range want {
		if got, ok := s.Attrs[k]; !ok || fmt.Sprint(got) != fmt.Sprint(v) {
			t.Errorf("span %q (%s): %s = %v, want %v; all: %v", s.Name, s.Attrs["llmgate.request_id"], k, got, v, s.Attrs)
		}
	}
}

func noAttrs(t *testing.T, s receivertest.Span, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if v, ok := s.Attrs[k]; ok {
			t.Errorf("span %q: %s = %v, want none", s.Name, k, v)
		}
	}
}

func positiveInt(t *testing.T, s receivertest.Span, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if n, ok := s.Attrs[k].(int64); !ok || n <= 0 {
			t.Errorf("span %q: %s = %v, want a positive count", s.Name, k, s.Attrs[k])
		}
	}
}

const clientTraceID, clientSpanID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"

var clientTraceparent = "00-" + clientTraceID + "-" + clientSpanID + "-01"

func traceChat(model, extra string) string {
	return `{"model":"` + model + `",` + extra + `"messages":[{"role":"user","content":"` + tracePrompt + `"}]}`
}

// One scripted run through the real gateway: a keyed call retried once
// (the client's traceparent continued), its replay and a reuse with
// another body, a stream and an embedding on the internal upstream and
// the public one, and a call whose primary's breaker is open. The spans
// the receiver decoded say all of it, and carry no secret and no content.
func TestTracesOverOTLP(t *testing.T) {
	th := newTracedHarness(t, func(c *config.Config) { c.Upstreams[0].Fallbacks = []string{"inner"} })
	th.fake.Enqueue(fakeprovider.Step{Status: http.StatusServiceUnavailable})
	keyed := map[string]string{"Idempotency-Key": traceIdemKey, "Traceparent": clientTraceparent}
	if r := th.post("/v1/chat/completions", traceChat("gpt-4o-mini", ""), "req-keyed", keyed); r.status != 200 {
		t.Fatalf("keyed call: %d %s", r.status, r.body)
	}
	if r := th.post("/v1/chat/completions", traceChat("gpt-4o-mini", ""), "req-replay", keyed); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %v", r.status, r.header)
	}
	if r := th.post("/v1/chat/completions", traceChat("gpt-4o", ""), "req-mismatch", keyed); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("mismatch: %d %s", r.status, r.body)
	}
	stream := traceChat(innerModel, `"stream":true,"stream_options":{"include_usage":true},`)
	if r := th.post("/v1/chat/completions", stream, "req-stream", map[string]string{"Traceparent": clientTraceparent}); r.status != 200 {
		t.Fatalf("stream: %d %s", r.status, r.body)
	}
	emb := `{"model":"text-embedding-3-small","input":"` + tracePrompt + `"}`
	if r := th.post("/v1/embeddings", emb, "req-embed", nil); r.status != 200 {
		t.Fatalf("embeddings: %d %s", r.status, r.body)
	}
	if r := th.admin(http.MethodPost, "/admin/breakers/primary/open"); r.status != 200 {
		t.Fatalf("forcing the breaker open: %d", r.status)
	}
	if r := th.post("/v1/chat/completions", traceChat("gpt-4o-mini", ""), "req-open", nil); r.status != 200 || r.header.Get("X-Llmgate-Upstream") != "inner" {
		t.Fatalf("breaker open, fallback: %d %v %s", r.status, r.header, r.body)
	}
	spans := th.spans()

	t.Run("keyed call, retried once, continues the client's trace", func(t *testing.T) {
		s := requestSpan(t, spans, "req-keyed")
		if s.TraceID != clientTraceID || s.ParentSpanID != clientSpanID {
			t.Errorf("trace %s parent %s, want the client's %s %s", s.TraceID, s.ParentSpanID, clientTraceID, clientSpanID)
		}
		if s.Name != "POST /v1/chat/completions" {
			t.Errorf("name %q", s.Name)
		}
		wantAttrs(t, s, map[string]any{
			"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
			"gen_ai.request.model": "gpt-4o-mini", "gen_ai.response.model": "gpt-4o-mini",
			"gen_ai.response.finish_reasons": []any{"stop"},
			"llmgate.upstream":               "primary", "llmgate.outcome": "success", "llmgate.attempts": 2,
			"llmgate.idempotency.event": "commit", "llmgate.idempotency.key_hash": idempotency.HashKey(cache.Key{Scope: "alice", ID: traceIdemKey}),
			"llmgate.client": "alice", "http.response.status_code": 200, "http.route": "/v1/chat/completions",
		})
		positiveInt(t, s, "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")
		if s.Scope != tracing.ScopeName || s.Resource["service.name"] != "llmgate" {
			t.Errorf("scope %q, resource %v", s.Scope, s.Resource)
		}
		att := children(spans, s)
		if len(att) != 2 {
			t.Fatalf("%d attempt spans, want 2: %+v", len(att), att)
		}
		for _, a := range att {
			if a.Kind != tracepb.Span_SPAN_KIND_CLIENT || a.Name != "chat gpt-4o-mini" {
				t.Errorf("attempt span %q kind %v", a.Name, a.Kind)
			}
			wantAttrs(t, a, map[string]any{"llmgate.upstream": "primary", "gen_ai.provider.name": "openai",
				"gen_ai.request.model": "gpt-4o-mini", "server.address": "127.0.0.1"})
		}
		wantAttrs(t, att[0], map[string]any{"llmgate.attempt": 1, "llmgate.outcome": "transient",
			"error.type": "transient", "http.response.status_code": 503, "llmgate.reason": "status 503"})
		if att[0].StatusCode != tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("failed attempt's status %v", att[0].StatusCode)
		}
		noAttrs(t, att[0], "llmgate.backoff", "gen_ai.response.model")
		wantAttrs(t, att[1], map[string]any{"llmgate.attempt": 2, "http.request.resend_count": 1,
			"llmgate.outcome": "success", "gen_ai.response.model": "gpt-4o-mini"})
		// The wait the retry loop chose: full jitter in [0, retry.max_delay].
		if b, ok := att[1].Attrs["llmgate.backoff"].(float64); !ok || b < 0 || b > th.cfg.Retry.MaxDelay.D().Seconds() {
			t.Errorf("llmgate.backoff = %v", att[1].Attrs["llmgate.backoff"])
		}
		positiveInt(t, att[1], "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")
	})

	t.Run("replay and mismatch", func(t *testing.T) {
		s := requestSpan(t, spans, "req-replay")
		wantAttrs(t, s, map[string]any{"llmgate.idempotency.event": "replay", "llmgate.upstream": "primary",
			"llmgate.outcome": "replayed", "http.response.status_code": 200})
		// No tokens were spent on a replay.
		noAttrs(t, s, "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "llmgate.attempts")
		if c := children(spans, s); len(c) != 0 {
			t.Errorf("a replay has %d attempt spans", len(c))
		}
		s = requestSpan(t, spans, "req-mismatch")
		wantAttrs(t, s, map[string]any{"llmgate.idempotency.event": "mismatch", "http.response.status_code": 422,
			"error.type": "idempotency_mismatch"})
		if s.StatusCode == tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("a 422 marks the server span an error")
		}
	})

	t.Run("stream to an internal upstream carries traceparent", func(t *testing.T) {
		s := requestSpan(t, spans, "req-stream")
		wantAttrs(t, s, map[string]any{"gen_ai.operation.name": "chat", "gen_ai.response.model": innerModel,
			"gen_ai.response.finish_reasons": []any{"stop"}, "llmgate.upstream": "inner"})
		positiveInt(t, s, "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")
		att := children(spans, s)
		if len(att) != 1 {
			t.Fatalf("%d attempt spans, want 1", len(att))
		}
		wantAttrs(t, att[0], map[string]any{"gen_ai.request.stream": true, "llmgate.outcome": "success",
			"gen_ai.response.model": innerModel})
		positiveInt(t, att[0], "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")
		want := "00-" + clientTraceID + "-" + att[0].SpanID + "-01"
		if got := innerHeader(th.inner, 0, "Traceparent"); got != want {
			t.Errorf("inner upstream got traceparent %q, want %q (the attempt's span)", got, want)
		}
	})

	t.Run("embeddings", func(t *testing.T) {
		s := requestSpan(t, spans, "req-embed")
		wantAttrs(t, s, map[string]any{"gen_ai.operation.name": "embeddings", "gen_ai.request.model": "text-embedding-3-small",
			"http.route": "/v1/embeddings"})
		positiveInt(t, s, "gen_ai.usage.input_tokens")
		noAttrs(t, s, "gen_ai.usage.output_tokens", "gen_ai.response.finish_reasons")
	})

	t.Run("breaker rejection and fallback are events", func(t *testing.T) {
		s := requestSpan(t, spans, "req-open")
		var names []string
		for _, e := range s.Events {
			names = append(names, e.Name)
		}
		if !slices.Equal(names, []string{tracing.EventBreakerRejected, tracing.EventFallback}) {
			t.Fatalf("events %v", names)
		}
		if e := s.Events[0]; e.Attrs["llmgate.upstream"] != "primary" {
			t.Errorf("rejection event %v", e.Attrs)
		}
		if e := s.Events[1]; e.Attrs["llmgate.fallback.from"] != "primary" || e.Attrs["llmgate.fallback.to"] != "inner" {
			t.Errorf("fallback event %v", e.Attrs)
		}
		wantAttrs(t, s, map[string]any{"llmgate.upstream": "inner", "llmgate.outcome": "success"})
		if att := children(spans, s); len(att) != 1 || att[0].Attrs["llmgate.upstream"] != "inner" {
			t.Errorf("attempts %+v", att)
		}
	})

	t.Run("a public upstream gets no trace context", func(t *testing.T) {
		reqs := th.fake.Requests()
		if len(reqs) < 3 {
			t.Fatalf("primary saw %d requests", len(reqs))
		}
		for _, r := range reqs {
			for _, h := range []string{"Traceparent", "Tracestate"} {
				if v := r.Header.Get(h); v != "" {
					t.Errorf("public upstream got %s: %s", h, v)
				}
			}
		}
	})
}

func innerHeader(s *fakeprovider.Server, i int, name string) string {
	reqs := s.Requests()
	if i >= len(reqs) {
		return ""
	}
	return reqs[i].Header.Get(name)
}

// With trust_client_context false a client's traceparent starts nothing:
// the request gets a trace of its own, linked to the client's, and the
// internal upstream gets the gateway's trace.
func TestTraceUntrustedClientContextIsLinked(t *testing.T) {
	th := newTracedHarness(t, func(c *config.Config) { c.Tracing.TrustClientContext = false })
	if r := th.post("/v1/chat/completions", traceChat(innerModel, ""), "req-linked",
		map[string]string{"Traceparent": clientTraceparent}); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	spans := th.spans()
	s := requestSpan(t, spans, "req-linked")
	if s.TraceID == clientTraceID || s.ParentSpanID != "" {
		t.Errorf("trace %s parent %q: the client's context was continued", s.TraceID, s.ParentSpanID)
	}
	if len(s.Links) != 1 || s.Links[0].TraceID != clientTraceID || s.Links[0].SpanID != clientSpanID {
		t.Errorf("links %+v, want one to the client's span", s.Links)
	}
	att := children(spans, s)
	if len(att) != 1 {
		t.Fatalf("%d attempts", len(att))
	}
	if got, want := innerHeader(th.inner, 0, "Traceparent"), "00-"+s.TraceID+"-"+att[0].SpanID+"-01"; got != want {
		t.Errorf("inner upstream got traceparent %q, want %q", got, want)
	}
}

// A trace not sampled (sample_ratio 0) exports nothing, and an internal
// upstream still learns the decision.
func TestTraceNotSampled(t *testing.T) {
	th := newTracedHarness(t, func(c *config.Config) { c.Tracing.SampleRatio = 0 })
	if r := th.post("/v1/chat/completions", traceChat(innerModel, ""), "req-unsampled", nil); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if spans := th.spans(); len(spans) != 0 {
		t.Errorf("%d spans exported, want none", len(spans))
	}
	if tp := innerHeader(th.inner, 0, "Traceparent"); !strings.HasPrefix(tp, "00-") || !strings.HasSuffix(tp, "-00") {
		t.Errorf("inner upstream got traceparent %q, want one with the sampled flag off", tp)
	}
}

// A keyed request that finds its key in flight waits: for the answer
// (event wait), until its own deadline (wait too), or past
// idempotency.wait_timeout (conflict). The first call is held at the
// upstream until the second has had its turn.
func TestTraceIdempotencyWaits(t *testing.T) {
	for _, tc := range []struct {
		name        string
		waitTimeout time.Duration
		hdr         map[string]string
		status      int
		event       string
	}{
		{"replayed after waiting", 10 * time.Second, nil, 200, "wait"},
		{"client deadline while waiting", 10 * time.Second, map[string]string{DeadlineHeader: "50ms"}, http.StatusGatewayTimeout, "wait"},
		{"conflict", 50 * time.Millisecond, nil, http.StatusConflict, "conflict"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			arrived, release := make(chan struct{}, 1), make(chan struct{})
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				arrived <- struct{}{}
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o-mini",` +
					`"choices":[{"index":0,"message":{"role":"assistant","content":"fine"},"finish_reason":"stop"}],` +
					`"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}`))
			}))
			t.Cleanup(up.Close)
			waiting := make(chan struct{}, 1)
			th := newTracedHarnessStore(t, func(c *config.Config) {
				c.Upstreams[0].BaseURL = up.URL + "/v1"
				c.Idempotency.WaitTimeout = config.Duration(tc.waitTimeout)
			}, func(s Store) Store { return &waitSignal{Store: s, waiting: waiting} })
			keyed := map[string]string{"Authorization": "Bearer " + traceClientKey, "Idempotency-Key": traceIdemKey}
			first := make(chan asyncResult, 1)
			go func() {
				r, err := th.try(http.MethodPost, "/v1/chat/completions", traceChat("gpt-4o-mini", ""),
					merge(keyed, map[string]string{"X-Request-Id": "req-first"}))
				first <- asyncResult{r, err}
			}()
			<-arrived // the first holds the key
			second := make(chan asyncResult, 1)
			go func() {
				r, err := th.try(http.MethodPost, "/v1/chat/completions", traceChat("gpt-4o-mini", ""),
					merge(keyed, tc.hdr, map[string]string{"X-Request-Id": "req-second"}))
				second <- asyncResult{r, err}
			}()
			var r2 result
			if tc.status == 200 {
				<-waiting // the second waits for the first's commit
				close(release)
				r2 = th.await(second)
			} else {
				r2 = th.await(second)
				close(release)
			}
			if r1 := th.await(first); r1.status != 200 {
				t.Fatalf("first: %d %s", r1.status, r1.body)
			}
			if r2.status != tc.status {
				t.Fatalf("second: %d %s, want %d", r2.status, r2.body, tc.status)
			}
			spans := th.spans()
			wantAttrs(t, requestSpan(t, spans, "req-first"), map[string]any{"llmgate.idempotency.event": "commit"})
			s := requestSpan(t, spans, "req-second")
			wantAttrs(t, s, map[string]any{"llmgate.idempotency.event": tc.event, "http.response.status_code": tc.status})
			noAttrs(t, s, "gen_ai.usage.input_tokens")
		})
	}
}

// waitSignal tells a test when a request starts waiting for a key in
// flight.
type waitSignal struct {
	Store
	waiting chan struct{}
}

func (w *waitSignal) Wait(ctx context.Context, k cache.Key) error {
	select {
	case w.waiting <- struct{}{}:
	default:
	}
	return w.Store.Wait(ctx, k)
}

func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// BenchmarkTracing is the request path, handler to upstream and back (a
// real loopback upstream; no client connection), with tracing off, on, and
// on but not sampled, for a JSON answer and a stream. "on" counts the SDK
// and the OTLP export (to an endpoint that discards the batches), which
// run beside the requests on the same cores.
func BenchmarkTracing(b *testing.B) {
	for _, mode := range []string{"off", "on", "unsampled"} {
		for _, body := range []struct{ name, body string }{{"json", chatBody}, {"stream", streamBody}} {
			b.Run(mode+"/"+body.name, func(b *testing.B) {
				up := httptest.NewServer(fakeprovider.New(fakeprovider.Options{KeepRequests: -1}))
				defer up.Close()
				cfg := testConfig(up.URL)
				cfg.DataDir = b.TempDir()
				var tr *tracing.Tracer
				if mode != "off" {
					sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						_, _ = io.Copy(io.Discard, r.Body)
					}))
					defer sink.Close()
					cfg.Tracing.Endpoint = sink.URL
					if mode == "unsampled" {
						cfg.Tracing.SampleRatio = 0
					}
					var err error
					if tr, err = tracing.Setup(cfg.Tracing, nil); err != nil {
						b.Fatal(err)
					}
					defer tr.Close()
				}
				store, err := badgerstore.Open(badgerstore.Options{Dir: cfg.DataDir})
				if err != nil {
					b.Fatal(err)
				}
				defer store.Close()
				gw, err := New(Options{Config: cfg, Store: store, Tracer: tr})
				if err != nil {
					b.Fatal(err)
				}
				defer gw.Close()
				h := gw.Handler()
				b.ReportAllocs()
				for b.Loop() {
					req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body.body))
					req.Header.Set("Content-Type", "application/json")
					w := httptest.NewRecorder()
					h.ServeHTTP(w, req)
					if w.Code != http.StatusOK {
						b.Fatalf("status %d: %s", w.Code, w.Body)
					}
				}
			})
		}
	}
}
