package tracing

import (
	"context"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"
)

// llmgate's own attributes.
const (
	// UpstreamKey: the upstream that served the request, or that an attempt
	// went to.
	UpstreamKey = attribute.Key("llmgate.upstream")
	// OutcomeKey: the class the request's log line says (success,
	// transient, client_limited, ...), or an attempt's class.
	OutcomeKey = attribute.Key("llmgate.outcome")
	// ReasonKey: an attempt's structural reason ("status 503",
	// "connection refused"); never upstream message text.
	ReasonKey = attribute.Key("llmgate.reason")
	// AttemptsKey: attempts at the serving upstream (as the log line).
	AttemptsKey = attribute.Key("llmgate.attempts")
	// AttemptKey: which attempt at its upstream a span is, from 1.
	AttemptKey = attribute.Key("llmgate.attempt")
	// BackoffKey: seconds waited before this attempt (a backoff or the
	// upstream's Retry-After).
	BackoffKey = attribute.Key("llmgate.backoff")
	// IdempotencyEventKey: what a keyed request's claim came to (see
	// Request.IdempotencyEvent).
	IdempotencyEventKey = attribute.Key("llmgate.idempotency.event")
	// IdempotencyKeyHashKey: the Idempotency-Key hashed as the log writes
	// it; never the key.
	IdempotencyKeyHashKey = attribute.Key("llmgate.idempotency.key_hash")
	// CacheKey: hit, miss or unavailable for content-keyed caching.
	CacheKey     = attribute.Key("llmgate.cache")
	RequestIDKey = attribute.Key("llmgate.request_id")
	// ClientKey: the configured client name; never its key.
	ClientKey  = attribute.Key("llmgate.client")
	AbortedKey = attribute.Key("llmgate.aborted")
)

// Span events.
const (
	// EventBreakerRejected: an upstream's open breaker refused the call.
	EventBreakerRejected = "llmgate.breaker.rejected"
	// EventFallback: the call moved on to the next upstream of its chain.
	EventFallback = "llmgate.fallback"
	// EventRetryBudget: the retry budget denied a retry.
	EventRetryBudget = "llmgate.retry.budget_exhausted"
)

// provider is gen_ai.provider.name for a path under /v1 (or an upstream's
// suffix): the API llmgate speaks there, anthropic on Anthropic's Messages
// paths and openai on every other, whoever the upstream is — the
// convention names the API flavour "as identified by the instrumentation"
// (server.address and the models tell which provider it really was).
func provider(path string) attribute.KeyValue {
	if anthropicPath(path) {
		return semconv.GenAIProviderNameAnthropic
	}
	return semconv.GenAIProviderNameOpenAI
}

// anthropicPath reports whether path is one of Anthropic's Messages paths,
// whose answers are read in Anthropic's shape.
func anthropicPath(path string) bool {
	p := strings.TrimPrefix(path, "/v1")
	return p == "/messages" || p == "/messages/count_tokens"
}

// operation is gen_ai.operation.name for a path under /v1 (or an
// upstream's suffix).
func operation(path string) (attribute.KeyValue, bool) {
	switch strings.TrimPrefix(path, "/v1") {
	case "/chat/completions", "/messages":
		return semconv.GenAIOperationNameChat, true
	case "/completions":
		return semconv.GenAIOperationNameTextCompletion, true
	case "/embeddings":
		return semconv.GenAIOperationNameEmbeddings, true
	}
	return attribute.KeyValue{}, false
}

// Start begins the SERVER span of a request matched to route (echo's
// pattern, "/v1/chat/completions"; it names the span, so it must not be
// the raw path). A client's traceparent is continued when the Tracer
// trusts client context; otherwise the span starts a new trace with a link
// to the client's. It returns r with the span in its context. With t nil
// it returns r and nil.
func (t *Tracer) Start(r *http.Request, route string) (*http.Request, trace.Span) {
	if t == nil {
		return r, nil
	}
	ctx := r.Context()
	attrs := make([]attribute.KeyValue, 0, 4)
	attrs = append(attrs, semconv.HTTPRequestMethodKey.String(r.Method), semconv.HTTPRoute(route))
	if op, ok := operation(route); ok && r.Method == http.MethodPost {
		attrs = append(attrs, op, provider(route))
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...)}
	if client := trace.SpanContextFromContext(traceContext.Extract(ctx, propagation.HeaderCarrier(r.Header))); client.IsValid() {
		if t.trust {
			ctx = trace.ContextWithRemoteSpanContext(ctx, client)
		} else {
			opts = append(opts, trace.WithNewRoot(), trace.WithLinks(trace.Link{SpanContext: client}))
		}
	}
	ctx, span := t.tracer.Start(ctx, r.Method+" "+route, opts...)
	return r.WithContext(ctx), span
}

// Request is what a request's span records when it ends: what its log line
// says.
type Request struct {
	RequestID string
	// Client is the configured client name ("" with no clients).
	Client   string
	Model    string
	Upstream string
	Status   int
	// Class is the log line's class.
	Class    string
	Attempts int
	// IdempotencyKeyHash is the key as the log writes it (hashed).
	IdempotencyKeyHash string
	// IdempotencyEvent is what the claim came to: commit (claimed, ran,
	// committed), not_stored (too large: a marker was committed), release
	// (claimed, no answer to commit: released), replay (a committed answer
	// replayed), wait (waited for the same key in flight elsewhere, then
	// its answer or the client's deadline), conflict (waited past
	// idempotency.wait_timeout: 409), mismatch (another body: 422).
	IdempotencyEvent string
	Cache            string
	Aborted          bool
}

// End records req on span and ends it. A nil span (tracing off) is
// ignored.
func End(span trace.Span, req Request) {
	if span == nil {
		return
	}
	if !span.IsRecording() {
		span.End()
		return
	}
	attrs := make([]attribute.KeyValue, 0, 12)
	attrs = append(attrs, RequestIDKey.String(req.RequestID), OutcomeKey.String(req.Class))
	if req.Status != 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCode(req.Status))
	}
	attrs = appendNonEmpty(attrs, ClientKey, req.Client)
	attrs = appendNonEmpty(attrs, semconv.GenAIRequestModelKey, req.Model)
	attrs = appendNonEmpty(attrs, UpstreamKey, req.Upstream)
	if req.Attempts > 0 {
		attrs = append(attrs, AttemptsKey.Int(req.Attempts))
	}
	attrs = appendNonEmpty(attrs, IdempotencyKeyHashKey, req.IdempotencyKeyHash)
	attrs = appendNonEmpty(attrs, IdempotencyEventKey, req.IdempotencyEvent)
	attrs = appendNonEmpty(attrs, CacheKey, req.Cache)
	if req.Aborted {
		attrs = append(attrs, AbortedKey.Bool(true))
	}
	if req.Status >= 400 || req.Aborted {
		attrs = append(attrs, semconv.ErrorTypeKey.String(req.Class))
	}
	span.SetAttributes(attrs...)
	// A server span is an error when the gateway failed, not when the
	// client asked for something it cannot have (HTTP conventions).
	if req.Status >= 500 || req.Aborted {
		span.SetStatus(codes.Error, req.Class)
	}
	span.End()
}

func appendNonEmpty(attrs []attribute.KeyValue, k attribute.Key, v string) []attribute.KeyValue {
	if v == "" {
		return attrs
	}
	return append(attrs, k.String(v))
}

// BreakerRejected notes on ctx's span that upstream's open breaker refused
// the call, to be probed again after retryAfter.
func BreakerRejected(ctx context.Context, upstream string, retryAfter time.Duration) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(EventBreakerRejected, trace.WithAttributes(UpstreamKey.String(upstream),
			attribute.Float64("llmgate.retry_after", retryAfter.Seconds())))
	}
}

// Fallback notes on ctx's span that the call moves on from one upstream to
// the next of its chain.
func Fallback(ctx context.Context, from, to string) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(EventFallback, trace.WithAttributes(attribute.String("llmgate.fallback.from", from),
			attribute.String("llmgate.fallback.to", to)))
	}
}

// RetryBudgetExhausted notes on ctx's span that the retry budget denied
// upstream a retry.
func RetryBudgetExhausted(ctx context.Context, upstream string) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(EventRetryBudget, trace.WithAttributes(UpstreamKey.String(upstream)))
	}
}
