package tracing

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmgate/llmgate/classify"
)

// AttemptStart describes an upstream attempt as it starts.
type AttemptStart struct {
	Upstream string
	// Host is the upstream base_url's host[:port]; HTTPS says which port
	// an absent one is.
	Host  string
	HTTPS bool
	// Path is the upstream path after base_url ("/chat/completions").
	Path   string
	Model  string
	Stream bool
	// N counts attempts at this upstream, from 1.
	N int
	// Backoff is what the retry loop waited before this attempt.
	Backoff time.Duration
}

// Attempt is one upstream attempt's CLIENT span. Its zero value — tracing
// off, or a request that is not sampled — does nothing. It is not safe for
// concurrent use: one attempt is one goroutine's.
type Attempt struct {
	span   trace.Span // nil when not recording
	parent trace.Span
	// answer gathers a stream's model, finish reasons and usage.
	answer *answer
	// anthropic: its answers are Anthropic's Messages (see answer).
	anthropic bool
}

// StartAttempt begins the span of an attempt, as a child of the request's
// span in ctx, and returns ctx with it (Inject writes it upstream). When
// the request's span is not recording (tracing off, not sampled) it starts
// nothing: ctx keeps the request's span context, so an internal upstream
// still learns the sampling decision.
func (t *Tracer) StartAttempt(ctx context.Context, a AttemptStart) (context.Context, Attempt) {
	if t == nil {
		return ctx, Attempt{}
	}
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, Attempt{}
	}
	attrs := make([]attribute.KeyValue, 0, 12)
	name := "POST"
	if op, ok := operation(a.Path); ok {
		attrs = append(attrs, op)
		name = op.Value.AsString()
		if a.Model != "" {
			name += " " + a.Model
		}
	}
	attrs = append(attrs, provider(a.Path), UpstreamKey.String(a.Upstream), AttemptKey.Int(a.N))
	attrs = appendNonEmpty(attrs, semconv.GenAIRequestModelKey, a.Model)
	if a.Stream {
		attrs = append(attrs, semconv.GenAIRequestStream(true))
	}
	if host, port := serverAddress(a.Host, a.HTTPS); host != "" {
		attrs = append(attrs, semconv.ServerAddress(host), semconv.ServerPort(port))
	}
	if a.N > 1 {
		attrs = append(attrs, semconv.HTTPRequestResendCount(a.N-1), BackoffKey.Float64(a.Backoff.Seconds()))
	}
	ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	at := Attempt{span: span, parent: parent, anthropic: anthropicPath(a.Path)}
	if a.Stream {
		at.answer = &answer{anthropic: at.anthropic}
	}
	return ctx, at
}

func serverAddress(hostport string, https bool) (string, int) {
	host, p, err := net.SplitHostPort(hostport)
	if err != nil {
		host, p = hostport, "80"
		if https {
			p = "443"
		}
	}
	port, _ := strconv.Atoi(p)
	return host, port
}

// Recording reports whether the attempt has a span to write to.
func (a *Attempt) Recording() bool { return a.span != nil }

// Observe reads one stream event's data (without "data: ") for the
// answer's model, finish reasons and token usage.
func (a *Attempt) Observe(data []byte) {
	if a.answer != nil && a.span != nil {
		a.answer.observe(data)
	}
}

// End records how the attempt came out and ends its span; later calls do
// nothing. body, a buffered 2xx answer (nil for a stream, whose events
// Observe saw), is read for the model, finish reasons and token usage;
// when the attempt is the request's answer (success, content filtered or
// empty — not a failure to retry) they go on the request's span too.
func (a *Attempt) End(status int, o classify.Outcome, body []byte) {
	span := a.span
	if span == nil {
		return
	}
	a.span = nil
	attrs := make([]attribute.KeyValue, 0, 10)
	if status != 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCode(status))
	}
	if o.Class != "" {
		attrs = append(attrs, OutcomeKey.String(string(o.Class)))
		attrs = appendNonEmpty(attrs, ReasonKey, o.Reason)
	}
	answered := o.Class == classify.Success || o.Class == classify.ContentFilter || o.Class == classify.Empty
	if o.Class != "" && !answered {
		attrs = append(attrs, semconv.ErrorTypeKey.String(string(o.Class)))
		span.SetStatus(codes.Error, o.Reason)
	}
	ans := a.answer
	if ans == nil && status >= 200 && status <= 299 && body != nil {
		ans = &answer{anthropic: a.anthropic}
		ans.read(body)
	}
	if ans != nil {
		got := ans.attributes()
		attrs = append(attrs, got...)
		if answered && len(got) > 0 {
			a.parent.SetAttributes(got...)
		}
	}
	span.SetAttributes(attrs...)
	span.End()
}

// Inject writes ctx's trace context (the attempt's span, or the request's
// when the attempt has none) as a W3C traceparent (and tracestate) into h.
// It writes nothing when ctx holds no span context, e.g. with tracing off.
func Inject(ctx context.Context, h http.Header) {
	traceContext.Inject(ctx, propagation.HeaderCarrier(h))
}
