// Package gateway is llmgate's HTTP surface: the echo server, its routes
// and middleware (authentication, request id, one log line and the metrics
// per request, panics), the one error handler that writes OpenAI error
// objects, and the request path that ties the rooms below together:
//
//	handler.go   a POST under /v1: parse, route, keyed or not
//	keyed.go     a keyed request: claim → execute → settle → commit/release
//	proxy/       breaker and the one retry loop per upstream; relay JSON/SSE
//	idempotency/ claim, lease, commit, release, replay
//	outcome/     the one place a request's end is settled
//	deadletter/  failed keyed requests: record, alert, paced replay
//	limits/      per-client rate, concurrency and stored-bytes limits
//	admin/       the operator's API and page
//
// Echo stops here: the rooms take http.ResponseWriter and *http.Request.
package gateway

import (
	"cmp"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/admin"
	"github.com/llmgate/llmgate/gateway/admission"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/budget"
	"github.com/llmgate/llmgate/gateway/deadletter"
	"github.com/llmgate/llmgate/gateway/forwarded"
	"github.com/llmgate/llmgate/gateway/idempotency"
	"github.com/llmgate/llmgate/gateway/limits"
	"github.com/llmgate/llmgate/gateway/metrics"
	"github.com/llmgate/llmgate/gateway/ownership"
	"github.com/llmgate/llmgate/gateway/proxy"
	"github.com/llmgate/llmgate/gateway/readdeadline"
	"github.com/llmgate/llmgate/gateway/request"
	"github.com/llmgate/llmgate/gateway/retry"
	"github.com/llmgate/llmgate/gateway/timeline"
	"github.com/llmgate/llmgate/gateway/tracing"
)

// Store is the whole store the gateway is given: what keyed requests, the
// admin API, readiness and dead letters need. The Badger and Redis stores
// implement it.
type Store interface {
	idempotency.Store
	admin.Store
	limits.Store
	ownership.Store
	budget.Store
	// PurgeScope deletes every record and dead letter of a client (see
	// package cache).
	PurgeScope(ctx context.Context, scope string) (cache.Purged, error)
	Ping(ctx context.Context) error
}

// Options configure a Gateway.
type Options struct {
	// Config is the validated configuration.
	Config config.Config
	// Store holds idempotency records. Required.
	Store Store
	// Logger receives one line per request and operational events. If nil,
	// logs are discarded.
	Logger *slog.Logger
	// Registry receives the gateway's metrics and is served on /metrics.
	// If nil, a new registry is used.
	Registry *prometheus.Registry
	// Now is the clock for request timing, deadlines, the retry budget and
	// dead letters. If nil, time.Now.
	Now func() time.Time
	// LimitsNow is the clock of the per-client limits: their token buckets
	// and the hours stored bytes expire in. If nil, time.Now. It is apart
	// from Now so a test can move it by hours without moving deadlines.
	LimitsNow func() time.Time
	// AdminSignInCode, if set, is a one-time code that opens the admin page
	// once from this machine (admin.Options.SignInCode). `gateway -demo`
	// sets it.
	AdminSignInCode string
	// Tracer makes a span per /v1 request and per upstream attempt. If
	// nil, tracing is off.
	Tracer *tracing.Tracer
	// AdmissionAfter is the timer of a request's wait for room under
	// limits.max_inflight_bytes. If nil, time.After.
	AdmissionAfter func(time.Duration) <-chan time.Time
}

// Gateway serves the OpenAI-compatible API. Create it with New.
type Gateway struct {
	cfg      config.Config
	store    Store
	log      *slog.Logger
	now      func() time.Time
	router   *proxy.Router
	proxy    *proxy.Proxy
	keeper   *idempotency.Keeper
	breakers *breaker.Registry
	metrics  *metrics.Metrics
	registry *prometheus.Registry
	echo     *echo.Echo
	clients  []clientKey
	dlq      *deadletter.Queue
	admin    *admin.Admin
	limits   *limits.Limiter
	admit    *admission.Bound // request bytes in memory, across requests
	spooled  *admission.Bound // request bytes spooled to disk, across requests
	requests *request.Handler
	timeline *timeline.Timeline // the operator's page's charts
	tracer   *tracing.Tracer
	// owners records and checks who created which provider object.
	owners *ownership.Owners
	// forwardSecret keys the Idempotency-Key forwarded upstream.
	forwardSecret []byte
	ready         atomic.Bool
	shutdown      chan struct{}
	closing       atomic.Bool
}

type clientKey struct {
	name string
	hash [32]byte
}

// New builds a Gateway from validated configuration.
func New(o Options) (*Gateway, error) {
	if o.Store == nil {
		return nil, errors.New("gateway: Options.Store is required")
	}
	g := &Gateway{cfg: o.Config, store: o.Store, log: o.Logger, now: o.Now, registry: o.Registry, shutdown: make(chan struct{}),
		forwardSecret: []byte(o.Config.Idempotency.ForwardKeySecret), tracer: o.Tracer}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	if g.now == nil {
		g.now = time.Now
	}
	if g.registry == nil {
		g.registry = newProcessRegistry()
	}
	r, err := proxy.NewRouter(o.Config.Upstreams)
	if err != nil {
		return nil, err
	}
	g.router = r
	for _, c := range o.Config.Clients {
		digest, err := c.Digest()
		if err != nil {
			return nil, err
		}
		g.clients = append(g.clients, clientKey{name: c.Name, hash: digest})
	}
	g.owners = ownership.New(ownership.Options{Store: o.Store, TTL: o.Config.Ownership.TTL})
	g.metrics = metrics.New(g.registry, exactModels(r))
	g.metrics.SetClients(clientNames(g.clients))
	g.breakers = g.newBreakers(r)
	// Before anything can change a breaker's state (admin.New may apply a
	// shared override): OnStateChange tells the timeline.
	g.timeline = timeline.New(timeline.Options{Upstreams: g.breakers.Names(), Now: g.now})
	g.proxy = proxy.New(proxy.Options{Config: o.Config, Router: r, Breakers: g.breakers, Metrics: g.metrics,
		Logger: g.log, Now: g.now, Shutdown: g.shutdown, Tracer: o.Tracer,
		Budget: retry.NewBudget(retry.BudgetOptions{
			Ratio:        o.Config.Retry.BudgetRatio,
			MinPerSecond: o.Config.Retry.BudgetMinPerSecond,
			Window:       o.Config.Retry.BudgetWindow.D(),
			Now:          g.now,
			ClientShare:  len(o.Config.Clients) >= 2,
		})})
	g.keeper = idempotency.New(idempotency.Options{Store: o.Store, Metrics: g.metrics, Logger: g.log,
		Lease: o.Config.Idempotency.Lease.D(), WaitTimeout: o.Config.Idempotency.WaitTimeout.D(), OpTimeout: o.Config.Store.OpTimeout.D()})
	g.registerGauges()
	g.registerSpace()
	g.limits = limits.New(limits.Options{Config: o.Config, Store: o.Store, Metrics: g.metrics, Logger: g.log, Now: o.LimitsNow})
	g.admit = admission.New(admission.Options{Limit: o.Config.Limits.MaxInflightBytes, Wait: o.Config.Limits.AdmissionWait.D(),
		After: o.AdmissionAfter, Registerer: g.registry, Share: clientShare(o.Config.Limits)})
	g.spooled = admission.New(admission.Options{Limit: cmp.Or(o.Config.Passthrough.SpoolMaxTotalBytes, config.DefaultSpoolMaxTotalBytes),
		Wait: o.Config.Limits.AdmissionWait.D(), After: o.AdmissionAfter, Setting: "passthrough.spool_max_total_bytes", Share: spoolShare(&o.Config)})
	g.dlq = deadletter.New(deadletter.Options{Store: o.Store, Metrics: g.metrics, Config: o.Config.DeadLetters, Logger: g.log, Now: g.now,
		OnRecord: g.timeline.DeadLetter})
	ledger := g.newLedger(o)
	budgets := budget.NewView(ledger, budget.ViewOptions{Timeout: o.Config.Store.OpTimeout.D()})
	g.registry.MustRegister(budgets)
	g.requests = request.New(request.Options{Config: o.Config, Logger: g.log, Now: g.now, Router: r, Proxy: g.proxy, Keeper: g.keeper,
		Metrics: g.metrics, Timeline: g.timeline, Tracer: o.Tracer, DeadLetters: g.dlq, Limits: g.limits, Owners: g.owners,
		Admit: g.admit, Spooled: g.spooled, Space: g.space, ForwardSecret: g.forwardSecret, Budgets: ledger})
	g.admin = admin.New(admin.Options{Config: o.Config, Store: o.Store, Breakers: g.breakers, Metrics: g.metrics,
		DeadLetters: g.dlq, Endpoints: request.Endpoints(), Logger: g.log, Now: g.now, SignInCode: o.AdminSignInCode, Timeline: g.timeline,
		Budgets: budgets})
	g.echo = g.routes()
	g.dlq.SetHandler(g.echo)
	g.ready.Store(true)
	return g, nil
}

// newProcessRegistry is the registry a Gateway makes for itself: it also
// carries the Go runtime's figures — heap, heap goal, GC cycles and the CPU
// time GC takes (the load tool reads them; an operator sizing a memory
// limit needs them) — and the process's.
func newProcessRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsGC,
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/cpu/classes/(gc/total|total):`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return r
}

// registerGauges registers the gauges read from the gateway's own state:
// detached keyed calls and the store's records.
func (g *Gateway) registerGauges() {
	g.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "llmgate_detached_calls", Help: "Keyed calls running on after their client stopped waiting (idempotency.max_detached bounds them).",
	}, func() float64 { return float64(g.requests.Detached()) }))
	g.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "llmgate_store_records", Help: "Idempotency records in the store (committed and in flight).",
	}, func() float64 {
		st := g.store.Stats()
		g.timeline.StoreSize(st) // a sample for the page's chart, taken where Stats is read anyway
		return float64(st.Records)
	}))
}

// exactModels are the configured model names without wildcards: each is
// its own metrics label.
func exactModels(r *proxy.Router) []string {
	var exact []string
	for _, u := range r.Upstreams() {
		for _, m := range u.Cfg.Models {
			if !strings.Contains(m, "*") {
				exact = append(exact, m)
			}
		}
	}
	return exact
}

func (g *Gateway) newBreakers(r *proxy.Router) *breaker.Registry {
	ups := make([]breaker.Upstream, 0, len(r.Upstreams()))
	for _, u := range r.Upstreams() {
		ups = append(ups, breaker.Upstream{Name: u.Cfg.Name, Models: u.Cfg.Models})
	}
	bc := g.cfg.Breaker
	var reg *breaker.Registry
	reg = breaker.New(ups, breaker.Settings{
		ConsecutiveFailures: bc.ConsecutiveFailures,
		FailureRatio:        bc.FailureRatio,
		MinRequests:         bc.MinRequests,
		Interval:            bc.Interval.D(),
		OpenTimeout:         bc.OpenTimeout.D(),
		HalfOpenRequests:    bc.HalfOpenRequests,
		Scope:               breaker.Scope(bc.Scope),
		OnStateChange: func(k breaker.Key, from, to breaker.State) {
			g.metrics.BreakerChange(k, from, to)
			// The charts have a lane per upstream: the worst of its breakers.
			g.timeline.BreakerState(k.Upstream, reg.UpstreamState(k.Upstream))
			g.log.Warn("circuit breaker state changed", "upstream", k.Upstream, "model", k.Model, "from", from, "to", to)
		},
		OnUntracked: func(k breaker.Key) {
			g.log.Warn("model gets no circuit breaker of its own: the upstream already keeps the most learned models it keeps; "+
				"only connection failures guard it (name the model in the upstream's models to give it one)",
				"upstream", k.Upstream, "model", k.Model, "learned_models", breaker.DefaultMaxLearnedModels)
		},
	})
	for _, k := range reg.Keys() {
		g.metrics.BreakerChange(k, breaker.Closed, breaker.Closed)
	}
	return reg
}

// Handler returns the gateway's HTTP handler.
func (g *Gateway) Handler() http.Handler { return g.echo }

// BeginShutdown makes /readyz answer 503 and ends every retry wait, so a
// load balancer stops sending traffic while in-flight requests finish.
func (g *Gateway) BeginShutdown() {
	g.ready.Store(false)
	if g.closing.CompareAndSwap(false, true) {
		close(g.shutdown)
	}
}

// Drain gives the keyed calls still running (their clients gone, or past
// their X-Llmgate-Deadline) until ctx ends to finish and commit; then it
// cancels the rest, which release their keys and record their dead letters
// (within store.op_timeout). Call it after the server has shut down,
// before Close and before the store closes.
func (g *Gateway) Drain(ctx context.Context) {
	g.BeginShutdown()
	g.requests.Drain(ctx, 2*g.cfg.Store.OpTimeout.D())
}

// Close stops the dead-letter monitor, following shared overrides and
// counting clients' stored bytes, ends the goroutines kept for keyed calls
// and releases idle upstream connections. Call it after the server has shut
// down and Drain returned, before the store closes.
func (g *Gateway) Close() {
	g.requests.Close()
	g.limits.Close()
	g.admin.Close()
	g.dlq.Close()
	g.router.Close()
}

func (g *Gateway) routes() *echo.Echo {
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = g.errorHandler
	// The client's address is the connection's, unless the connection
	// comes from one of server.trusted_proxies: X-Forwarded-For and
	// X-Real-IP are set by whoever sends the request, so from anyone else
	// they are not believed (GO-2026-6875). X-Real-IP never is.
	e.IPExtractor = forwarded.New(g.cfg.Server.TrustedProxyPrefixes()).ClientIP
	// requestLog is outermost so that it sees what recoverer made of a
	// panic, and an aborted response too.
	e.Use(g.requests.RequestLog, g.recoverer)
	// Every request body is read against the short deadline until the
	// request is known to come from a client; authenticate's successor in
	// the /v1 group below extends it.
	short, long := g.cfg.Server.UnauthenticatedReadBodyTimeout.D(), g.cfg.Server.ReadBodyTimeout.D()
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			c.SetRequest(readdeadline.Start(c.Response(), c.Request(), short))
			return next(c)
		}
	})

	e.GET("/healthz", func(c echo.Context) error { return c.String(http.StatusOK, "ok\n") })
	e.GET("/readyz", g.readyz)

	v1 := e.Group("/v1", g.authenticate, func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			readdeadline.Extend(c.Request(), long)
			return next(c)
		}
	})
	g.requests.Routes(v1)
	v1.RouteNotFound("/*", func(echo.Context) error { return echo.ErrNotFound })

	g.admin.Routes(e)
	e.DELETE("/admin/clients/:name/data", g.admin.PurgeClientData(g), g.admin.Auth)
	e.GET("/admin/clients", g.admin.Clients, g.admin.Auth)
	e.GET("/admin/clients/:name", g.admin.Client, g.admin.Auth)
	// GET only: a signed-in page's cookie opens it (admin.MetricsAuth).
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(g.registry, promhttp.HandlerOpts{})), g.admin.MetricsAuth)
	e.RouteNotFound("/*", func(echo.Context) error { return echo.ErrNotFound })
	return e
}

// errorHandler is echo's single error path: every error becomes an error
// object in the shape of the route's API (request.APIOf: OpenAI's, or
// Anthropic's on /v1/messages); the detail behind it goes to the log line,
// not the client.
func (g *Gateway) errorHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	api := request.APIOf(c.Request())
	api.WriteError(c.Response(), fromEcho(err, api.Provider() == config.APIAnthropic))
}

// fromEcho gives echo's own errors (404 for unknown routes, 405, 413) an
// error of the gateway's, which the route's API shapes (a 404 points at
// that API's docs); any other error passes to apierror.Wire unchanged.
func fromEcho(err error, anthropic bool) error {
	var he *echo.HTTPError
	if !errors.As(err, &he) {
		return err
	}
	switch he.Code {
	case http.StatusNotFound:
		docs := "https://platform.openai.com/docs/api-reference/"
		if anthropic {
			docs = "https://docs.anthropic.com/en/api/"
		}
		return &apierror.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "unknown_url",
			Message: "Unknown request URL. Please check the URL for typos, or see the docs at " + docs + ".", Err: err}
	case http.StatusMethodNotAllowed:
		return &apierror.Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
			Message: "Method not allowed for this URL.", Err: err}
	case http.StatusRequestEntityTooLarge:
		return &apierror.Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
			Message: "Request body too large.", Err: err}
	}
	msg := http.StatusText(he.Code)
	if msg == "" {
		msg = "error"
	}
	return &apierror.Error{Status: he.Code, Type: "invalid_request_error", Message: msg, Err: err}
}

// recoverer turns a panic into a 500 with no stack trace for the client;
// the stack goes to the log. http.ErrAbortHandler passes through: it is how
// a relay aborts a response whose headers are already sent.
func (g *Gateway) recoverer(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) (err error) {
		defer func() {
			if r := recover(); r != nil {
				if r == http.ErrAbortHandler {
					panic(r)
				}
				if c.Response().Committed {
					// Headers are out: a 500 cannot be sent, and returning
					// would end the response as if it were whole. Abort.
					g.log.Error("panic serving request", "panic", fmt.Sprint(r), "path", request.LogPath(c.Request().URL.Path))
					panic(http.ErrAbortHandler)
				}
				g.log.Error("panic serving request", "panic", fmt.Sprint(r), "path", request.LogPath(c.Request().URL.Path))
				err = &apierror.Error{Status: http.StatusInternalServerError, Type: "server_error", Code: "internal_error",
					Message: "The gateway failed to handle the request; see its log for details.", Err: fmt.Errorf("panic: %v", r)}
			}
		}()
		return next(c)
	}
}

func (g *Gateway) readyz(c echo.Context) error {
	if !g.ready.Load() {
		return c.String(http.StatusServiceUnavailable, "shutting down\n")
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
	defer cancel()
	if err := g.store.Ping(ctx); err != nil {
		g.log.Warn("readiness: store unavailable", "err", err)
		return c.String(http.StatusServiceUnavailable, "store unavailable\n")
	}
	// A full store stays ready: the gateway still serves unkeyed requests
	// and replays, and taking it out of the load balancer would turn that
	// partial service into none (with Badger there is no other replica to
	// go to, and a full Redis is full for every replica).
	if msg := g.spaceReady(); msg != "" {
		return c.String(http.StatusOK, msg)
	}
	return c.String(http.StatusOK, "ready\n")
}

// PurgeClient forgets a client's data: every idempotency record and dead
// letter stored under its name, and what its storage limit counted of
// them. A client removed from the config may be purged too.
func (g *Gateway) PurgeClient(ctx context.Context, name string) (cache.Purged, error) {
	p, err := g.store.PurgeScope(ctx, name)
	if err == nil {
		g.limits.Forget(name)
	}
	return p, err
}

// authenticate maps "Authorization: Bearer <key>" to a client name. With no
// clients configured every request is the shared scope "". Keys are
// compared as SHA-256 digests in constant time, against every client, so
// neither timing nor position tells an attacker anything.
func (g *Gateway) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		name, ok := deadletter.ReplayClient(r.Context())
		if !ok && len(g.clients) > 0 {
			var err error
			if name, err = g.clientName(r); err != nil {
				return err
			}
			ok = true
		}
		if ok {
			r = request.WithClient(r, name)
		}
		r, err := request.WithTenant(r)
		if err != nil {
			return err
		}
		c.SetRequest(r)
		return next(c)
	}
}

func (g *Gateway) clientName(r *http.Request) (string, error) {
	tok, err := credential(r.Header)
	if err != nil {
		return "", err
	}
	sum := config.KeyDigest(tok)
	name, found := "", 0
	for _, ck := range g.clients {
		if subtle.ConstantTimeCompare(sum[:], ck.hash[:]) == 1 {
			name, found = ck.name, 1
		}
	}
	if found == 0 {
		return "", &apierror.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
			Message: "Incorrect API key provided."}
	}
	return name, nil
}

// clientNames are the configured clients' names: the values of the
// client label.
func clientNames(cs []clientKey) []string {
	names := make([]string, len(cs))
	for i, c := range cs {
		names[i] = c.name
	}
	return names
}

// credential is the client key a request carries: "Authorization: Bearer
// <key>", or "x-api-key: <key>" (as Anthropic's SDKs send it), or both
// naming the same key. An ambiguous credential — either header twice, or
// both naming different keys — is refused with a 400, as duplicate JSON
// fields are: were one of them picked, a proxy in front that checks the
// other would authorize one client and the gateway serve another.
func credential(h http.Header) (string, error) {
	auth, xkey := h.Values("Authorization"), h.Values("X-Api-Key")
	if len(auth) > 1 || len(xkey) > 1 {
		return "", ambiguousCredentials("The request has more than one Authorization or x-api-key header.")
	}
	var tok string
	if len(auth) == 1 {
		bearer, ok := admin.Bearer(auth[0])
		if !ok && len(xkey) == 1 {
			return "", ambiguousCredentials("The request has an x-api-key header and an Authorization header that is not 'Bearer <key>'.")
		}
		tok = bearer
	}
	if len(xkey) == 1 {
		k := strings.TrimSpace(xkey[0])
		if tok != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(k)) != 1 {
			return "", ambiguousCredentials("The request's Authorization and x-api-key headers name different keys.")
		}
		tok = k
	}
	if tok == "" {
		return "", &apierror.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
			Message: "You didn't provide an API key. Send your llmgate key as 'Authorization: Bearer <key>'."}
	}
	return tok, nil
}

func ambiguousCredentials(what string) *apierror.Error {
	return &apierror.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "ambiguous_credentials",
		Message: what + " Send your llmgate key once, as 'Authorization: Bearer <key>' (or 'x-api-key: <key>')."}
}

// clientShare is the most request bytes in memory one client may hold:
// half of limits.max_inflight_bytes, so that one tenant trickling bodies
// leaves the other half to the rest, but at least one body of
// limits.max_body_bytes, so that any allowed request can be read (a body
// holds no byte past its own: admission.Reservation.Body).
func clientShare(l config.Limits) int64 {
	if l.MaxInflightBytes <= 0 {
		return 0
	}
	return max(l.MaxInflightBytes/2, l.MaxBodyBytes)
}

// spoolShare is the most request bytes one client may hold spooled to
// disk: half of passthrough.spool_max_total_bytes, so that one tenant's
// uploads leave the other half to the rest, but at least one body of the
// largest size a route may spool (and the byte read past it), so that any
// allowed upload can be spooled.
func spoolShare(c *config.Config) int64 {
	largest := c.Limits.MaxBodyBytes
	uploads := map[string]int64{"/v1/files": config.DefaultUploadBodyBytes, "/v1/uploads": config.DefaultUploadBodyBytes}
	for _, r := range c.Passthrough.Routes {
		if _, ok := uploads[r.Prefix]; ok && r.MaxBodyBytes > 0 {
			uploads[r.Prefix] = r.MaxBodyBytes
		}
		largest = max(largest, r.MaxBodyBytes)
	}
	for _, n := range uploads {
		largest = max(largest, n)
	}
	return max(cmp.Or(c.Passthrough.SpoolMaxTotalBytes, config.DefaultSpoolMaxTotalBytes)/2, largest+1)
}

// DeadlineHeader lets a client shorten the configured total deadline for
// one request: a Go duration ("30s") or a number of seconds ("30").
const DeadlineHeader = request.DeadlineHeader

// newLedger is the clients' budgets (their own and tokens_per_minute;
// with no clients, the shared scope's tokens_per_minute), priced by the
// upstreams' prices, kept in the store.
func (g *Gateway) newLedger(o Options) *budget.Ledger {
	budgets, allow := map[string][]config.Budget{}, map[string]bool{}
	clients := o.Config.Clients
	if len(clients) == 0 {
		clients = []config.Client{{}} // the one shared scope, ""
	}
	for _, c := range clients {
		if b := c.AllBudgets(o.Config.ClientLimits); len(b) > 0 {
			budgets[c.Name] = b
			allow[c.Name] = c.UnmeteredAllowed(o.Config.Budgets.AllowUnmetered)
		}
	}
	ups := make(map[string]config.Upstream, len(o.Config.Upstreams))
	for _, u := range o.Config.Upstreams {
		ups[u.Name] = u
	}
	return budget.New(budget.Options{Budgets: budgets, AllowUnmetered: allow, Upstreams: ups, Settings: o.Config.Budgets, Deadline: o.Config.Retry.Deadline.D(),
		Store: o.Store, Metrics: g.metrics, Now: g.now, Logger: g.log})
}
