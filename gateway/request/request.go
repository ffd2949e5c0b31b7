// Package request runs the client requests under /v1, from their plan to
// their end: it reads and routes a request, builds its plan (the hops,
// each with its credential and the objects checked as owned for it),
// runs it keyed — claim, one call that outlives its client, settle,
// commit or release — or not, and writes its log line and metrics.
//
// The gateway package wires it (echo routes, authentication, shutdown);
// the rooms below it (proxy, idempotency, outcome, ownership, limits,
// admission, deadletter) do the work.
package request

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/admission"
	"github.com/llmgate/llmgate/gateway/budget"
	"github.com/llmgate/llmgate/gateway/deadletter"
	"github.com/llmgate/llmgate/gateway/forwarded"
	"github.com/llmgate/llmgate/gateway/idempotency"
	"github.com/llmgate/llmgate/gateway/limits"
	"github.com/llmgate/llmgate/gateway/metrics"
	"github.com/llmgate/llmgate/gateway/ownership"
	"github.com/llmgate/llmgate/gateway/proxy"
	"github.com/llmgate/llmgate/gateway/timeline"
	"github.com/llmgate/llmgate/gateway/tracing"
)

// Options configure a Handler. Every field but Logger, Now, Tracer,
// Space, ForwardSecret and Budgets is required.
type Options struct {
	Config config.Config
	// Logger: if nil, logs are discarded.
	Logger *slog.Logger
	// Now is the clock. If nil, time.Now.
	Now      func() time.Time
	Router   *proxy.Router
	Proxy    *proxy.Proxy
	Keeper   *idempotency.Keeper
	Metrics  *metrics.Metrics
	Timeline *timeline.Timeline
	// Tracer makes a span per request. If nil, tracing is off.
	Tracer      *tracing.Tracer
	DeadLetters *deadletter.Queue
	Limits      *limits.Limiter
	Owners      *ownership.Owners
	// Admit bounds request bytes in memory, Spooled request bytes
	// spooled to disk, across requests.
	Admit, Spooled *admission.Bound
	// Space is the store's room, ok=false when it cannot tell. If nil,
	// the store is never taken as full.
	Space func() (sp cache.Space, ok bool)
	// ForwardSecret keys the Idempotency-Key forwarded upstream.
	ForwardSecret []byte
	// Budgets charge the clients' runs to their budgets. If nil, no
	// client has one.
	Budgets *budget.Ledger
}

// Handler serves the /v1 routes. Create it with New.
type Handler struct {
	cfg      config.Config
	log      *slog.Logger
	now      func() time.Time
	router   *proxy.Router
	proxy    *proxy.Proxy
	keeper   *idempotency.Keeper
	metrics  *metrics.Metrics
	timeline *timeline.Timeline
	tracer   *tracing.Tracer
	dlq      *deadletter.Queue
	limits   *limits.Limiter
	admit    *admission.Bound
	spooled  *admission.Bound
	work     *workSet
	callers  *callers // the goroutines keyed calls run on
	live     liveSet  // keyed streams running here, for duplicates to join
	space    func() (cache.Space, bool)
	// owners records and checks who created which provider object;
	// apiKeys are the clients' own upstream keys (see owners.go); tenants:
	// clients are configured, so keys shared between them are llmgate's to
	// keep apart.
	owners  *ownership.Owners
	apiKeys map[string]map[string]string
	tenants bool
	// derive maps a client's name to the header it derives idempotency
	// keys from (clients[].derive_idempotency_key), for those that do.
	derive     map[string]string
	forwardMAC *idempotency.MAC
	// proxies are server.trusted_proxies: whether a client reached the
	// gateway over TLS (a batch's results_url).
	proxies forwarded.Proxies
	budgets *budget.Ledger
}

// New returns a Handler.
func New(o Options) *Handler {
	g := &Handler{cfg: o.Config, log: o.Logger, now: o.Now, router: o.Router, proxy: o.Proxy, keeper: o.Keeper,
		metrics: o.Metrics, timeline: o.Timeline, tracer: o.Tracer, dlq: o.DeadLetters, limits: o.Limits,
		admit: o.Admit, spooled: o.Spooled, space: o.Space, owners: o.Owners, forwardMAC: idempotency.NewMAC(o.ForwardSecret), budgets: o.Budgets,
		apiKeys: clientAPIKeys(o.Config.Clients), tenants: len(o.Config.Clients) > 0, derive: deriveHeaders(o.Config.Clients),
		work: newWorkSet(o.Config.Idempotency.MaxDetached), callers: newCallers(), proxies: forwarded.New(o.Config.Server.TrustedProxyPrefixes())}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	if g.now == nil {
		g.now = time.Now
	}
	if g.space == nil {
		g.space = func() (cache.Space, bool) { return cache.Space{}, false }
	}
	return g
}

// Routes registers the /v1 routes on v1: the completion endpoints, the
// models, the passthrough surface, and Anthropic's message batches.
func (g *Handler) Routes(v1 *echo.Group) {
	for _, ep := range postEndpoints {
		v1.POST(strings.TrimPrefix(ep.path, "/v1"), g.handlePost(ep))
	}
	v1.GET("/models", g.handleModels)
	v1.GET("/models/*", g.handleModel)
	g.passthroughRoutes(v1)
	g.batchRoutes(v1)
}

// Endpoints are the paths of the completion endpoints, for the admin view.
func Endpoints() []string {
	eps := make([]string, len(postEndpoints))
	for i, ep := range postEndpoints {
		eps[i] = ep.path
	}
	return eps
}

// endpoint is one POST route under /v1.
type endpoint struct {
	path   string // "/v1/chat/completions"
	suffix string // "/chat/completions", appended to an upstream's base_url
	label  string // metrics label
	// api is the provider API it speaks, for routing, classification,
	// streams and the shape of errors.
	api *proxy.API
	// query: the client's query string is forwarded (Claude Code posts
	// /v1/messages?beta=true).
	query bool
	// noOutput: its answers have no output tokens (embeddings), so its
	// budget reservation is its input's.
	noOutput bool
}

// output is what a request to ep may produce, for its reservation.
func (ep endpoint) output(rt routing) budget.Output {
	return budget.Output{MaxTokens: rt.MaxTokens, Choices: rt.Choices, Prompts: rt.Prompts, None: ep.noOutput,
		Later: rt.Background && ep.suffix == "/responses"}
}

// typed refuses, as a 400, a field the gateway reads for ep written so
// that an upstream could read it otherwise:
//   - a count of output (max_tokens, n…) that is not a number or null, or
//     spelled otherwise ("MAX_TOKENS": a Go upstream reads it, a Python
//     one does not), where output is reserved (not on embeddings or
//     count_tokens): the budget would not count what a lenient upstream
//     runs ("200" as 200 choices);
//   - on /v1/responses, background that is not a boolean or null, and the
//     ids an ownership check reads (previous_response_id, conversation)
//     as a type that holds no id (["resp_…"], which a coercing upstream
//     would continue unchecked).
//
// OpenAI and Anthropic refuse such bodies themselves.
func (ep endpoint) typed(rt routing) error {
	if rt.uncounted != "" && !ep.noOutput && ep.api.Billed() {
		if rt.misspelled {
			return &fieldError{Param: rt.uncounted, Msg: rt.uncounted + " must be spelled exactly so (lower case): an upstream that reads keys exactly would not see it"}
		}
		return &fieldError{Param: rt.uncounted, Msg: rt.uncounted + " must be an integer"}
	}
	if ep.suffix != "/responses" {
		return nil
	}
	if rt.untypedBackground {
		return &fieldError{Param: "background", Msg: "background must be a boolean"}
	}
	if v := rt.Raw.PreviousResponseID; v != nil && v[0] != '"' && string(v) != "null" {
		return &fieldError{Param: "previous_response_id", Msg: "previous_response_id must be a string"}
	}
	if v := rt.Raw.Conversation; v != nil && v[0] != '"' && v[0] != '{' && string(v) != "null" {
		return &fieldError{Param: "conversation", Msg: "conversation must be a string or an object"}
	}
	return nil
}

var postEndpoints = []endpoint{
	{path: "/v1/chat/completions", suffix: "/chat/completions", label: "chat_completions", api: proxy.ChatCompletions},
	{path: "/v1/completions", suffix: "/completions", label: "completions", api: proxy.Completions},
	{path: "/v1/embeddings", suffix: "/embeddings", label: "embeddings", api: proxy.Plain, noOutput: true},
	{path: "/v1/responses", suffix: "/responses", label: "responses", api: proxy.Responses},
	// Anthropic's base_url is its API root without /v1, as its docs give it.
	{path: "/v1/messages", suffix: "/v1/messages", label: "messages", api: proxy.Messages, query: true},
	{path: "/v1/messages/count_tokens", suffix: "/v1/messages/count_tokens", label: "count_tokens", api: proxy.CountTokens, query: true},
}

// Detached is how many keyed calls run on after their client stopped
// waiting (the llmgate_detached_calls gauge).
func (g *Handler) Detached() int64 { return g.work.detached.Load() }

// Drain gives the keyed calls still running until ctx ends to finish and
// commit; then it cancels the rest, which release their keys and record
// their dead letters within wait.
func (g *Handler) Drain(ctx context.Context, wait time.Duration) { g.work.Drain(ctx, wait) }

// Close ends the goroutines kept for keyed calls (see callers) once their
// calls end. Call it after Drain.
func (g *Handler) Close() { g.callers.stop() }

// WaitCalls waits until no keyed call is running.
func (g *Handler) WaitCalls() { g.work.wg.Wait() }

type apiCtxKey struct{}

// withRouteAPI is r carrying the API of the route it matched (route, the
// echo path pattern; for a method no route of its path serves, the route
// of its path): the errors the gateway makes for it are in that
// API's shape, whichever room makes them (authentication, limits, the
// idempotency store, a breaker). Every other route under /v1/messages
// (the message batches, and the 404 of a path none of them is) is
// Anthropic's; a route both APIs have (sharedRoutes) is Anthropic's on a
// request that sends anthropic-version, as every Anthropic SDK does and no
// OpenAI one; any other route of no endpoint is OpenAI's.
func withRouteAPI(r *http.Request, route string) *http.Request {
	for _, ep := range postEndpoints {
		if ep.path == route {
			return r.WithContext(context.WithValue(r.Context(), apiCtxKey{}, ep.api))
		}
	}
	if route == unmatched {
		// No route of this method: the path's, had it been one of them
		// (OPTIONS on /v1/messages, POST on /v1/models).
		route = routeOf(r.URL.Path)
	}
	if route == "/v1/messages" || strings.HasPrefix(route, "/v1/messages/") {
		return r.WithContext(context.WithValue(r.Context(), apiCtxKey{}, proxy.MessageBatches))
	}
	if _, anthropic := r.Header["Anthropic-Version"]; anthropic && sharedRoutes[route] {
		return r.WithContext(context.WithValue(r.Context(), apiCtxKey{}, proxy.AnthropicPlain))
	}
	return r
}

// unmatched is the route of a /v1 request no route of its method took
// (the group's RouteNotFound).
const unmatched = "/v1/*"

// routeOf is the route pattern of the Anthropic or shared routes path
// falls under ("/v1/models/*" for "/v1/models/x"), or path itself.
func routeOf(path string) string {
	for _, prefix := range []string{"/v1/messages", "/v1/models", "/v1/files"} {
		switch rest, ok := strings.CutPrefix(path, prefix); {
		case !ok:
		case rest == "":
			return prefix
		case rest[0] == '/':
			return prefix + "/*"
		}
	}
	return path
}

// sharedRoutes are the routes both OpenAI's API and Anthropic's have: the
// models and the Files API.
var sharedRoutes = map[string]bool{"/v1/models": true, "/v1/models/*": true, "/v1/files": true, "/v1/files/*": true}

// APIOf is the API of the route r matched: the shape its errors are
// written in (proxy.API.WriteError). proxy.Plain, OpenAI's, for a route of
// no endpoint or outside /v1.
func APIOf(r *http.Request) *proxy.API {
	if api, ok := r.Context().Value(apiCtxKey{}).(*proxy.API); ok {
		return api
	}
	return proxy.Plain
}

type clientCtxKey struct{}

// WithClient is r authenticated as client.
func WithClient(r *http.Request, client string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), clientCtxKey{}, client))
}

// ClientOf is the client name r was authenticated as ("" when no clients
// are configured).
func ClientOf(r *http.Request) string {
	s, _ := r.Context().Value(clientCtxKey{}).(string)
	return s
}

// deriveHeaders indexes the clients' derive_idempotency_key headers by
// client name.
func deriveHeaders(clients []config.Client) map[string]string {
	m := map[string]string{}
	for _, c := range clients {
		if h := c.DeriveIdempotencyKey.FromHeader; h != "" {
			m[c.Name] = h
		}
	}
	return m
}
