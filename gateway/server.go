// Package gateway is llmgate's HTTP surface and the orchestration of a
// request: authentication, routing a model to its upstream chain, the
// idempotency store, the circuit breaker per upstream around the one retry
// loop, and relaying bytes — JSON bodies and SSE streams — exactly as the
// upstream sent them.
//
// Read it in request order: server.go (routes, middleware), handler.go (a
// POST under /v1), keyed.go (Idempotency-Key), exec.go (breaker and retry
// around each upstream attempt), stream.go (relaying and recording SSE).
package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/retry"
)

// KeyStore is what a keyed request needs of the idempotency store: an
// atomic claim with a lease and an owner token, renewal while the call
// runs, commit or release by the owner, and a way to wait for another
// request's commit. cache.Badger and cache.Redis implement it.
type KeyStore interface {
	Claim(ctx context.Context, k cache.Key, fingerprint string, lease time.Duration) (cache.Claim, error)
	Renew(ctx context.Context, k cache.Key, owner string, lease time.Duration) error
	Commit(ctx context.Context, k cache.Key, owner string, rec *cache.Record, ttl time.Duration) error
	Release(ctx context.Context, k cache.Key, owner string) error
	Wait(ctx context.Context, k cache.Key) error
}

// AdminStore is what the admin API and readiness need of the store.
type AdminStore interface {
	Get(ctx context.Context, k cache.Key) (*cache.Record, error)
	Delete(ctx context.Context, k cache.Key) error
	Ping(ctx context.Context) error
	Stats() cache.Stats
}

// Store is the whole store the gateway is given.
type Store interface {
	KeyStore
	AdminStore
	DeadLetterStore
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
	// Now is the clock. If nil, time.Now.
	Now func() time.Time
}

// Gateway serves the OpenAI-compatible API. Create it with New.
type Gateway struct {
	cfg      cfg
	store    Store
	log      *slog.Logger
	now      func() time.Time
	router   *router
	breakers *breaker.Registry
	budget   *retry.Budget
	metrics  *metrics
	registry *prometheus.Registry
	echo     *echo.Echo
	clients  []clientKey
	admin    [32]byte // SHA-256 of the admin token; zero when admin is disabled

	dlq *dlqMonitor
	// shared is set when the store shares breaker overrides across
	// replicas; stopShared ends following them.
	shared     SharedBreakerOverrides
	stopShared context.CancelFunc
	ready      atomic.Bool
	shutdown   chan struct{}
	closeOnce  atomic.Bool
}

// cfg is the configuration plus derived limits.
type cfg struct{ config.Config }

func (c cfg) maxEventBytes() int {
	// One SSE event larger than a whole record could never be committed;
	// it also bounds the memory one stream can pin.
	if c.Idempotency.MaxRecordBytes > 0 && c.Idempotency.MaxRecordBytes < 16<<20 {
		return int(c.Idempotency.MaxRecordBytes)
	}
	return 16 << 20
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
	g := &Gateway{
		cfg:      cfg{o.Config},
		store:    o.Store,
		log:      o.Logger,
		now:      o.Now,
		registry: o.Registry,
		shutdown: make(chan struct{}),
	}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	if g.now == nil {
		g.now = time.Now
	}
	if g.registry == nil {
		g.registry = prometheus.NewRegistry()
	}
	r, err := newRouter(o.Config.Upstreams)
	if err != nil {
		return nil, err
	}
	g.router = r
	var exact []string
	names := make([]string, 0, len(r.upstreams))
	for _, u := range r.upstreams {
		names = append(names, u.cfg.Name)
		for _, m := range u.cfg.Models {
			if !strings.Contains(m, "*") {
				exact = append(exact, m)
			}
		}
	}
	g.metrics = newMetrics(g.registry, exact)
	bc := o.Config.Breaker
	g.breakers = breaker.New(names, breaker.Settings{
		ConsecutiveFailures: bc.ConsecutiveFailures,
		FailureRatio:        bc.FailureRatio,
		MinRequests:         bc.MinRequests,
		Interval:            bc.Interval.D(),
		OpenTimeout:         bc.OpenTimeout.D(),
		HalfOpenRequests:    bc.HalfOpenRequests,
		OnStateChange: func(name string, from, to breaker.State) {
			g.metrics.breakerChange(name, from, to)
			g.log.Warn("circuit breaker state changed", "upstream", name, "from", from, "to", to)
		},
	})
	for _, n := range names {
		g.metrics.breakerChange(n, breaker.Closed, breaker.Closed)
	}
	g.budget = retry.NewBudget(retry.BudgetOptions{
		Ratio:        o.Config.Retry.BudgetRatio,
		MinPerSecond: o.Config.Retry.BudgetMinPerSecond,
		Window:       o.Config.Retry.BudgetWindow.D(),
		Now:          g.now,
	})
	for _, c := range o.Config.Clients {
		ck := clientKey{name: c.Name}
		if c.KeySHA256 != "" {
			b, err := hex.DecodeString(c.KeySHA256)
			if err != nil || len(b) != 32 {
				return nil, fmt.Errorf("clients: %s: key_sha256 is not a hex SHA-256", c.Name)
			}
			copy(ck.hash[:], b)
		} else {
			ck.hash = sha256.Sum256([]byte(c.Key))
		}
		g.clients = append(g.clients, ck)
	}
	if o.Config.AdminToken != "" {
		g.admin = sha256.Sum256([]byte(o.Config.AdminToken))
	}
	g.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "llmgate_store_records", Help: "Idempotency records in the store (committed and in flight).",
	}, func() float64 { return float64(g.store.Stats().Records) }))
	g.echo = g.routes()
	g.dlq = newDLQMonitor(g)
	go g.dlq.run()
	if s, ok := o.Store.(SharedBreakerOverrides); ok {
		g.shared = s
		var ctx context.Context
		ctx, g.stopShared = context.WithCancel(context.Background())
		g.startOverrides(ctx, s)
	}
	g.ready.Store(true)
	return g, nil
}

// Handler returns the gateway's HTTP handler.
func (g *Gateway) Handler() http.Handler { return g.echo }

// Breakers exposes the breaker registry (for admin wiring across replicas).
func (g *Gateway) Breakers() *breaker.Registry { return g.breakers }

// BeginShutdown makes /readyz answer 503 and ends every retry wait, so a
// load balancer stops sending traffic while in-flight requests finish.
func (g *Gateway) BeginShutdown() {
	g.ready.Store(false)
	if g.closeOnce.CompareAndSwap(false, true) {
		close(g.shutdown)
	}
}

// Close stops the dead-letter monitor and releases idle upstream
// connections. Call it after the server has shut down, before the store
// closes.
func (g *Gateway) Close() {
	if g.stopShared != nil {
		g.stopShared()
	}
	g.dlq.close()
	g.router.close()
}

// endpoint is one POST route under /v1.
type endpoint struct {
	path   string // "/v1/chat/completions"
	suffix string // "/chat/completions", appended to an upstream's base_url
	label  string // metrics label
	// completion is true where a 200 body is a completion that classify
	// inspects (content_filter, empty output).
	completion bool
}

var postEndpoints = []endpoint{
	{path: "/v1/chat/completions", suffix: "/chat/completions", label: "chat_completions", completion: true},
	{path: "/v1/completions", suffix: "/completions", label: "completions", completion: true},
	{path: "/v1/embeddings", suffix: "/embeddings", label: "embeddings"},
}

func (g *Gateway) routes() *echo.Echo {
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = g.errorHandler
	// The client's address is the connection's: X-Forwarded-For and
	// X-Real-IP are set by whoever sends the request, so they are not
	// trusted (GO-2026-6875). Behind a proxy, its access log has the rest.
	e.IPExtractor = echo.ExtractIPDirect()
	e.Use(g.recoverer, g.requestLog)

	e.GET("/healthz", func(c echo.Context) error { return c.String(http.StatusOK, "ok\n") })
	e.GET("/readyz", g.readyz)

	v1 := e.Group("/v1", g.authenticate)
	for _, ep := range postEndpoints {
		v1.POST(strings.TrimPrefix(ep.path, "/v1"), g.handlePost(ep))
	}
	v1.GET("/models", g.handleModels)
	v1.RouteNotFound("/*", func(echo.Context) error { return echo.ErrNotFound })

	admin := e.Group("/admin", g.adminAuth)
	g.adminRoutes(admin)
	g.adminPageRoutes(e, admin)
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(g.registry, promhttp.HandlerOpts{})), g.adminAuth)
	e.RouteNotFound("/*", func(echo.Context) error { return echo.ErrNotFound })
	return e
}

// errorHandler is echo's single error path: every error becomes an OpenAI
// error object; the detail behind it goes to the log line, not the client.
func (g *Gateway) errorHandler(err error, c echo.Context) {
	ae := toAPIError(err)
	if info := infoOf(c); info != nil {
		info.err = err
		if info.outcome == "" {
			info.outcome = "gateway_error"
		}
	}
	if c.Response().Committed {
		return
	}
	writeAPIError(c.Response(), ae)
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
				g.log.Error("panic serving request", "panic", fmt.Sprint(r), "path", c.Request().URL.Path)
				err = &apiError{Status: http.StatusInternalServerError, Type: "server_error", Code: "internal_error",
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
	return c.String(http.StatusOK, "ready\n")
}

// authenticate maps "Authorization: Bearer <key>" to a client name. With no
// clients configured every request is the shared scope "". Keys are
// compared as SHA-256 digests in constant time, against every client, so
// neither timing nor position tells an attacker anything.
func (g *Gateway) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if name, ok := c.Request().Context().Value(replayClientKey{}).(string); ok {
			// An operator's dead-letter replay, made in-process: it runs
			// as the client that sent the original request. Nothing a
			// client sends can set a context value.
			if info := infoOf(c); info != nil {
				info.client = name
			}
			c.Set(clientCtxKey, name)
			return next(c)
		}
		if len(g.clients) == 0 {
			return next(c)
		}
		tok, ok := bearer(c.Request().Header.Get("Authorization"))
		if !ok {
			return &apiError{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
				Message: "You didn't provide an API key. Send your llmgate key as 'Authorization: Bearer <key>'."}
		}
		sum := sha256.Sum256([]byte(tok))
		name, found := "", 0
		for _, ck := range g.clients {
			if subtle.ConstantTimeCompare(sum[:], ck.hash[:]) == 1 {
				name, found = ck.name, 1
			}
		}
		if found == 0 {
			return &apiError{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
				Message: "Incorrect API key provided."}
		}
		if info := infoOf(c); info != nil {
			info.client = name
		}
		c.Set(clientCtxKey, name)
		return next(c)
	}
}

const clientCtxKey = "llmgate.client"

func clientOf(c echo.Context) string {
	s, _ := c.Get(clientCtxKey).(string)
	return s
}

func bearer(h string) (string, bool) {
	const p = "Bearer "
	if len(h) <= len(p) || !strings.EqualFold(h[:len(p)], p) {
		return "", false
	}
	return strings.TrimSpace(h[len(p):]), true
}

// adminAuth guards /admin and /metrics with the admin token. Without a
// token configured they are refused entirely.
func (g *Gateway) adminAuth(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if g.admin == ([32]byte{}) {
			return &apiError{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "admin_disabled",
				Message: "The admin API is disabled: no admin_token is configured."}
		}
		tok, ok := bearer(c.Request().Header.Get("Authorization"))
		if !ok {
			if ck, err := c.Cookie(adminCookie); err == nil {
				tok, ok = ck.Value, true
			}
		}
		sum := sha256.Sum256([]byte(tok))
		if !ok || subtle.ConstantTimeCompare(sum[:], g.admin[:]) != 1 {
			return &apiError{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_admin_token",
				Message: "Missing or wrong admin token."}
		}
		return next(c)
	}
}

const adminCookie = "llmgate_admin"
