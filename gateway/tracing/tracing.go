// Package tracing makes llmgate's OpenTelemetry spans: one SERVER span per
// request, carrying the GenAI semantic-convention attributes of the whole
// logical call (all retries and fallbacks), and a CLIENT child span per
// upstream attempt; breaker rejections and fallbacks are events on the
// request's span. It follows the semantic conventions v1.41.0
// (go.opentelemetry.io/otel/semconv/v1.41.0), the last release that
// carries the GenAI attributes: gen_ai.provider.name, not gen_ai.system.
//
// A nil *Tracer is tracing off, and every function here is then a nil
// check or a context lookup: off costs nothing else (BenchmarkTracing in
// package gateway measures it).
//
// What never becomes an attribute: a prompt or a completion, a client's key
// or an upstream's, an Idempotency-Key (only its hash, as the log writes
// it), a URL's user information or query. What the upstream says is read
// with the one JSON scanner (classify/jsonscan), and only model, id,
// finish_reason and the token counts are taken from it.
package tracing

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmgate/llmgate/config"
)

// ScopeName names the instrumentation scope of every span.
const ScopeName = "github.com/llmgate/llmgate/gateway/tracing"

// Options configure a Tracer.
type Options struct {
	// Provider makes the spans. If nil, New returns nil: tracing is off.
	Provider trace.TracerProvider
	// TrustClientContext continues a client's W3C traceparent; when false,
	// a request starts a new trace linked to the client's.
	TrustClientContext bool
	// Logger: if nil, logs are discarded.
	Logger *slog.Logger

	// shutdown, when set, flushes and stops Provider (Setup's).
	shutdown func(context.Context) error
}

// Tracer starts llmgate's spans. Create it with New or Setup; nil is off.
type Tracer struct {
	tracer   trace.Tracer
	trust    bool
	log      *slog.Logger
	shutdown func(context.Context) error
}

// New returns a Tracer over o.Provider, or nil when there is none.
func New(o Options) *Tracer {
	if o.Provider == nil {
		return nil
	}
	t := &Tracer{
		tracer:   o.Provider.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		trust:    o.TrustClientContext,
		log:      o.Logger,
		shutdown: o.shutdown,
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	return t
}

// exportTimeout bounds one export, and the flush at Close.
const exportTimeout = 5 * time.Second

// Setup builds the OpenTelemetry SDK from cfg — an OTLP/HTTP exporter
// behind a batch span processor, a parent-based ratio sampler, a resource
// named llmgate (OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override
// it) — and returns a Tracer over it. With no endpoint it returns nil:
// tracing is off. The exporter reads the OTEL_EXPORTER_OTLP_* variables
// other than the endpoint (headers, timeout, certificates, compression)
// from the process environment itself. Export failures are logged at WARN.
// Close the Tracer after the last span has ended.
func Setup(cfg config.Tracing, log *slog.Logger) (*Tracer, error) {
	if cfg.Endpoint == "" {
		return nil, nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(tracesURL(cfg.Endpoint)),
		otlptracehttp.WithTimeout(exportTimeout))
	if err != nil {
		return nil, err
	}
	res, err := resource.New(context.Background(), resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName("llmgate")), resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithExportTimeout(exportTimeout)),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))),
		sdktrace.WithResource(res),
	)
	// The SDK reports export failures to one process-wide handler; by
	// default it writes them to stderr in its own format.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing: exporting spans failed", "err", err)
	}))
	endpoint := tracesURL(cfg.Endpoint)
	if u, err := url.Parse(endpoint); err == nil {
		endpoint = u.Scheme + "://" + u.Host + u.Path // no user information, no query: they may be secrets
	}
	log.Info("tracing on: spans go over OTLP/HTTP", "endpoint", endpoint, "sample_ratio", cfg.SampleRatio,
		"trust_client_context", cfg.TrustClientContext)
	return New(Options{Provider: tp, TrustClientContext: cfg.TrustClientContext, Logger: log, shutdown: tp.Shutdown}), nil
}

// tracesURL gives an endpoint with no path the OTLP traces path.
func tracesURL(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Path != "" && u.Path != "/") {
		return endpoint
	}
	u.Path = "/v1/traces"
	return u.String()
}

// Close flushes the spans not yet exported and stops the exporter, within
// a few seconds of its own (it runs at shutdown, when every other context
// is done). Only a Tracer Setup built owns its provider; Close does nothing
// for the others, nor for nil.
func (t *Tracer) Close() {
	if t == nil || t.shutdown == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), exportTimeout)
	defer cancel()
	if err := t.shutdown(ctx); err != nil {
		t.log.Warn("tracing: flushing spans at shutdown", "err", err)
	}
}

// traceContext reads and writes W3C traceparent and tracestate. Baggage is
// not propagated: it would carry whatever a client put in it upstream.
var traceContext = propagation.TraceContext{}
