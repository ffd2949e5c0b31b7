package tracing

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmgate/llmgate/classify"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/tracing/receivertest"
)

func attrMap(kvs []attribute.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}

func TestAnswerJSON(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		want map[string]string
	}{
		{"chat", `{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o-2024-08-06","choices":[` +
			`{"index":0,"message":{"role":"assistant","content":"the secret answer"},"finish_reason":"stop"},` +
			`{"index":1,"message":{"role":"assistant","content":"x"},"finish_reason":"length"}],` +
			`"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}`,
			map[string]string{"gen_ai.response.id": "chatcmpl-1", "gen_ai.response.model": "gpt-4o-2024-08-06",
				"gen_ai.response.finish_reasons": `["stop","length"]`, "gen_ai.usage.input_tokens": "12", "gen_ai.usage.output_tokens": "34"}},
		{"text completion", `{"id":"cmpl-1","object":"text_completion","model":"gpt-3.5-turbo-instruct",` +
			`"choices":[{"text":"hi","index":0,"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`,
			map[string]string{"gen_ai.response.id": "cmpl-1", "gen_ai.response.model": "gpt-3.5-turbo-instruct", "gen_ai.response.finish_reasons": `["stop"]`,
				"gen_ai.usage.input_tokens": "3", "gen_ai.usage.output_tokens": "1"}},
		{"embeddings", `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,-0.2]}],` +
			`"model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}`,
			map[string]string{"gen_ai.response.model": "text-embedding-3-small", "gen_ai.usage.input_tokens": "8"}},
		{"escaped keys and values", `{"mod\u0065l":"gpt-\u0034o","usage":{"prompt_tokens":1}}`,
			map[string]string{"gen_ai.response.model": "gpt-4o", "gen_ai.usage.input_tokens": "1"}},
		{"cut short keeps what came before", `{"model":"gpt-4o","choices":[{"index":0,"message":{"content":"abc`,
			map[string]string{"gen_ai.response.model": "gpt-4o"}},
		{"nonsense", `{"model":7,"usage":{"prompt_tokens":-1,"completion_tokens":"3"},"choices":{}}`, map[string]string{}},
		{"a model name too long is left out", `{"model":"` + strings.Repeat("m", maxNameBytes+1) + `"}`, map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a answer
			a.read([]byte(tc.body))
			if got := attrMap(a.attributes()); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got %v\nwant %v", got, tc.want)
			}
		})
	}
}

func TestAnswerStream(t *testing.T) {
	var a answer
	for _, ev := range []string{
		`{"id":"chatcmpl-9","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}],"usage":null}`,
		`{"id":"chatcmpl-9","model":"gpt-4o-mini","choices":[{"index":1,"delta":{"content":"the secret"},"finish_reason":null}],"usage":null}`,
		`{"id":"chatcmpl-9","model":"gpt-4o-mini","choices":[{"index":1,"delta":{},"finish_reason":"length"}],"usage":null}`,
		` {"id":"chatcmpl-9","model":"gpt-4o-mini","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
		`{"id":"chatcmpl-9","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`,
		`[DONE]`, ``,
	} {
		a.observe([]byte(ev))
	}
	want := map[string]string{"gen_ai.response.id": "chatcmpl-9", "gen_ai.response.model": "gpt-4o-mini",
		"gen_ai.response.finish_reasons": `["stop","length"]`, "gen_ai.usage.input_tokens": "5", "gen_ai.usage.output_tokens": "7"}
	if got := attrMap(a.attributes()); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
}

func TestTracesURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://collector:4318":            "http://collector:4318/v1/traces",
		"http://collector:4318/":           "http://collector:4318/v1/traces",
		"https://x/otlp/v1/traces":         "https://x/otlp/v1/traces",
		"http://collector:4318/custom":     "http://collector:4318/custom",
		"http://collector:4318?tenant=a":   "http://collector:4318/v1/traces?tenant=a",
		"http://u:p@collector:4318/traces": "http://u:p@collector:4318/traces",
	} {
		if got := tracesURL(in); got != want {
			t.Errorf("tracesURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestServerAddress(t *testing.T) {
	for _, tc := range []struct {
		host  string
		https bool
		want  string
	}{
		{"api.openai.com", true, "api.openai.com:443"},
		{"vllm.internal", false, "vllm.internal:80"},
		{"127.0.0.1:8000", false, "127.0.0.1:8000"},
		{"[::1]:8443", true, "::1:8443"},
	} {
		h, p := serverAddress(tc.host, tc.https)
		if got := fmt.Sprintf("%s:%d", h, p); got != tc.want {
			t.Errorf("serverAddress(%q, %v) = %s, want %s", tc.host, tc.https, got, tc.want)
		}
	}
}

// Tracing off is a nil Tracer: every call is safe and does nothing.
func TestOff(t *testing.T) {
	tr, err := Setup(config.Tracing{SampleRatio: 1}, nil)
	if err != nil || tr != nil {
		t.Fatalf("Setup with no endpoint = %v, %v; want nil, nil", tr, err)
	}
	if New(Options{}) != nil {
		t.Fatal("New with no provider is not nil")
	}
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	r.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	r2, span := tr.Start(r, "/v1/chat/completions")
	if r2 != r || span != nil {
		t.Fatal("Start with tracing off changed the request")
	}
	End(span, Request{})
	ctx, at := tr.StartAttempt(context.Background(), AttemptStart{Path: "/chat/completions", N: 1})
	if at.Recording() || trace.SpanContextFromContext(ctx).IsValid() {
		t.Fatal("an attempt span with tracing off")
	}
	at.Observe([]byte(`{"model":"x"}`))
	at.End(200, classify.Outcome{Class: classify.Success}, []byte(`{"model":"x"}`))
	h := http.Header{}
	Inject(ctx, h)
	if len(h) != 0 {
		t.Errorf("Inject with tracing off wrote %v", h)
	}
	BreakerRejected(ctx, "a", 0)
	Fallback(ctx, "a", "b")
	RetryBudgetExhausted(ctx, "a")
	tr.Close()
}

// Setup's exporter speaks OTLP/HTTP protobuf to the endpoint; Close
// flushes what the batch processor holds.
func TestSetupExportsAndCloseFlushes(t *testing.T) {
	rec := receivertest.New(t)
	tr, err := Setup(config.Tracing{Endpoint: rec.URL, SampleRatio: 1, TrustClientContext: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, "/v1/embeddings", nil)
	r, span := tr.Start(r, "/v1/embeddings")
	ctx, at := tr.StartAttempt(r.Context(), AttemptStart{Upstream: "a", Host: "api.example.com", HTTPS: true,
		Path: "/embeddings", Model: "text-embedding-3-small", N: 2, Backoff: 1500 * 1e6})
	h := http.Header{}
	Inject(ctx, h)
	at.End(429, classify.Outcome{Class: classify.RateLimited, Reason: "status 429"}, []byte(`{"model":"nope"}`))
	End(span, Request{RequestID: "r", Status: 503, Class: "rate_limited", Attempts: 2})
	tr.Close()

	spans := rec.Spans()
	if len(spans) != 2 {
		t.Fatalf("%d spans received, want 2", len(spans))
	}
	a, s := spans[0], spans[1]
	if a.ParentSpanID != s.SpanID || a.TraceID != s.TraceID {
		t.Errorf("attempt %s/%s is not a child of %s/%s", a.TraceID, a.ParentSpanID, s.TraceID, s.SpanID)
	}
	if want := "00-" + a.TraceID + "-" + a.SpanID + "-01"; h.Get("Traceparent") != want {
		t.Errorf("injected %q, want %q", h.Get("Traceparent"), want)
	}
	if a.Name != "embeddings text-embedding-3-small" || a.Attrs["server.port"] != int64(443) ||
		a.Attrs["llmgate.backoff"] != 1.5 || a.Attrs["http.request.resend_count"] != int64(1) || a.Attrs["error.type"] != "rate_limited" {
		t.Errorf("attempt span %q %v", a.Name, a.Attrs)
	}
	if _, ok := a.Attrs["gen_ai.response.model"]; ok {
		t.Error("a 429's body was read as an answer")
	}
	if s.Attrs["error.type"] != "rate_limited" || s.StatusCode != 2 /* error */ || s.Attrs["gen_ai.operation.name"] != "embeddings" {
		t.Errorf("request span %v status %v", s.Attrs, s.StatusCode)
	}
}
