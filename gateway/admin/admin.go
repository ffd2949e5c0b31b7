// Package admin is the operator's side of llmgate: the JSON API under
// /admin (breakers and their forced state, shared across replicas when the
// store is; idempotency records; dead letters; stats; pprof), the
// server-rendered page at /admin/, and the admin token that guards both and
// /metrics.
//
// Who may do what:
//   - The JSON API takes the admin token as a Bearer header, and nothing
//     else. A browser sends cookies with any request to their path, a
//     form's from another site included, so a cookie must not open it.
//   - The page signs a browser in on /admin/login (the token, once) and
//     gives it a cookie holding a random session id (session.go). The
//     cookie opens the page, its own form routes under /admin/ui — every
//     one of them a POST that passes an origin check (sameOrigin) — and
//     GET /metrics, which changes nothing and which another origin cannot
//     read. Signing out ends the session in the store.
//   - Failed sign-ins are slowed per source address (throttle.go).
//   - A one-time code (Options.SignInCode, which `gateway -demo` prints as
//     a link) opens one page session, once, for a browser on this machine
//     (signincode.go).
//
// It reads the request path's state only through small interfaces and
// handles (the breaker registry, the store, the dead-letter queue, the
// metrics' counts); it never reaches into a request in flight.
package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/deadletter"
	"github.com/llmgate/llmgate/gateway/forwarded"
	"github.com/llmgate/llmgate/gateway/metrics"
	"github.com/llmgate/llmgate/gateway/timeline"
)

// Store is what the admin API needs of the store.
type Store interface {
	Get(ctx context.Context, k cache.Key) (*cache.Record, error)
	Delete(ctx context.Context, k cache.Key) error
	Stats() cache.Stats
	deadletter.Store
}

// Options configure an Admin. Store, Breakers, Metrics and DeadLetters are
// required.
type Options struct {
	Config      config.Config
	Store       Store
	Breakers    *breaker.Registry
	Metrics     *metrics.Metrics
	DeadLetters *deadletter.Queue
	// Timeline holds the page's charts; if nil, the page has none.
	Timeline *timeline.Timeline
	// Budgets, if set, show each client's budgets in GET /admin/clients
	// and on the page.
	Budgets Budgets
	// Endpoints are the keyed POST paths, for looking a key up on each.
	Endpoints []string
	// Logger: if nil, logs are discarded.
	Logger *slog.Logger
	// Now is the clock. If nil, time.Now.
	Now func() time.Time
	// Throttle tunes the sign-in throttle; the zero value is the policy.
	Throttle ThrottleOptions
	// SignInCode, if set, opens the page once without the token: a browser
	// on this machine that opens SignInCodePath?code=<SignInCode> gets a
	// page session, the first time only (signincode.go). If empty, that
	// path answers 404. The caller makes it from crypto/rand; `gateway
	// -demo` does, and prints the link.
	SignInCode string
	// SignInCodeTTL is how long SignInCode is good for, from New. If <= 0,
	// DefaultSignInCodeTTL (10 minutes) is used.
	SignInCodeTTL time.Duration
}

// Admin serves the admin API and page. Close stops following shared
// breaker overrides.
type Admin struct {
	cfg       config.Config
	store     Store
	breakers  *breaker.Registry
	metrics   *metrics.Metrics
	dlq       *deadletter.Queue
	timeline  *timeline.Timeline
	budgets   Budgets
	endpoints []string
	log       *slog.Logger
	now       func() time.Time
	token     [32]byte // SHA-256 of the admin token; zero when admin is disabled

	// shared is set when the store shares breaker overrides across
	// replicas; stopShared ends following them.
	shared     SharedBreakerOverrides
	stopShared context.CancelFunc

	sessions *sessions
	logins   *throttle
	proxies  forwarded.Proxies
	// xffNoted is set once a sign-in has come with an X-Forwarded-For
	// header from a peer that is not a trusted proxy, and that was logged.
	xffNoted atomic.Bool

	// signInCode is Options.SignInCode; nil without one.
	signInCode *signInCode
}

// New returns an Admin; when the store shares breaker overrides, it starts
// following them.
func New(o Options) *Admin {
	a := &Admin{cfg: o.Config, store: o.Store, breakers: o.Breakers, metrics: o.Metrics, dlq: o.DeadLetters,
		endpoints: o.Endpoints, log: o.Logger, now: o.Now, timeline: o.Timeline, budgets: o.Budgets}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if a.now == nil {
		a.now = time.Now
	}
	if o.Config.AdminToken != "" {
		a.token = sha256.Sum256([]byte(o.Config.AdminToken))
	}
	a.proxies = forwarded.New(o.Config.Server.TrustedProxyPrefixes())
	a.logins = newThrottle(o.Throttle, a.now)
	a.sessions = &sessions{now: a.now}
	a.signInCode = newSignInCode(o, a.now())
	if s, ok := o.Store.(SessionStore); ok {
		a.sessions.store = s
	} else {
		a.sessions.store = newMemSessions(a.now)
		if _, shared := o.Store.(SharedBreakerOverrides); shared && a.enabled() {
			a.log.Warn("admin page: sign-in sessions are kept by each replica, as the store does not share them; " +
				"behind a load balancer, an operator signed in on one replica is asked to sign in again on another")
		}
	}
	if s, ok := o.Store.(SharedBreakerOverrides); ok {
		a.shared = s
		var ctx context.Context
		ctx, a.stopShared = context.WithCancel(context.Background())
		a.followOverrides(ctx, s)
	}
	return a
}

// Close stops following shared overrides.
func (a *Admin) Close() {
	if a.stopShared != nil {
		a.stopShared()
	}
}

// Routes registers the API under /admin behind Auth, and the page.
func (a *Admin) Routes(e *echo.Echo) {
	a.apiRoutes(e.Group("/admin", a.Auth))
	a.pageRoutes(e)
	e.GET(SignInCodePath, a.pageLoginOnce)
}

// SetBreakerForced is an operator's force-open (open) or close of k's
// breaker (k.Model "": the upstream's own, for every model).
func (a *Admin) SetBreakerForced(ctx context.Context, k breaker.Key, open bool) error {
	return a.setBreakerForced(ctx, k, open)
}

// Cookie is the name of the page's sign-in cookie.
const Cookie = "llmgate_admin"

func (a *Admin) enabled() bool { return a.token != ([32]byte{}) }

// tokenOK compares tok with the admin token as SHA-256 digests, in
// constant time. It is false when admin is disabled.
func (a *Admin) tokenOK(tok string) bool {
	if !a.enabled() {
		return false
	}
	sum := sha256.Sum256([]byte(tok))
	return subtle.ConstantTimeCompare(sum[:], a.token[:]) == 1
}

// disabled is the error for every admin route when no token is set.
func disabled() error {
	return &apierror.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "admin_disabled",
		Message: "The admin API is disabled: no admin_token is configured."}
}

func unauthorized(msg string) error {
	return &apierror.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_admin_token", Message: msg}
}

// Auth guards the JSON API: the admin token as a Bearer header, and
// nothing else — not the page's cookie, which a browser would attach to a
// cross-site form's request as readily as to the operator's. Without a
// token configured the API is refused entirely.
func (a *Admin) Auth(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if !a.enabled() {
			return disabled()
		}
		tok, ok := Bearer(c.Request().Header.Get("Authorization"))
		if !ok {
			if _, err := c.Cookie(Cookie); err == nil {
				return unauthorized("The admin API takes the admin token as 'Authorization: Bearer <token>'; the page's sign-in cookie opens only the page.")
			}
			return unauthorized("Missing admin token: send it as 'Authorization: Bearer <token>'.")
		}
		if !a.tokenOK(tok) {
			return unauthorized("Missing or wrong admin token.")
		}
		return next(c)
	}
}

// MetricsAuth guards GET /metrics: the Bearer token (Prometheus), or a
// signed-in page's session. The cookie is enough here because the route
// only reads — nothing a forged request could change — and a page of
// another origin cannot read the answer (no CORS). Register it on GET
// only.
func (a *Admin) MetricsAuth(next echo.HandlerFunc) echo.HandlerFunc {
	return a.pageAuth(next)
}

// pageAuth guards the page's own routes: the Bearer token, or the session
// cookie. The state-changing ones are POSTs behind sameOrigin as well.
func (a *Admin) pageAuth(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if !a.enabled() {
			return disabled()
		}
		if !a.pageAuthorized(c) {
			return unauthorized("Missing or wrong admin token, or the page's session has ended: sign in again.")
		}
		return next(c)
	}
}

// pageAuthorized reports whether the request carries the admin token as a
// Bearer header, or the cookie of a live session. A store that cannot say
// counts as no.
func (a *Admin) pageAuthorized(c echo.Context) bool {
	if tok, ok := Bearer(c.Request().Header.Get("Authorization")); ok {
		return a.tokenOK(tok)
	}
	ck, err := c.Cookie(Cookie)
	if err != nil {
		return false
	}
	ok, err := a.sessions.valid(c.Request().Context(), ck.Value)
	if err != nil {
		a.log.Warn("admin page: checking a session failed", "err", err)
	}
	return ok
}

// Bearer returns the token of an "Authorization: Bearer <token>" header.
func Bearer(h string) (string, bool) {
	const p = "Bearer "
	if len(h) <= len(p) || !strings.EqualFold(h[:len(p)], p) {
		return "", false
	}
	return strings.TrimSpace(h[len(p):]), true
}

// pathParam is the path parameter name as the client wrote it, decoded
// once. Echo routes on the request's raw path only when net/http kept
// one (the path holds an escape that its decoded form would not give
// back, such as %2F); otherwise its parameters are decoded already, and
// decoding them again would read /a%2540b as the key "a@b".
func pathParam(c echo.Context, name string) (string, error) {
	v := c.Param(name)
	if c.Request().URL.RawPath == "" {
		return v, nil
	}
	return url.PathUnescape(v)
}

func storeErr(err error) error { return &apierror.StoreUnavailable{Err: err} }

// deadLetterView is a dead letter in the admin API, its body as text.
type deadLetterView struct {
	cache.DeadLetter
	Body string `json:"body,omitempty"`
}

func filterOf(c echo.Context) cache.DeadLetterFilter {
	return cache.DeadLetterFilter{Upstream: c.QueryParam("upstream"), Class: c.QueryParam("class"), Client: c.QueryParam("client")}
}

func (a *Admin) adminListDeadLetters(c echo.Context) error {
	all, err := a.store.ListDeadLetters(c.Request().Context(), filterOf(c))
	if err != nil {
		return storeErr(err)
	}
	limit, offset := 50, 0
	if v, err := strconv.Atoi(c.QueryParam("limit")); err == nil && v > 0 && v <= 1000 {
		limit = v
	}
	if v, err := strconv.Atoi(c.QueryParam("offset")); err == nil && v >= 0 {
		offset = v
	}
	// offset is at most len(all) from here, so offset+limit cannot
	// overflow however large the query's offset was.
	offset = min(offset, len(all))
	end := min(offset+limit, len(all))
	page := all[offset:end]
	if page == nil {
		page = []cache.DeadLetter{} // an empty list, not null
	}
	resp := map[string]any{
		"dead_letters": page,
		"total":        len(all),
		"summary":      deadletter.Group(all),
	}
	if end < len(all) {
		resp["next_offset"] = end
	}
	return c.JSON(http.StatusOK, resp)
}

// deadLetter loads the dead letter the path names.
func (a *Admin) deadLetter(c echo.Context) (*cache.DeadLetter, error) {
	d, err := a.store.GetDeadLetter(c.Request().Context(), c.Param("id"))
	if errors.Is(err, cache.ErrNotFound) {
		return nil, errNoDeadLetter()
	}
	if err != nil {
		return nil, storeErr(err)
	}
	return d, nil
}

func (a *Admin) adminGetDeadLetter(c echo.Context) error {
	d, err := a.deadLetter(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, deadLetterView{DeadLetter: *d, Body: string(d.Body)})
}

func errNoDeadLetter() *apierror.Error {
	return apierror.NotFound("dead_letter_not_found", "", "No dead letter with this id.")
}

func (a *Admin) adminDeleteDeadLetter(c echo.Context) error {
	err := a.store.DeleteDeadLetter(c.Request().Context(), c.Param("id"))
	if errors.Is(err, cache.ErrNotFound) {
		return errNoDeadLetter()
	}
	if err != nil {
		return storeErr(err)
	}
	a.dlq.Poke()
	return c.JSON(http.StatusOK, map[string]int{"deleted": 1})
}

func (a *Admin) adminReplayDeadLetter(c echo.Context) error {
	d, err := a.deadLetter(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, a.dlq.Replay(c.Request().Context(), d))
}

// adminReplayGroup replays every dead letter matching upstream/class/client
// (at most 1,000), paced, so a group replay after a fix does not become the
// next outage.
func (a *Admin) adminReplayGroup(c echo.Context) error {
	f := filterOf(c)
	if f == (cache.DeadLetterFilter{}) {
		return apierror.Invalid("upstream", "Name the group to replay with upstream=, class= and/or client=.")
	}
	ctx := c.Request().Context()
	list, err := a.store.ListDeadLetters(ctx, f)
	if err != nil {
		return storeErr(err)
	}
	results, err := a.dlq.ReplayPaced(ctx, list[:min(len(list), 1000)])
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"replayed": len(results), "succeeded": deadletter.Succeeded(results), "results": results})
}
