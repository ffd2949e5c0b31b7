// Package admin is the operator's side of llmgate: the JSON API under
// /admin (breakers and their forced state, shared across replicas when the
// store is; idempotency records; dead letters; stats; pprof), the
// server-rendered page at /admin/, and the admin token that guards both and
// /metrics.
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
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/deadletter"
	"github.com/llmgate/llmgate/gateway/metrics"
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
	// Endpoints are the keyed POST paths, for looking a key up on each.
	Endpoints []string
	// Logger: if nil, logs are discarded.
	Logger *slog.Logger
	// Now is the clock. If nil, time.Now.
	Now func() time.Time
}

// Admin serves the admin API and page. Close stops following shared
// breaker overrides.
type Admin struct {
	cfg       config.Config
	store     Store
	breakers  *breaker.Registry
	metrics   *metrics.Metrics
	dlq       *deadletter.Queue
	endpoints []string
	log       *slog.Logger
	now       func() time.Time
	token     [32]byte // SHA-256 of the admin token; zero when admin is disabled

	// shared is set when the store shares breaker overrides across
	// replicas; stopShared ends following them.
	shared     SharedBreakerOverrides
	stopShared context.CancelFunc
}

// New returns an Admin; when the store shares breaker overrides, it starts
// following them.
func New(o Options) *Admin {
	a := &Admin{cfg: o.Config, store: o.Store, breakers: o.Breakers, metrics: o.Metrics, dlq: o.DeadLetters,
		endpoints: o.Endpoints, log: o.Logger, now: o.Now}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	if a.now == nil {
		a.now = time.Now
	}
	if o.Config.AdminToken != "" {
		a.token = sha256.Sum256([]byte(o.Config.AdminToken))
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

// Routes registers the page on e and the API under /admin behind Auth.
func (a *Admin) Routes(e *echo.Echo) {
	grp := e.Group("/admin", a.Auth)
	a.apiRoutes(grp)
	a.pageRoutes(e, grp)
}

// SetBreakerForced is an operator's force-open (open) or close.
func (a *Admin) SetBreakerForced(ctx context.Context, name string, open bool) error {
	return a.setBreakerForced(ctx, name, open)
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

// credential is the token a request carries: a Bearer header, else the
// page's cookie.
func (a *Admin) credential(c echo.Context) (string, bool) {
	if tok, ok := Bearer(c.Request().Header.Get("Authorization")); ok {
		return tok, true
	}
	if ck, err := c.Cookie(Cookie); err == nil {
		return ck.Value, true
	}
	return "", false
}

// Auth guards /admin and /metrics with the admin token. Without a token
// configured they are refused entirely.
func (a *Admin) Auth(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if !a.enabled() {
			return &apierror.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "admin_disabled",
				Message: "The admin API is disabled: no admin_token is configured."}
		}
		if tok, ok := a.credential(c); !ok || !a.tokenOK(tok) {
			return &apierror.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_admin_token",
				Message: "Missing or wrong admin token."}
		}
		return next(c)
	}
}

// Bearer returns the token of an "Authorization: Bearer <token>" header.
func Bearer(h string) (string, bool) {
	const p = "Bearer "
	if len(h) <= len(p) || !strings.EqualFold(h[:len(p)], p) {
		return "", false
	}
	return strings.TrimSpace(h[len(p):]), true
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
	page := all[min(offset, len(all)):min(offset+limit, len(all))]
	resp := map[string]any{
		"dead_letters": page,
		"total":        len(all),
		"summary":      deadletter.Group(all),
	}
	if offset+limit < len(all) {
		resp["next_offset"] = offset + limit
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
