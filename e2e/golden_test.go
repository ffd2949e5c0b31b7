package e2e

// TestGolden pins what the gateway does today, through the real server,
// for a grid of request kinds × response formats × upstream behaviours,
// against the golden files in testdata/golden (one per scenario). It uses
// only the exported API of gateway, cache, config and fakeprovider, so it
// survives a refactor of their insides; it exists to prove that such a
// refactor changed no behaviour.
//
// Run with -update to rewrite the golden files from the current behaviour;
// review the diff before committing it.
//
// What is recorded for each request (an "exchange"): the request as sent;
// the status, headers, body and trailers the client got; the requests the
// fake upstream saw (with the headers the gateway forwarded); the deltas of
// the gateway's llmgate_* metrics; and every log line the gateway wrote
// while serving it. Each run (one scenario, one format, one mode) ends with
// the dead letters the admin API lists.
//
// Every value that genuinely varies from run to run is normalised (see
// normalise and the header and log filters below); everything else must
// match byte for byte.
//
// Each run has its own fake upstream, gateway, metrics registry and
// client; the runs of one scenario share one Badger store (opening one
// costs tens of milliseconds, and there are hundreds of runs), each format
// with its own Idempotency-Key. The requests of a run are sent one after
// another, and each exchange ends only when the gateway's handler has
// returned, so that its log line and metrics are in. The timers of the
// hang, stall and deadline cases are kept short (see timer).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	badgerstore "github.com/llmgate/llmgate/cache/badger"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden from this run")

const (
	goldenDir        = "testdata/golden"
	goldenAdminToken = "golden-admin-token"
	goldenUpstream   = "sk-golden-upstream-key"
	// exchangeHeader tags each request so the test can wait for the
	// gateway's handler to return (its log line and metrics come after the
	// client may already have the whole answer). It is not forwarded
	// upstream: the gateway forwards an allowlist of headers.
	exchangeHeader = "X-Golden-Exchange"
	// waitLimit bounds every wait of the test, so a failure fails instead
	// of hanging.
	waitLimit = 10 * time.Second
)

// goldenStack is the one place the test builds the system under test: it
// opens a Badger store in dir for one scenario and returns how to build a
// gateway over it for each run, logging JSON at debug level to logs, with
// its own metrics registry. Everything is closed at cleanup.
func goldenStack(t *testing.T, dir string) func(t *testing.T, cfg config.Config, logs io.Writer) http.Handler {
	t.Helper()
	store, err := badgerstore.Open(badgerstore.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return func(t *testing.T, cfg config.Config, logs io.Writer) http.Handler {
		t.Helper()
		cfg.DataDir = dir
		g, err := gateway.New(gateway.Options{
			Config:   cfg,
			Store:    store,
			Logger:   slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			Registry: prometheus.NewRegistry(),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Close)
		return g.Handler()
	}
}

// goldenConfig is the base configuration: one upstream "primary" serving
// every model, fast retries, short waits. Scenarios change it further.
func goldenConfig(upstreamURL string) config.Config {
	c := config.Default()
	c.AdminToken = goldenAdminToken
	c.Upstreams = []config.Upstream{{
		Name: "primary", BaseURL: upstreamURL + "/v1", APIKey: goldenUpstream,
		Models: []string{"*"}, Timeout: config.Duration(5 * time.Second),
	}}
	c.Retry.BaseDelay = config.Duration(time.Millisecond)
	c.Retry.MaxDelay = config.Duration(5 * time.Millisecond)
	c.Retry.BudgetMinPerSecond = 1000
	// A duplicate waits this long for a request in flight before its 409.
	// In this sequential grid a key is busy only when a request left it
	// claimed (see deadline_header).
	c.Idempotency.WaitTimeout = config.Duration(100 * time.Millisecond)
	return c
}

// Formats of a request body.
const (
	fmtJSON     = "json"      // stream absent
	fmtSSE      = "sse"       // "stream":true
	fmtSSEUsage = "sse_usage" // "stream":true with stream_options include_usage
)

var allFormats = []string{fmtJSON, fmtSSE, fmtSSEUsage}
var sseFormats = []string{fmtSSE, fmtSSEUsage}

// Modes: how the scenario's request is sent.
const (
	// modeUnkeyed sends it once without Idempotency-Key (twice when the
	// scenario says repeat).
	modeUnkeyed = "unkeyed"
	// modeKeyed sends it with an Idempotency-Key, then again identically
	// (a replay, if the first was committed), then with the same key and
	// a different body (422, if a record holds the key).
	modeKeyed = "keyed"
)

var allModes = []string{modeUnkeyed, modeKeyed}

func streamFields(format string) string {
	switch format {
	case fmtSSE:
		return `"stream":true,`
	case fmtSSEUsage:
		return `"stream":true,"stream_options":{"include_usage":true},`
	}
	return ""
}

func chatBody(format, content string) string {
	return `{"model":"gpt-4o-mini",` + streamFields(format) + `"messages":[{"role":"user","content":"` + content + `"}]}`
}

func completionBody(format, content string) string {
	return `{"model":"gpt-4o-mini",` + streamFields(format) + `"prompt":"` + content + `"}`
}

func embeddingBody(_, content string) string {
	return `{"model":"text-embedding-3-small","input":"` + content + `"}`
}

// scenario is one row of the grid: an upstream behaviour (or a request the
// gateway handles itself), run for each of its formats and modes, each run
// with a fresh gateway and fake upstream over the scenario's store.
type scenario struct {
	name string
	// doc says what the scenario pins; it is written into the golden file.
	doc     string
	method  string   // default POST
	path    string   // default /v1/chat/completions
	formats []string // default allFormats
	modes   []string // default allModes
	// body builds the request body for a format; content is "Hello", or
	// "Hello again" for the keyed request with a different body. Default
	// chatBody. nil body with method GET: no body.
	body   func(format, content string) string
	header map[string]string // sent with every request of the run
	// key is the Idempotency-Key; default golden-key-<format>. Runs of a
	// scenario share a store, so each format has its own key.
	key string
	cfg func(c *config.Config)
	// steps are enqueued on the fake before each recorded request (after
	// clearing what the last one left); def is its default step.
	steps []fakeprovider.Step
	def   *fakeprovider.Step
	// setup runs before the recorded requests; its own requests are
	// recorded too, named "setup: ...".
	setup func(r *run)
	// repeat sends the unkeyed request twice (content-keyed caching).
	repeat bool
	// clientGone: the client of the first recorded request gives up as
	// soon as the upstream has seen its call.
	clientGone bool
	// fake configures the fake upstream.
	fake fakeprovider.Options
	// variableHeaders adds to the response headers whose values vary
	// (name -> placeholder).
	variableHeaders map[string]string
	// custom replaces the grid's requests (concurrent cases).
	custom func(r *run)
}

func (s scenario) withDefaults() scenario {
	if s.method == "" {
		s.method = http.MethodPost
	}
	if s.path == "" {
		s.path = "/v1/chat/completions"
	}
	if s.formats == nil {
		s.formats = allFormats
	}
	if s.modes == nil {
		s.modes = allModes
	}
	if s.body == nil && s.method == http.MethodPost {
		s.body = chatBody
	}
	return s
}

func step(s fakeprovider.Step) *fakeprovider.Step { return &s }

func times(n int, s fakeprovider.Step) []fakeprovider.Step {
	out := make([]fakeprovider.Step, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// timer is the timeout, idle timeout or deadline of the cases that wait
// for a hang or a stall. What is recorded depends on it only if it is too
// short: a request must reach the fake before it fires, and an answer
// (a retry after a hang, the events before a stall) must come back within
// it. 40ms was too short on a loaded machine running -race; so that those
// cases stay cheap, they run fewer formats and attempts.
const timer = 250 * time.Millisecond

func upstreamTimeout(d time.Duration) func(c *config.Config) {
	return func(c *config.Config) { c.Upstreams[0].Timeout = config.Duration(d) }
}

// scenarios is the grid's rows.
func scenarios() []scenario {
	return []scenario{
		// The model's answers.
		{name: "ok", doc: "a healthy upstream answers"},
		{name: "content_filter", doc: "finish_reason content_filter: served and committed, marked X-Llmgate-Outcome",
			steps: []fakeprovider.Step{{FinishReason: "content_filter"}}},
		{name: "empty_output", doc: "an answer with empty content: served and committed",
			steps: []fakeprovider.Step{{Empty: true}}},
		{name: "tool_calls", doc: "an answer that calls a tool instead of content",
			steps: []fakeprovider.Step{{FinishReason: "tool_calls"}}},
		{name: "length", doc: "finish_reason length: an ordinary success",
			steps: []fakeprovider.Step{{FinishReason: "length"}}},

		// Upstream error statuses.
		{name: "upstream_400", doc: "400: a client error, not retried, passed through",
			steps: []fakeprovider.Step{{Status: 400}}},
		{name: "upstream_400_content_filter", doc: "400 with code content_filter: content_filter class, not retried",
			steps: []fakeprovider.Step{{Status: 400, ErrCode: "content_filter"}}},
		{name: "upstream_401", doc: "401 from the upstream (the gateway's key is wrong): auth class, not retried",
			steps: []fakeprovider.Step{{Status: 401}}},
		{name: "upstream_403", doc: "403: auth class, not retried",
			steps: []fakeprovider.Step{{Status: 403}}},
		{name: "upstream_404", doc: "404: a client error, not retried",
			steps: []fakeprovider.Step{{Status: 404}}},
		{name: "upstream_429_once", doc: "one 429 rate limit, then success: retried",
			steps: []fakeprovider.Step{{Status: 429}}},
		{name: "upstream_429_always", doc: "429 on every attempt: retried until the attempts run out",
			def: step(fakeprovider.Step{Status: 429})},
		{name: "upstream_429_retry_after_ms", doc: "429 with retry-after-ms: 10, then success: waits what the upstream asked",
			steps: []fakeprovider.Step{{Status: 429, Header: map[string]string{"Retry-After-Ms": "10"}}}},
		{name: "upstream_429_retry_after_past_deadline", doc: "429 with Retry-After 120 and a 2s deadline: not waited for, passed through",
			cfg:   func(c *config.Config) { c.Retry.Deadline = config.Duration(2 * time.Second) },
			steps: []fakeprovider.Step{{Status: 429, Header: map[string]string{"Retry-After": "120"}}}},
		{name: "upstream_429_insufficient_quota", doc: "429 insufficient_quota: quota class, not retried",
			steps: []fakeprovider.Step{{Status: 429, ErrType: "insufficient_quota", ErrCode: "insufficient_quota"}}},
		{name: "upstream_500_once", doc: "one 500, then success: retried once",
			steps: []fakeprovider.Step{{Status: 500}}},
		{name: "upstream_500_always", doc: "500 on every attempt: server_error allows two attempts",
			def: step(fakeprovider.Step{Status: 500})},
		{name: "upstream_502_once", doc: "one 502, then success",
			steps: []fakeprovider.Step{{Status: 502}}},
		{name: "upstream_502_always", doc: "502 on every attempt",
			def: step(fakeprovider.Step{Status: 502})},
		{name: "upstream_503_once_retry_after_0", doc: "one 503 with Retry-After: 0, then success",
			steps: []fakeprovider.Step{{Status: 503, Header: map[string]string{"Retry-After": "0"}}}},
		{name: "upstream_503_always", doc: "503 on every attempt",
			def: step(fakeprovider.Step{Status: 503})},
		{name: "upstream_529_once", doc: "one 529 (overloaded), then success",
			steps: []fakeprovider.Step{{Status: 529}}},
		{name: "upstream_529_always", doc: "529 on every attempt",
			def: step(fakeprovider.Step{Status: 529})},
		{name: "upstream_200_error_object", doc: "200 whose body is an error object and no choices",
			formats: []string{fmtJSON},
			steps:   times(3, fakeprovider.Step{Body: `{"error":{"message":"boom","type":"server_error","param":null,"code":null}}`})},
		{name: "upstream_200_malformed_once", doc: "200 with a cut JSON body, then success: retried",
			formats: []string{fmtJSON},
			steps:   []fakeprovider.Step{{Body: `{"id":"chatcmpl-x","choices":[{"index":0,"mess`}}},

		{name: "upstream_rejects_gateway_key", doc: "the upstream wants another API key than the gateway's: its 401 for every call, and no models",
			fake: fakeprovider.Options{APIKey: "sk-some-other-key"}},
		{name: "upstream_rejects_gateway_key_models", doc: "GET /v1/models when the upstream refuses the gateway's key: 502",
			method: http.MethodGet, path: "/v1/models", formats: []string{fmtJSON}, modes: []string{modeUnkeyed},
			fake: fakeprovider.Options{APIKey: "sk-some-other-key"}},

		// Transport faults.
		{name: "reset_once", doc: "the connection is reset before any response, then success",
			steps: []fakeprovider.Step{{Reset: true}}},
		{name: "reset_always", doc: "the connection is reset on every attempt: 502",
			def: step(fakeprovider.Step{Reset: true})},
		{name: "truncated_once", doc: "the body is cut after 20 bytes by a reset (headers sent), then success",
			steps: []fakeprovider.Step{{ResetAfter: 20}}},
		{name: "truncated_always", doc: "the body is cut after 20 bytes on every attempt",
			def: step(fakeprovider.Step{ResetAfter: 20})},
		{name: "hang_once", doc: "the upstream never answers the first attempt (timeout 250ms), then answers",
			formats: []string{fmtJSON, fmtSSE}, // sse_usage is sse until the first byte
			cfg:     upstreamTimeout(timer),
			steps:   []fakeprovider.Step{{Hang: true}}},
		{name: "hang_always", doc: "the upstream never answers (timeout 250ms, max_attempts 2): 504",
			formats: []string{fmtJSON, fmtSSE},
			cfg: func(c *config.Config) {
				upstreamTimeout(timer)(c)
				c.Retry.MaxAttempts = 2
			},
			def: step(fakeprovider.Step{Hang: true})},

		// Stream faults.
		{name: "stream_stop_after_1", doc: "the stream ends cleanly after its first event, without [DONE]",
			formats: sseFormats, steps: []fakeprovider.Step{{StopAfter: 1}}},
		{name: "stream_stop_after_3", doc: "the stream ends cleanly after three events, without [DONE]",
			formats: sseFormats, steps: []fakeprovider.Step{{StopAfter: 3}}},
		{name: "stream_stall_after_2", doc: "the stream stalls after two events (idle timeout 250ms)",
			formats: sseFormats,
			cfg:     func(c *config.Config) { c.Limits.StreamIdleTimeout = config.Duration(timer) },
			steps:   []fakeprovider.Step{{StallAfter: 2}}},
		{name: "stream_error_event", doc: "the stream ends with an error event instead of [DONE]",
			formats: sseFormats, steps: []fakeprovider.Step{{ErrorInStream: true}}},
		{name: "stream_error_event_quota", doc: "the stream ends with an insufficient_quota error event",
			formats: sseFormats, steps: []fakeprovider.Step{{ErrorInStream: true, ErrType: "insufficient_quota", ErrCode: "insufficient_quota"}}},
		{name: "stream_truncated_mid_event", doc: "the stream is reset inside its second event",
			formats: sseFormats, steps: []fakeprovider.Step{{ResetAfter: 300}}},

		// Record limits: served, not committed.
		{name: "over_max_record_bytes", doc: "max_record_bytes 300: a JSON body over it is relayed, not committed; a stream over it is served, not committed",
			cfg: func(c *config.Config) { c.Idempotency.MaxRecordBytes = 300 }},
		{name: "over_max_record_bytes_cut", doc: "max_record_bytes 300 and a JSON body cut after 350 bytes: the relay is aborted mid-body",
			formats: []string{fmtJSON},
			cfg:     func(c *config.Config) { c.Idempotency.MaxRecordBytes = 300 },
			steps:   []fakeprovider.Step{{ResetAfter: 350}}},
		{name: "over_max_record_events", doc: "max_record_events 4: a longer stream is served, not committed",
			cfg: func(c *config.Config) { c.Idempotency.MaxRecordEvents = 4 }},
		{name: "event_over_max_record_bytes", doc: "max_record_bytes 100: one stream event is larger than that",
			cfg: func(c *config.Config) { c.Idempotency.MaxRecordBytes = 100 }},

		// The circuit breaker, and fallbacks.
		{name: "breaker_forced_open", doc: "an operator forced the breaker open (admin API): 503 with Retry-After, no upstream call",
			setup: func(r *run) { r.admin(http.MethodPost, "/admin/breakers/primary/open") }},
		{name: "breaker_tripped", doc: "consecutive_failures 1: one failed request opens the breaker, the next are refused",
			cfg: func(c *config.Config) { c.Breaker.ConsecutiveFailures = 1 },
			// The time left of open_timeout (30s), rounded up: 30 unless a
			// slow machine took a second since the trip.
			variableHeaders: map[string]string{"Retry-After": "<seconds left of open_timeout>"},
			def:             step(fakeprovider.Step{Status: 503}),
			setup: func(r *run) {
				r.exchange("setup: a failing request trips the breaker", r.request(fmtJSON, "Trip", nil))
			}},
		{name: "breaker_half_open_probe", doc: "open_timeout 500ms: after it, one probe goes through and closes the breaker",
			cfg: func(c *config.Config) {
				c.Breaker.ConsecutiveFailures = 1
				// Long enough that the timer's open → half-open change
				// never lands in the tripping step's logs, however slow
				// the machine (it did at 30ms under -race in CI).
				c.Breaker.OpenTimeout = config.Duration(500 * time.Millisecond)
			},
			setup: func(r *run) {
				r.fake.Enqueue(times(3, fakeprovider.Step{Status: 503})...)
				r.exchange("setup: a failing request trips the breaker", r.request(fmtJSON, "Trip", nil))
				// Not synchronisation: the breaker's open_timeout must
				// pass before it lets a probe through.
				time.Sleep(600 * time.Millisecond)
				// The breaker turns half-open on a timer at open_timeout;
				// a look (unrecorded) makes sure it has, however late
				// the timer runs, so the probe's step never holds the
				// open → half-open change.
				r.look("/admin/breakers")
			}},
		{name: "fallback", doc: "primary fails 503 three times, its fallback secondary answers",
			cfg:   withFallback,
			steps: times(3, fakeprovider.Step{Status: 503})},
		{name: "fallback_breaker_open", doc: "primary's breaker is forced open: its fallback answers at once",
			cfg:   withFallback,
			setup: func(r *run) { r.admin(http.MethodPost, "/admin/breakers/primary/open") }},
		{name: "fallback_both_fail", doc: "primary and its fallback both fail 503",
			cfg: withFallback,
			def: step(fakeprovider.Step{Status: 503})},

		// The request's deadline.
		{name: "deadline_header", doc: "X-Llmgate-Deadline: 250ms and a hanging upstream: 504 at the deadline",
			formats: []string{fmtJSON, fmtSSE},
			header:  map[string]string{"X-Llmgate-Deadline": timer.String()},
			def:     step(fakeprovider.Step{Hang: true})},
		{name: "deadline_header_seconds", doc: "X-Llmgate-Deadline as seconds (0.25)",
			formats: []string{fmtJSON},
			header:  map[string]string{"X-Llmgate-Deadline": strconv.FormatFloat(timer.Seconds(), 'f', -1, 64)},
			def:     step(fakeprovider.Step{Hang: true})},
		{name: "deadline_header_invalid", doc: "X-Llmgate-Deadline that is not a duration: 400",
			formats: []string{fmtJSON},
			header:  map[string]string{"X-Llmgate-Deadline": "soon"}},

		// Keys and caching.
		{name: "require_key", doc: "idempotency.require_key: an unkeyed POST is a 400",
			cfg: func(c *config.Config) { c.Idempotency.RequireKey = true }},
		{name: "invalid_idempotency_key", doc: "an Idempotency-Key of 256 characters: 400",
			formats: []string{fmtJSON}, modes: []string{modeKeyed}, key: strings.Repeat("k", 256)},
		{name: "quoted_idempotency_key", doc: "an Idempotency-Key as an RFC 8941 quoted string",
			formats: []string{fmtJSON}, modes: []string{modeKeyed}, key: `"golden \"quoted\" key"`},
		{name: "cache_header_on", doc: "X-Llmgate-Cache: on: the second identical unkeyed request is a cache hit",
			header: map[string]string{"X-Llmgate-Cache": "on"}, repeat: true},
		{name: "cache_upstream_config", doc: "upstream cache: true: content-keyed caching without the header",
			cfg:    func(c *config.Config) { c.Upstreams[0].Cache = true },
			repeat: true},
		{name: "cache_header_off", doc: "upstream cache: true, but X-Llmgate-Cache: off: no caching",
			cfg:    func(c *config.Config) { c.Upstreams[0].Cache = true },
			header: map[string]string{"X-Llmgate-Cache": "off"}, repeat: true, formats: []string{fmtJSON}},
		{name: "cache_no_store", doc: "cache on with Cache-Control: no-store: looked up, never stored",
			header: map[string]string{"X-Llmgate-Cache": "on", "Cache-Control": "no-store"}, repeat: true,
			formats: []string{fmtJSON}},
		{name: "cache_failure_not_cached", doc: "cache on, the upstream fails 400: nothing is cached",
			header: map[string]string{"X-Llmgate-Cache": "on"}, repeat: true,
			formats: []string{fmtJSON}, steps: []fakeprovider.Step{{Status: 400}}},
		{name: "keyed_in_flight_409", doc: "wait_timeout 30ms: a duplicate of a keyed request held at the upstream gets 409; the first then commits and replays",
			cfg:    func(c *config.Config) { c.Idempotency.WaitTimeout = config.Duration(30 * time.Millisecond) },
			modes:  []string{modeKeyed},
			custom: inFlightDuplicate},
		{name: "client_gone", doc: "the client leaves while the upstream hangs (timeout 250ms, max_attempts 1): unkeyed is cancelled, keyed runs on",
			formats: []string{fmtJSON, fmtSSE}, clientGone: true,
			cfg: func(c *config.Config) {
				upstreamTimeout(timer)(c)
				c.Retry.MaxAttempts = 1
			},
			def: step(fakeprovider.Step{Hang: true})},

		// Other endpoints.
		{name: "completions", doc: "/v1/completions", path: "/v1/completions", body: completionBody},
		{name: "completions_503_once", doc: "/v1/completions with one 503", path: "/v1/completions", body: completionBody,
			steps: []fakeprovider.Step{{Status: 503}}},
		{name: "embeddings", doc: "/v1/embeddings", path: "/v1/embeddings", body: embeddingBody, formats: []string{fmtJSON}},
		{name: "embeddings_503_once", doc: "/v1/embeddings with one 503", path: "/v1/embeddings", body: embeddingBody,
			formats: []string{fmtJSON}, steps: []fakeprovider.Step{{Status: 503}}},
		{name: "models", doc: "GET /v1/models: the upstreams' lists merged", method: http.MethodGet, path: "/v1/models",
			formats: []string{fmtJSON}, modes: []string{modeUnkeyed}},
		{name: "models_fallback_pair", doc: "GET /v1/models with two upstreams on one fake: merged without duplicates",
			method: http.MethodGet, path: "/v1/models", cfg: withFallback,
			formats: []string{fmtJSON}, modes: []string{modeUnkeyed}},

		// Requests the gateway refuses itself.
		{name: "unknown_v1_path", doc: "POST to an unknown /v1 path: 404", path: "/v1/unknown",
			formats: []string{fmtJSON}},
		{name: "unknown_v1_path_get", doc: "GET of an unknown /v1 path: 404", method: http.MethodGet, path: "/v1/nothing/here",
			formats: []string{fmtJSON}, modes: []string{modeUnkeyed}},
		{name: "method_not_allowed", doc: "GET /v1/chat/completions", method: http.MethodGet,
			formats: []string{fmtJSON}, modes: []string{modeUnkeyed}},
		{name: "bad_json", doc: "a body that is not JSON: 400", formats: []string{fmtJSON},
			body: func(_, content string) string { return `{"model":"gpt-4o-mini","messages":[` + content }},
		{name: "body_not_object", doc: "a JSON array body: 400", formats: []string{fmtJSON},
			body: func(_, content string) string { return `["` + content + `"]` }},
		{name: "missing_model", doc: "no model: 400",
			body: func(format, content string) string {
				return `{` + streamFields(format) + `"messages":[{"role":"user","content":"` + content + `"}]}`
			}},
		{name: "model_not_string", doc: "model is a number: 400", formats: []string{fmtJSON},
			body: func(_, content string) string {
				return `{"model":4,"messages":[{"role":"user","content":"` + content + `"}]}`
			}},
		{name: "stream_not_boolean", doc: `"stream":"yes": 400`, formats: []string{fmtJSON},
			body: func(_, content string) string {
				return `{"model":"gpt-4o-mini","stream":"yes","messages":[{"role":"user","content":"` + content + `"}]}`
			}},
		{name: "too_deep", doc: "a body nested deeper than max_json_depth 4: 400", formats: []string{fmtJSON},
			cfg: func(c *config.Config) { c.Limits.MaxJSONDepth = 4 },
			body: func(_, content string) string {
				return `{"model":"gpt-4o-mini","messages":[{"role":"user","content":[[["` + content + `"]]]}]}`
			}},
		{name: "unknown_model", doc: "a model no upstream serves: 404",
			cfg: func(c *config.Config) { c.Upstreams[0].Models = []string{"gpt-4o-mini"} },
			body: func(format, content string) string {
				return `{"model":"nope-1",` + streamFields(format) + `"messages":[{"role":"user","content":"` + content + `"}]}`
			}},
		{name: "too_large", doc: "a body over max_body_bytes 64: 413",
			cfg: func(c *config.Config) { c.Limits.MaxBodyBytes = 64 }},
		{name: "auth_missing", doc: "clients configured, no Authorization: 401", cfg: withClients, formats: []string{fmtJSON}},
		{name: "auth_wrong", doc: "clients configured, an unknown key: 401", cfg: withClients, formats: []string{fmtJSON},
			header: map[string]string{"Authorization": "Bearer not-a-client-key"}},
		{name: "auth_ok", doc: "clients configured, a known key: served as that client", cfg: withClients,
			header: map[string]string{"Authorization": "Bearer team-a-key"}},
	}
}

func withFallback(c *config.Config) {
	second := c.Upstreams[0]
	second.Name = "secondary"
	c.Upstreams[0].Fallbacks = []string{"secondary"}
	c.Upstreams = append(c.Upstreams, second)
}

func withClients(c *config.Config) {
	c.Clients = []config.Client{{Name: "team-a", Key: "team-a-key"}, {Name: "team-b", Key: "team-b-key"}}
}

// inFlightDuplicate: a keyed request is held at the upstream (the test
// lets it through only later, so no timing decides the outcome) when a
// duplicate arrives; the duplicate waits wait_timeout (30ms) and gets 409.
// The first then commits, and a third replays it.
func inFlightDuplicate(r *run) {
	hdr := map[string]string{"Idempotency-Key": r.key}
	held := r.holdNextUpstreamCall()
	p := r.start(r.request(r.format, "Hello", hdr))
	select {
	case <-held.arrived:
	case <-time.After(waitLimit):
		r.t.Fatalf("the first request did not reach the upstream within %v", waitLimit)
	}
	dup := r.start(r.request(r.format, "Hello", hdr)).finish()
	dup.Name = "keyed duplicate while the first is in flight"
	held.release()
	first := p.finish()
	first.Name = "keyed (the first; in flight during the duplicate, so its metrics and logs include the duplicate's)"
	r.out.Exchanges = append(r.out.Exchanges, first, dup)
	r.exchange("keyed replay", r.request(r.format, "Hello", hdr))
}

// goldenFile is one scenario's golden file.
type goldenFile struct {
	Scenario string      `json:"scenario"`
	Doc      string      `json:"doc"`
	Runs     []runRecord `json:"runs"`
}

type runRecord struct {
	Format    string           `json:"format"`
	Mode      string           `json:"mode"`
	Exchanges []exchangeRecord `json:"exchanges"`
	// DeadLetters are the run's dead letters, from the admin API, after
	// its last exchange.
	DeadLetters []map[string]any `json:"dead_letters,omitempty"`
}

// exchangeRecord is one request and what came of it. Headers are
// "Name: value" lines, sorted; log lines are compact JSON with sorted keys.
type exchangeRecord struct {
	Name    string        `json:"name"`
	Request requestRecord `json:"request"`
	// ClientError is the error the client got instead of an answer (it
	// gave up, or the connection was cut before the headers).
	ClientError      string   `json:"client_error,omitempty"`
	Status           int      `json:"status"`
	Header           []string `json:"header,omitempty"`
	TransferEncoding []string `json:"transfer_encoding,omitempty"`
	// Body is the body split at "\n": joined with "\n" it is the body.
	Body []string `json:"body,omitempty"`
	// BodyError is the error that ended reading the body (a cut answer).
	BodyError string   `json:"body_error,omitempty"`
	Trailer   []string `json:"trailer,omitempty"`
	// BodyIdenticalTo names the earlier exchange of the run whose body
	// was byte for byte this one, before normalisation (a replay's).
	BodyIdenticalTo string `json:"body_identical_to,omitempty"`
	// UpstreamCalls counts the requests the fake upstream saw. Upstream
	// has one line per request: "METHOD path; Header: value; ...; body",
	// where body is "body as sent" when it is byte for byte the client's.
	UpstreamCalls int      `json:"upstream_calls"`
	Upstream      []string `json:"upstream,omitempty"`
	// Metrics are the changes of the llmgate_* counters and gauges, and of
	// the histograms' _count, over the exchange, as "series delta".
	Metrics []string `json:"metrics,omitempty"`
	// Logs are the gateway's log lines written while serving the exchange.
	Logs []string `json:"logs,omitempty"`

	raw []byte // the body as received
}

type requestRecord struct {
	Method string   `json:"method"`
	Path   string   `json:"path"`
	Header []string `json:"header,omitempty"`
	Body   string   `json:"body,omitempty"`
}

func TestGolden(t *testing.T) {
	start := time.Now()
	want := map[string]bool{}
	var runs atomic.Int64
	t.Cleanup(func() {
		t.Logf("%d scenarios, %d runs in %v", len(want), runs.Load(), time.Since(start).Round(time.Millisecond))
	})
	for _, sc := range scenarios() {
		sc = sc.withDefaults()
		if want[sc.name] {
			t.Fatalf("two scenarios named %q", sc.name)
		}
		want[sc.name] = true
		t.Run(sc.name, func(t *testing.T) {
			// Scenarios share nothing, and most of their time is spent
			// waiting (timers, the disk): they run in parallel, as many
			// as -parallel allows.
			t.Parallel()
			build := goldenStack(t, t.TempDir())
			gf := goldenFile{Scenario: sc.name, Doc: sc.doc}
			for _, format := range sc.formats {
				for _, mode := range sc.modes {
					gf.Runs = append(gf.Runs, runScenario(t, build, sc, format, mode))
					runs.Add(1)
				}
			}
			compareGolden(t, filepath.Join(goldenDir, sc.name+".json"), marshalGolden(t, gf))
		})
	}
	// A golden file whose scenario is gone is stale.
	files, _ := filepath.Glob(filepath.Join(goldenDir, "*.json"))
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		if want[name] {
			continue
		}
		if *update {
			if err := os.Remove(f); err != nil {
				t.Error(err)
			}
			continue
		}
		t.Errorf("%s has no scenario; run with -update to remove it", f)
	}
}

// marshalGolden is v as indented JSON, with <, > and & left as they are.
func marshalGolden(t *testing.T, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func compareGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./e2e -run TestGolden -update to create it)", err)
	}
	if !bytes.Equal(want, got) {
		t.Errorf("%s differs from this run (- golden, + this run):\n%s\nIf the change is intended, run go test ./e2e -run TestGolden -update and review the diff.",
			path, lineDiff(strings.Split(string(want), "\n"), strings.Split(string(got), "\n"), 3, 60))
	}
}

// lineDiff is a unified-style diff of a and b (Myers' algorithm), with ctx
// lines of context, cut after limit lines of output.
func lineDiff(a, b []string, ctx, limit int) string {
	type op struct {
		kind byte // ' ', '-', '+'
		ai   int  // line in a (for ' ' and '-'), else in b
	}
	// Myers: V[k] is the furthest x on diagonal k; trace keeps each D's V.
	n, m := len(a), len(b)
	off := n + m + 1
	v := make([]int, 2*off+1)
	var trace [][]int
	found := false
	for d := 0; d <= n+m && !found; d++ {
		trace = append(trace, slices.Clone(v))
		for k := -d; k <= d; k += 2 {
			var x int
			if k == -d || (k != d && v[off+k-1] < v[off+k+1]) {
				x = v[off+k+1]
			} else {
				x = v[off+k-1] + 1
			}
			y := x - k
			for x < n && y < m && a[x] == b[y] {
				x, y = x+1, y+1
			}
			v[off+k] = x
			if x >= n && y >= m {
				found = true
				break
			}
		}
	}
	// Walk back from (n, m).
	var ops []op
	x, y := n, m
	for d := len(trace) - 1; d >= 0; d-- {
		vd := trace[d]
		k := x - y
		var pk int
		if k == -d || (k != d && vd[off+k-1] < vd[off+k+1]) {
			pk = k + 1
		} else {
			pk = k - 1
		}
		px := vd[off+pk]
		py := px - pk
		for x > px && y > py {
			x, y = x-1, y-1
			ops = append(ops, op{' ', x})
		}
		if d > 0 {
			if x == px {
				y--
				ops = append(ops, op{'+', y})
			} else {
				x--
				ops = append(ops, op{'-', x})
			}
		}
	}
	slices.Reverse(ops)

	var sb strings.Builder
	lines := 0
	last := -1 // index in ops of the last op printed
	for i, o := range ops {
		if o.kind == ' ' {
			continue
		}
		from := max(i-ctx, last+1)
		if last >= 0 && from > last+1 || last < 0 && from > 0 {
			fmt.Fprintf(&sb, "@@ golden line %d @@\n", ops[from].ai+1)
		}
		for j := from; j <= i; j++ {
			if lines == limit {
				sb.WriteString("... (more differences)\n")
				return sb.String()
			}
			o := ops[j]
			text := a
			if o.kind == '+' {
				text = b
			}
			fmt.Fprintf(&sb, "%c %s\n", o.kind, text[o.ai])
			lines++
		}
		last = i
		// Trailing context, unless another change follows closely.
		for j := i + 1; j < len(ops) && j <= i+ctx && ops[j].kind == ' '; j++ {
			next := slices.IndexFunc(ops[i+1:], func(o op) bool { return o.kind != ' ' })
			if next >= 0 && next < 2*ctx {
				break
			}
			if lines == limit {
				sb.WriteString("... (more differences)\n")
				return sb.String()
			}
			fmt.Fprintf(&sb, "  %s\n", a[ops[j].ai])
			lines++
			last = j
		}
	}
	return sb.String()
}

// run is one scenario in one format and mode: its own fake upstream,
// gateway and client, over the scenario's store.
type run struct {
	t      *testing.T
	sc     scenario
	format string
	key    string // the run's Idempotency-Key
	fake   *fakeprovider.Server
	url    string
	client *http.Client
	logs   *syncBuffer
	seq    int
	done   sync.Map // exchange tag -> chan struct{}, closed when its handler returns
	out    runRecord

	mu   sync.Mutex
	hold *heldCall // the next upstream call to hold, if any
}

// heldCall is an upstream call the test holds before the fake sees it:
// arrived is closed when it arrives, and it goes on when released (or when
// its request ends).
type heldCall struct {
	arrived, proceed chan struct{}
	once             sync.Once
}

func (h *heldCall) release() { h.once.Do(func() { close(h.proceed) }) }

// holdNextUpstreamCall holds the next call that reaches the fake upstream.
func (r *run) holdNextUpstreamCall() *heldCall {
	h := &heldCall{arrived: make(chan struct{}), proceed: make(chan struct{})}
	r.t.Cleanup(h.release) // a failed test must not leave it held
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hold = h
	return h
}

func (r *run) takeHold() *heldCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.hold
	r.hold = nil
	return h
}

type buildFunc = func(t *testing.T, cfg config.Config, logs io.Writer) http.Handler

func runScenario(t *testing.T, build buildFunc, sc scenario, format, mode string) runRecord {
	t.Helper()
	var rec runRecord
	// A subtest per run gives its gateway, fake and client their own
	// cleanup, before the scenario's store closes.
	t.Run(format+"/"+mode, func(t *testing.T) {
		r := newRun(t, build, sc, format)
		r.out = runRecord{Format: format, Mode: mode}
		if sc.def != nil {
			r.fake.SetDefault(*sc.def)
		}
		if sc.setup != nil {
			sc.setup(r)
		}
		switch {
		case sc.custom != nil:
			sc.custom(r)
		case mode == modeUnkeyed:
			r.gridExchange("unkeyed", "Hello", nil, sc.clientGone)
			if sc.repeat {
				r.gridExchange("unkeyed repeat", "Hello", nil, false)
			}
		default:
			key := map[string]string{"Idempotency-Key": r.key}
			r.gridExchange("keyed", "Hello", key, sc.clientGone)
			r.gridExchange("keyed replay", "Hello", key, false)
			r.gridExchange("keyed different body", "Hello again", key, false)
		}
		r.out.DeadLetters = r.deadLetters()
		rec = r.out
	})
	if t.Failed() {
		t.FailNow()
	}
	return rec
}

func newRun(t *testing.T, build buildFunc, sc scenario, format string) *run {
	t.Helper()
	r := &run{t: t, sc: sc, format: format, key: sc.key, logs: &syncBuffer{}}
	if r.key == "" {
		r.key = "golden-key-" + format
	}
	r.fake = fakeprovider.New(sc.fake)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if h := r.takeHold(); h != nil {
			close(h.arrived)
			select {
			case <-h.proceed:
			case <-req.Context().Done():
			}
		}
		r.fake.ServeHTTP(w, req)
	}))
	t.Cleanup(up.Close)
	t.Cleanup(r.fake.Close) // before up.Close: releases hanging handlers

	cfg := goldenConfig(up.URL)
	if sc.cfg != nil {
		sc.cfg(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("scenario config invalid: %v", err)
	}
	h := build(t, cfg, r.logs)
	// The handler is wrapped only to learn when it has returned.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if tag := req.Header.Get(exchangeHeader); tag != "" {
			ch, ok := r.done.LoadAndDelete(tag)
			if !ok {
				t.Errorf("the gateway got exchange %s twice", tag)
			} else {
				defer close(ch.(chan struct{}))
			}
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	r.client = &http.Client{Transport: tr, Timeout: waitLimit}
	return r
}

// request builds the scenario's request in format with content and the
// extra headers hdr.
func (r *run) request(format, content string, hdr map[string]string) *http.Request {
	r.t.Helper()
	var body io.Reader
	if r.sc.body != nil {
		body = strings.NewReader(r.sc.body(format, content))
	}
	req, err := http.NewRequest(r.sc.method, r.url+r.sc.path, body)
	if err != nil {
		r.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range r.sc.header {
		req.Header.Set(k, v)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return req
}

// gridExchange sends the scenario's request once, after enqueueing the
// scenario's steps afresh.
func (r *run) gridExchange(name, content string, hdr map[string]string, clientGone bool) {
	r.t.Helper()
	r.fake.ClearQueue()
	r.fake.Enqueue(r.sc.steps...)
	req := r.request(r.format, content, hdr)
	if !clientGone {
		r.exchange(name, req)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := r.fake.Calls("")
	go func() {
		wctx, wcancel := context.WithTimeout(ctx, waitLimit)
		defer wcancel()
		if r.fake.WaitForCalls(wctx, calls+1) == nil {
			cancel() // the client gives up while the upstream thinks
		}
	}()
	r.exchange(name+" (the client leaves)", req.WithContext(ctx))
}

// exchange sends req, waits for the gateway to finish with it and records
// the exchange.
func (r *run) exchange(name string, req *http.Request) {
	r.t.Helper()
	ex := r.start(req).finish()
	ex.Name = name
	r.out.Exchanges = append(r.out.Exchanges, ex)
}

// pending is an exchange under way.
type pending struct {
	r       *run
	req     requestRecord
	before  map[string]float64
	calls   int
	nreqs   int
	logOff  int
	handled chan struct{}
	result  chan exchangeRecord
}

// start sends req in the background.
func (r *run) start(req *http.Request) *pending {
	r.t.Helper()
	r.seq++
	tag := strconv.Itoa(r.seq)
	p := &pending{r: r, handled: make(chan struct{}), result: make(chan exchangeRecord, 1)}
	r.done.Store(tag, p.handled)
	req.Header.Set(exchangeHeader, tag)
	p.req = recordRequest(req)
	// Without GetBody Go's transport cannot re-send the request on its own,
	// which it does for a POST with an Idempotency-Key when a reused
	// connection breaks before the answer: the golden records what one
	// client request does.
	req.GetBody = nil
	p.before = r.metrics()
	p.calls = r.fake.Calls("")
	p.nreqs = len(r.fake.Requests())
	p.logOff = r.logs.Len()
	go func() { p.result <- r.send(req) }()
	return p
}

// finish waits for the answer and for the gateway's handler to return,
// then records what changed.
func (p *pending) finish() exchangeRecord {
	r := p.r
	r.t.Helper()
	var ex exchangeRecord
	select {
	case ex = <-p.result:
	case <-time.After(waitLimit):
		r.t.Fatalf("%s %s: no answer within %v", p.req.Method, p.req.Path, waitLimit)
	}
	select {
	case <-p.handled:
	case <-time.After(waitLimit):
		r.t.Fatalf("%s %s: the gateway's handler did not return within %v", p.req.Method, p.req.Path, waitLimit)
	}
	ex.Request = p.req
	ex.UpstreamCalls = r.fake.Calls("") - p.calls
	for _, u := range r.fake.Requests()[p.nreqs:] {
		parts := append([]string{u.Method + " " + u.Path}, headerLines(u.Header)...)
		switch {
		case string(u.Body) == p.req.Body && len(u.Body) > 0:
			parts = append(parts, "body as sent")
		case len(u.Body) > 0:
			parts = append(parts, "body "+normalise(string(u.Body)))
		}
		ex.Upstream = append(ex.Upstream, strings.Join(parts, "; "))
	}
	if len(ex.raw) > 0 {
		for _, prev := range r.out.Exchanges {
			if bytes.Equal(prev.raw, ex.raw) {
				ex.BodyIdenticalTo = prev.Name
				break
			}
		}
	}
	ex.Metrics = metricDelta(p.before, r.metrics())
	ex.Logs = parseLogs(r.t, r.logs.String()[p.logOff:])
	return ex
}

// send does req and reads the whole answer.
func (r *run) send(req *http.Request) exchangeRecord {
	var rec exchangeRecord
	res, err := r.client.Do(req)
	if err != nil {
		rec.ClientError = normalise(clientError(err))
		return rec
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		rec.BodyError = normalise(clientError(err))
	}
	rec.raw = body
	rec.Status = res.StatusCode
	rec.Header = headerLines(res.Header)
	for i, h := range rec.Header {
		name, _, _ := strings.Cut(h, ": ")
		if p, ok := r.sc.variableHeaders[name]; ok {
			rec.Header[i] = name + ": " + p
		}
	}
	if reTime.Match(body) {
		// A time's fractional seconds lose trailing zeros: the length
		// varies with it.
		for i, h := range rec.Header {
			if strings.HasPrefix(h, "Content-Length: ") {
				rec.Header[i] = "Content-Length: <varies with the time in the body>"
			}
		}
	}
	rec.TransferEncoding = res.TransferEncoding
	rec.Body = strings.Split(normalise(string(body)), "\n")
	rec.Trailer = headerLines(res.Trailer)
	return rec
}

// clientError is err without the *url.Error's method and URL.
func clientError(err error) string {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		err = ue.Err
	}
	return err.Error()
}

func recordRequest(req *http.Request) requestRecord {
	rr := requestRecord{Method: req.Method, Path: req.URL.Path, Header: headerLines(req.Header)}
	if req.GetBody != nil {
		if b, err := req.GetBody(); err == nil {
			data, _ := io.ReadAll(b)
			rr.Body = string(data)
		}
	}
	return rr
}

// Header values that vary from run to run; their names are kept.
var variableHeaders = map[string]string{
	"Date":                 "<date>",
	"X-Llmgate-Request-Id": "<random>", // made by the gateway with crypto/rand
	"Openai-Processing-Ms": "<ms>",     // the fake's own timing
}

// headerLines renders h as sorted "Name: value" lines, one per value.
func headerLines(h http.Header) []string {
	var out []string
	for k, vs := range h {
		if k == exchangeHeader {
			continue
		}
		for _, v := range vs {
			if p, ok := variableHeaders[k]; ok {
				v = p
			}
			out = append(out, k+": "+normalise(v))
		}
	}
	slices.Sort(out)
	return out
}

// normalise replaces what the fake upstream makes random or takes from the
// clock, the times the admin API shows, and the servers' random ports:
//   - ids: chatcmpl-fake-<n>-<16 random hex> (n counts the fake's answers
//     and is kept), cmpl-fake-..., tool calls' call_<16 random hex>, and
//     the x-request-id req_<32 random hex>;
//   - "created": the time of the answer, except the models' fixed
//     1700000000;
//   - RFC 3339 times (the breaker's opened_at);
//   - 127.0.0.1:<port>, should an error message hold an address.
//
// Everything else the fake sends is deterministic: its text, usage and
// embeddings are functions of the request, and its rate-limit headers count
// its calls, which start from zero in each run.
func normalise(s string) string {
	s = reFakeID.ReplaceAllString(s, "${1}-${2}-<random>")
	s = reCallID.ReplaceAllString(s, "call_<random>")
	s = reReqID.ReplaceAllString(s, "req_<random>")
	s = reCreated.ReplaceAllStringFunc(s, func(m string) string {
		if strings.HasSuffix(m, ":1700000000") {
			return m
		}
		return `"created":<time>`
	})
	s = reTime.ReplaceAllString(s, "<time>")
	return rePort.ReplaceAllString(s, "127.0.0.1:<port>")
}

var (
	reFakeID  = regexp.MustCompile(`\b(chatcmpl-fake|cmpl-fake)-(\d+)-[0-9a-f]{16}\b`)
	reCallID  = regexp.MustCompile(`\bcall_[0-9a-f]{16}\b`)
	reReqID   = regexp.MustCompile(`\breq_[0-9a-f]{32}\b`)
	reCreated = regexp.MustCompile(`"created":\d+`)
	reTime    = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`)
	rePort    = regexp.MustCompile(`127\.0\.0\.1:\d+`)
)

// Log fields that vary from run to run: the clock, the request's duration,
// its random id, and the retry loop's jittered backoff.
var variableLogFields = []string{"time", "duration", "request_id", "wait"}

// parseLogs turns JSON log lines into compact JSON with sorted keys,
// without the variable fields.
func parseLogs(t *testing.T, text string) []string {
	t.Helper()
	var out []string
	for line := range strings.SplitSeq(strings.TrimSpace(text), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %v: %s", err, line)
		}
		for _, k := range variableLogFields {
			delete(m, k)
		}
		for k, v := range m {
			if s, ok := v.(string); ok {
				m[k] = normalise(s)
			}
		}
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(b))
	}
	return out
}

// Metrics left out of the deltas:
//   - llmgate_store_records: Badger's Stats caches its count for 5s, so
//     what a scrape shows depends on the clock;
//   - llmgate_deadletters and llmgate_deadletter_alert: set by the
//     dead-letter monitor's goroutine some time after a dead letter is
//     recorded (the dead letters themselves are recorded at the end of each
//     run, from the admin API, and llmgate_deadletters_recorded_total is
//     counted synchronously);
//   - llmgate_detached_calls and llmgate_admission_inflight_bytes: a keyed
//     call past its client's deadline runs on, holding its body's bytes;
//     whether it has ended when the scrape comes depends on the clock;
//   - llmgate_store_free_bytes, llmgate_store_used_bytes and
//     llmgate_store_live_bytes: the disk's free space, the store's files
//     and its live entries, which other processes, Badger's own flushes
//     and expiries move;
//   - histogram buckets and sums: timings.
var skippedMetrics = map[string]bool{
	"llmgate_store_free_bytes": true,
	"llmgate_store_used_bytes": true,
	"llmgate_store_live_bytes": true,
	"llmgate_store_records":    true,
	"llmgate_deadletters":      true,
	"llmgate_deadletter_alert": true,
	"llmgate_detached_calls":   true,
	// See above: held by a detached call until it ends.
	"llmgate_admission_inflight_bytes": true,
}

// metrics scrapes /metrics: llmgate_* counters and gauges by series, and
// histograms' sample counts as <name>_count.
func (r *run) metrics() map[string]float64 {
	r.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, r.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+goldenAdminToken)
	res, err := r.client.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		r.t.Fatalf("GET /metrics: %d", res.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		if !strings.HasPrefix(name, "llmgate_") || skippedMetrics[name] {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+strconv.Quote(l.GetValue()))
			}
			slices.Sort(labels)
			series := "{" + strings.Join(labels, ",") + "}"
			switch f.GetType().String() {
			case "COUNTER":
				out[name+series] = m.GetCounter().GetValue()
			case "GAUGE":
				out[name+series] = m.GetGauge().GetValue()
			case "HISTOGRAM":
				out[name+"_count"+series] = float64(m.GetHistogram().GetSampleCount())
			default:
				r.t.Fatalf("metric %s has type %s, which the golden test does not know", name, f.GetType())
			}
		}
	}
	return out
}

// metricDelta lists the series that changed, as "series +delta", sorted.
func metricDelta(before, after map[string]float64) []string {
	var out []string
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out = append(out, fmt.Sprintf("%s %+g", k, d))
		}
	}
	for k, v := range before {
		if _, ok := after[k]; !ok && v != 0 {
			out = append(out, fmt.Sprintf("%s %+g", k, -v))
		}
	}
	slices.Sort(out)
	return out
}

// admin sends an admin request and records it as a setup exchange.
// look GETs an admin path without recording it in the golden file.
func (r *run) look(path string) {
	r.t.Helper()
	req, err := http.NewRequest(http.MethodGet, r.url+path, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+goldenAdminToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
}

func (r *run) admin(method, path string) {
	r.t.Helper()
	req, err := http.NewRequest(method, r.url+path, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+goldenAdminToken)
	r.exchange("setup: "+method+" "+path, req)
}

// Dead-letter fields that vary: the clock.
var variableDeadLetterFields = []string{"first_at", "last_at", "expires_at"}

// deadLetters lists the run's dead letters (those of its key; the
// scenario's runs share a store) through the admin API.
func (r *run) deadLetters() []map[string]any {
	r.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, r.url+"/admin/deadletters?limit=1000", nil)
	req.Header.Set("Authorization", "Bearer "+goldenAdminToken)
	res, err := r.client.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer res.Body.Close()
	var list struct {
		DeadLetters []map[string]any `json:"dead_letters"`
	}
	if err := json.NewDecoder(res.Body).Decode(&list); err != nil || res.StatusCode != 200 {
		r.t.Fatalf("GET /admin/deadletters: %d %v", res.StatusCode, err)
	}
	key := r.key
	if k, err := strconv.Unquote(key); err == nil && strings.HasPrefix(key, `"`) {
		key = k
	}
	var out []map[string]any
	for _, d := range list.DeadLetters {
		if d["idempotency_key"] != key {
			continue
		}
		for _, k := range variableDeadLetterFields {
			delete(d, k)
		}
		out = append(out, d)
	}
	return out
}

// Len is the length of what was written so far.
func (b *syncBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}
