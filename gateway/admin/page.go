package admin

// The operator's page: one server-rendered HTML page at /admin/ with the
// breakers, the last hour in charts (inline SVG, charts.go), the
// dead-letter queue and the idempotency store, and HTML forms for the few
// actions an operator takes from a browser. It uses no script:
// the page refreshes itself with <meta http-equiv="refresh">, and its
// Content-Security-Policy allows no script at all.
//
// A browser authenticates with the admin token once, on /admin/login, and
// gets an HttpOnly, SameSite=Strict cookie holding a session id (never the
// token; see session.go). The cookie opens the page and its form routes
// under /admin/ui (pageAuth), not the JSON API. The form POSTs are guarded
// against cross-site requests twice: the cookie is SameSite=Strict, and
// sameOrigin rejects a request whose Sec-Fetch-Site, Origin or Referer
// says it came from another origin — which SameSite alone does not: a page
// on another port of the same host is the same site.

import (
	"bytes"
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/apierror"
	"github.com/llmgate/llmgate/gateway/deadletter"
	"github.com/llmgate/llmgate/gateway/metrics"
)

//go:embed page.html
var adminPageHTML string

var adminPageTmpl = template.Must(template.New("adminpage").Funcs(template.FuncMap{
	"pathEscape": url.PathEscape,
	"bytes":      humanBytes,
}).Parse(adminPageHTML))

const (
	// flashCookie carries the one-line result of the last action to the
	// page the action redirects to. A cookie rather than the query string,
	// so that a link from elsewhere cannot put words on the page, and so
	// the self-refresh does not repeat it.
	flashCookie = "llmgate_flash"
	// pageDeadLetters is how many of the newest dead letters the page lists.
	pageDeadLetters = 20
	// maxLoginForm caps the sign-in form's body.
	maxLoginForm = 64 << 10
	// pageReplayMax caps one "Replay group" click: the replay runs inside
	// the click's request, at dead_letters.replay_per_second.
	pageReplayMax = 100
)

// adminCookiePaths are the paths the session cookie is set for: the page
// under /admin (the JSON API there ignores it), and /metrics, so a
// signed-in browser can read it.
var adminCookiePaths = []string{"/admin", "/metrics"}

// pageRoutes registers the operator's HTML page on the root: the page, the
// sign-in form (which needs no token) and the page's form routes under
// /admin/ui, which take the session cookie (pageAuth) and pass sameOrigin.
func (a *Admin) pageRoutes(e *echo.Echo) {
	// The page itself is not behind pageAuth: a browser without a session
	// is sent to the sign-in form rather than answered an API client's 401.
	e.GET("/admin", func(c echo.Context) error { return c.Redirect(http.StatusSeeOther, "/admin/") })
	e.GET("/admin/", a.pageIndex)
	e.GET("/admin/login", a.pageLoginForm)
	e.POST("/admin/login", a.pageLogin, a.sameOrigin)
	e.POST("/admin/logout", a.pageLogout, a.sameOrigin)

	// sameOrigin first: a forged request is refused before its cookie is
	// looked up in the store.
	ui := e.Group("/admin/ui", a.sameOrigin, a.pageAuth)
	ui.POST("/breakers/:name/open", a.pageForce(true))
	ui.POST("/breakers/:name/close", a.pageForce(false))
	ui.POST("/deadletters/replay", a.pageReplayGroup)
	ui.POST("/deadletters/:id/replay", a.pageReplayOne)
	ui.POST("/deadletters/:id/discard", a.pageDiscard)
}

// secure is the Secure attribute of the page's cookies
// (server.cookie_secure): on "auto", whether the browser's connection was
// TLS, here or at a trusted proxy.
func (a *Admin) secure(r *http.Request) bool {
	switch a.cfg.Server.CookieSecure {
	case config.CookieSecureTrue:
		return true
	case config.CookieSecureFalse:
		return false
	}
	return a.proxies.HTTPS(r)
}

// pageHeaders sets the headers every HTML response of the page carries.
// The policy allows no script, no frame, no other origin, and inline style
// only; the page is never cached, framed, or sniffed as something else.
func pageHeaders(c echo.Context) {
	h := c.Response().Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
}

// crossOrigin is the standard library's check: Sec-Fetch-Site when the
// browser sends it, else Origin against Host. It matters that Sec-Fetch-Site
// comes first: under Referrer-Policy: no-referrer a browser sends the
// page's own form POSTs with "Origin: null".
var crossOrigin = http.NewCrossOriginProtection()

// sameOrigin refuses a state-changing request that a browser says came
// from another origin. Requests with none of Sec-Fetch-Site, Origin and
// Referer are not a browser's, and pass: they still need the token.
func (a *Admin) sameOrigin(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		err := crossOrigin.Check(r)
		if err == nil && r.Header.Get("Sec-Fetch-Site") == "" && r.Header.Get("Origin") == "" {
			if ref := r.Header.Get("Referer"); ref != "" {
				if u, perr := url.Parse(ref); perr != nil || u.Host != r.Host {
					err = errors.New("cross-origin request detected from Referer header")
				}
			}
		}
		if err != nil {
			a.log.Warn("admin page: cross-origin form post refused", "path", r.URL.Path, "err", err)
			return &apierror.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "cross_origin",
				Message: "Cross-origin request refused.", Err: err}
		}
		return next(c)
	}
}

// render executes a template into a buffer first, so that a template
// error is a clean 500 rather than half a page.
func (a *Admin) render(c echo.Context, status int, name string, data any) error {
	var buf bytes.Buffer
	if err := adminPageTmpl.ExecuteTemplate(&buf, name, data); err != nil {
		return fmt.Errorf("render admin page %s: %w", name, err)
	}
	pageHeaders(c)
	return c.HTMLBlob(status, buf.Bytes())
}

type loginView struct {
	Title    string
	Error    string
	Disabled bool
}

func (a *Admin) pageDisabled(c echo.Context) error {
	return a.render(c, http.StatusForbidden, "login", loginView{Title: "llmgate admin", Disabled: true})
}

func (a *Admin) pageLoginForm(c echo.Context) error {
	if !a.enabled() {
		return a.pageDisabled(c)
	}
	return a.render(c, http.StatusOK, "login", loginView{Title: "llmgate admin"})
}

// pageLogin signs a browser in: the token, once, for a session cookie.
// Failures are throttled per source address before the token is even
// compared, and logged in summary; the token never is.
func (a *Admin) pageLogin(c echo.Context) error {
	if !a.enabled() {
		return a.pageDisabled(c)
	}
	// A sign-in form is a few bytes; ParseForm alone would read 10 MB. (A
	// copy of the request: net/http's own keeps the body it made.)
	r := c.Request().WithContext(c.Request().Context())
	r.Body = http.MaxBytesReader(c.Response(), r.Body, maxLoginForm)
	if err := r.ParseForm(); err != nil {
		// Not an attempt: nothing was compared, nothing is counted.
		status, msg := http.StatusBadRequest, "The sign-in form could not be read."
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			status, msg = http.StatusRequestTimeout, "The sign-in form did not arrive in time."
		}
		return a.render(c, status, "login", loginView{Title: "llmgate admin", Error: msg})
	}
	remote := a.clientIP(r)
	addr := throttleKey(remote)
	wait, ok, line := a.logins.begin(addr)
	line.write(a.log)
	if !ok {
		secs := int((wait + time.Second - 1) / time.Second)
		c.Response().Header().Set("Retry-After", strconv.Itoa(secs))
		return a.render(c, http.StatusTooManyRequests, "login", loginView{Title: "llmgate admin",
			Error: "Too many failed sign-ins from your address: try again in " + roughDuration(time.Duration(secs)*time.Second) + "."})
	}
	if !a.tokenOK(r.PostFormValue("token")) {
		a.logins.end(addr, false).write(a.log)
		return a.render(c, http.StatusUnauthorized, "login", loginView{Title: "llmgate admin", Error: "Wrong admin token."})
	}
	a.logins.end(addr, true).write(a.log)
	id, err := a.sessions.create(r.Context())
	if err != nil {
		a.log.Warn("admin page: starting a session failed", "err", err)
		return a.render(c, http.StatusServiceUnavailable, "login", loginView{Title: "llmgate admin",
			Error: "The token is right, but the session could not be stored; see the gateway's log."})
	}
	a.setSessionCookies(c, id)
	a.log.Info("admin page: operator signed in", "remote", remote)
	return c.Redirect(http.StatusSeeOther, "/admin/")
}

// clientIP is the address sign-ins are throttled and logged by. The first
// time one arrives with X-Forwarded-For from a peer that is not a trusted
// proxy, that is logged: behind an unlisted proxy every client shares its
// address, and the throttle slows them all together.
func (a *Admin) clientIP(r *http.Request) string {
	if r.Header.Get("X-Forwarded-For") != "" && !a.proxies.FromTrusted(r) && a.xffNoted.CompareAndSwap(false, true) {
		a.log.Warn("admin page: X-Forwarded-For from a peer not in server.trusted_proxies is ignored; "+
			"if it is your proxy, list it there, or sign-in throttling treats every client behind it as one address",
			"peer", r.RemoteAddr)
	}
	return a.proxies.ClientIP(r)
}

// pageLogout signs the browser out: its session ends in the store, so a
// copy of the cookie stops working too, and the cookies are cleared.
func (a *Admin) pageLogout(c echo.Context) error {
	if ck, err := c.Cookie(Cookie); err == nil && ck.Value != "" {
		if err := a.sessions.revoke(c.Request().Context(), ck.Value); err != nil {
			// The cookie stays, so that signing out can be tried again.
			a.log.Warn("admin page: ending a session failed", "err", err)
			return a.render(c, http.StatusServiceUnavailable, "login", loginView{Title: "llmgate admin",
				Error: "Signing out failed: the session could not be deleted from the store. Try again; it ends by itself within " + roughDuration(sessionTTL) + "."})
		}
	}
	for _, p := range adminCookiePaths {
		c.SetCookie(&http.Cookie{Name: Cookie, Path: p, MaxAge: -1, HttpOnly: true,
			SameSite: http.SameSiteStrictMode, Secure: a.secure(c.Request())})
	}
	return c.Redirect(http.StatusSeeOther, "/admin/login")
}

// setFlash leaves a one-line result for the next render of the page.
func (a *Admin) setFlash(c echo.Context, msg string) {
	c.SetCookie(&http.Cookie{
		Name: flashCookie, Value: base64.RawURLEncoding.EncodeToString([]byte(msg)), Path: "/admin/",
		MaxAge: 60, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: a.secure(c.Request()),
	})
}

// takeFlash reads and clears the flash message.
func (a *Admin) takeFlash(c echo.Context) string {
	ck, err := c.Cookie(flashCookie)
	if err != nil {
		return ""
	}
	c.SetCookie(&http.Cookie{Name: flashCookie, Path: "/admin/", MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: a.secure(c.Request())})
	b, err := base64.RawURLEncoding.DecodeString(ck.Value)
	if err != nil || len(b) > 500 {
		return ""
	}
	return string(b)
}

func (a *Admin) backToPage(c echo.Context, msg string) error {
	a.setFlash(c, msg)
	return c.Redirect(http.StatusSeeOther, "/admin/")
}

// pageView is everything the page shows. It holds no secret: upstream keys
// and the admin token are not in any of its fields.
type pageView struct {
	Title    string
	Host     string
	Now      string
	Flash    string
	Breakers []breakerRow

	DeadTotal    int
	DeadGroups   []deadletter.GroupCount
	DeadLetters  []deadLetterRow
	DeadAlerting bool
	DeadError    string

	Store      cache.Stats
	IdemEvents []idemEvent
	Tokens     metrics.TokenTotals

	// Charts is the last hour (nil without a timeline).
	Charts *chartsView

	// Budgets are the budgeted clients' charts (nil: none budgeted).
	Budgets *budgetChartsView
}

// breakerRow is one breaker's Status, exactly as /admin/breakers has it,
// with its times rendered for people.
type breakerRow struct {
	breaker.Status
	// ID is the row's id: breaker-<upstream> for the upstream's own,
	// breaker-<upstream>/<model> for a model's.
	ID                                          string
	Since, CountsFrom, LastFailure, Probe, Trip string
	LastProbe                                   string
}

func newBreakerRow(st breaker.Status, now time.Time) breakerRow {
	row := breakerRow{Status: st, ID: "breaker-" + st.Name, Since: when(st.StateSince, now), CountsFrom: when(st.CountsSince, now)}
	if st.Model != "" {
		row.ID += "/" + st.Model
	}
	if st.LastFailureAt != nil {
		row.LastFailure = when(*st.LastFailureAt, now)
	}
	if st.ProbeAt != nil {
		row.Probe = when(*st.ProbeAt, now)
	}
	if t := st.OpenedBy; t != nil {
		row.Trip = describeTrip(*t) + ", " + when(t.At, now)
	}
	if p := st.LastProbe; p != nil {
		row.LastProbe = p.Result
		if p.Class != "" {
			row.LastProbe += " (" + p.Class + ")"
		}
		row.LastProbe += ", " + when(p.At, now)
	}
	return row
}

// describeTrip says what opened a breaker: "5 failures in a row
// (transient)".
func describeTrip(t breaker.Trip) string {
	var s string
	switch t.Reason {
	case "forced":
		return "forced by an operator"
	case "probe_failed":
		s = "its half-open probe failed"
	case "failure_ratio":
		s = fmt.Sprintf("%d of %d requests failed", t.Failures, t.Requests)
	default:
		s = fmt.Sprintf("%d failures in a row", t.Failures)
	}
	if t.Class != "" {
		s += " (last: " + t.Class + ")"
	}
	return s
}

type deadLetterRow struct {
	ID, Time, Client, Key, Model, Class, Message, Upstream string
	Failures                                               int
	Truncated                                              bool
}

type idemEvent struct {
	Name  string
	Count int64
}

// idemEventOrder is the order the page lists idempotency events in; any
// other event counted follows, sorted.
var idemEventOrder = []string{"claim", "commit", "replay", "wait", "conflict", "mismatch", "store_error", "cache_hit", "cache_miss"}

func (a *Admin) pageIndex(c echo.Context) error {
	if !a.enabled() {
		return a.pageDisabled(c)
	}
	if !a.pageAuthorized(c) {
		pageHeaders(c)
		return c.Redirect(http.StatusSeeOther, "/admin/login")
	}
	now := a.now()
	host, _ := os.Hostname()
	v := pageView{Title: "llmgate", Host: host, Now: now.UTC().Format("2006-01-02 15:04:05 UTC"), Flash: a.takeFlash(c)}

	// The same Snapshot /admin/breakers answers with.
	for _, st := range a.breakers.Snapshot() {
		v.Breakers = append(v.Breakers, newBreakerRow(st, now))
	}

	all, err := a.store.ListDeadLetters(c.Request().Context(), cache.DeadLetterFilter{})
	if err != nil {
		a.log.Warn("admin page: listing dead letters failed", "err", err)
		v.DeadError = "The dead letters could not be read from the store; see the gateway's log."
	}
	v.DeadTotal = len(all)
	v.DeadGroups = deadletter.Group(all)
	for _, d := range all[:min(len(all), pageDeadLetters)] { // newest first
		v.DeadLetters = append(v.DeadLetters, deadLetterRow{
			ID: d.ID, Time: when(d.LastAt, now), Client: d.Client, Key: d.Key, Model: d.Model,
			Class: d.Class, Message: d.Message, Upstream: deadletter.LastUpstream(d), Failures: d.Failures, Truncated: d.BodyTruncated,
		})
	}
	v.DeadAlerting = a.dlq.Alerting()

	v.Store = a.store.Stats()
	if a.timeline != nil {
		a.timeline.StoreSize(v.Store)
		ch := buildCharts(a.timeline.Snapshot(), a.timeline.MemoryBytes())
		v.Charts = &ch
	}
	counts := a.metrics.IdemCounts()
	for _, name := range idemEventOrder {
		v.IdemEvents = append(v.IdemEvents, idemEvent{Name: name, Count: counts[name]})
	}
	var extra []string
	for name := range counts {
		if !slices.Contains(idemEventOrder, name) {
			extra = append(extra, name)
		}
	}
	sort.Strings(extra)
	for _, name := range extra {
		v.IdemEvents = append(v.IdemEvents, idemEvent{Name: name, Count: counts[name]})
	}
	v.Tokens = a.metrics.TokenTotals()
	v.Budgets = a.budgetCharts(c.Request().Context())
	return a.render(c, http.StatusOK, "page", v)
}

// when renders t in UTC with how long ago (or how soon) it is.
func when(t, now time.Time) string {
	d := now.Sub(t)
	rel := roughDuration(d) + " ago"
	switch {
	case d > -time.Second && d < time.Second:
		rel = "just now"
	case d < 0:
		rel = "in " + roughDuration(-d)
	}
	return t.UTC().Format("15:04:05") + " (" + rel + ")"
}

func roughDuration(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func (a *Admin) pageForce(open bool) echo.HandlerFunc {
	return func(c echo.Context) error {
		name, err := pathParam(c, "name")
		k := breaker.Key{Upstream: name, Model: c.QueryParam("model")}
		if err == nil {
			err = a.setBreakerForced(c.Request().Context(), k, open)
		}
		if err != nil {
			var ae *apierror.Error
			if errors.As(err, &ae) && ae.Code != "unknown_upstream" {
				return a.backToPage(c, ae.Message)
			}
			return a.backToPage(c, "No upstream is named "+quoteName(name)+".")
		}
		verb := "closed"
		if open {
			verb = "forced open"
		}
		a.log.Warn("breaker forced by operator", "upstream", name, "model", k.Model, "open", open, "via", "admin page")
		if k.Model != "" {
			return a.backToPage(c, "Breaker of "+k.Model+" on "+name+" "+verb+".")
		}
		return a.backToPage(c, "Breaker "+name+" "+verb+".")
	}
}

func (a *Admin) pageReplayOne(c echo.Context) error {
	ctx := c.Request().Context()
	d, err := a.store.GetDeadLetter(ctx, c.Param("id"))
	if errors.Is(err, cache.ErrNotFound) {
		return a.backToPage(c, "That dead letter is gone: replayed, discarded or resolved meanwhile.")
	}
	if err != nil {
		return storeErr(err)
	}
	return a.backToPage(c, "Replayed "+quoteName(d.Key)+": "+describeReplay(a.dlq.Replay(ctx, d)))
}

func describeReplay(r deadletter.ReplayResult) string {
	switch {
	case r.Error != "":
		return "not replayed: " + r.Error + "."
	case r.Status >= 200 && r.Status <= 299 && r.Replayed:
		return "it was already committed; the dead letter is resolved."
	case r.Status >= 200 && r.Status <= 299:
		return fmt.Sprintf("succeeded (%d); the answer is committed under its key.", r.Status)
	}
	return fmt.Sprintf("failed again (%d); it stays in the queue.", r.Status)
}

func (a *Admin) pageDiscard(c echo.Context) error {
	err := a.store.DeleteDeadLetter(c.Request().Context(), c.Param("id"))
	if errors.Is(err, cache.ErrNotFound) {
		return a.backToPage(c, "That dead letter is gone already.")
	}
	if err != nil {
		return storeErr(err)
	}
	a.dlq.Poke()
	a.log.Warn("dead letter discarded by operator", "id", c.Param("id"))
	return a.backToPage(c, "Dead letter discarded.")
}

// pageReplayGroup replays the dead letters of one group as the page shows
// it — last upstream tried and class — oldest first, at most
// pageReplayMax per click and dead_letters.replay_per_second, inside the
// request: the operator sees the result when the page comes back.
func (a *Admin) pageReplayGroup(c echo.Context) error {
	upstream, class := c.FormValue("upstream"), c.FormValue("class")
	if class == "" {
		return a.backToPage(c, "Name the group to replay.")
	}
	ctx := c.Request().Context()
	all, err := a.store.ListDeadLetters(ctx, cache.DeadLetterFilter{Class: class})
	if err != nil {
		return storeErr(err)
	}
	var group []cache.DeadLetter
	for _, d := range slices.Backward(all) { // oldest first
		if deadletter.LastUpstream(d) == upstream {
			group = append(group, d)
		}
	}
	capped := len(group) > pageReplayMax
	group = group[:min(len(group), pageReplayMax)]
	results, err := a.dlq.ReplayPaced(ctx, group)
	if err != nil {
		return err
	}
	ok := deadletter.Succeeded(results)
	failed := len(results) - ok
	msg := fmt.Sprintf("Replayed %d dead letters of %s on %s: %d succeeded, %d failed.", ok+failed, class, upstream, ok, failed)
	if capped {
		msg += fmt.Sprintf(" The group has more than %d; replay it again for the rest.", pageReplayMax)
	}
	return a.backToPage(c, msg)
}

// setSessionCookies gives the browser its session: an HttpOnly,
// SameSite=Strict cookie for each of adminCookiePaths.
func (a *Admin) setSessionCookies(c echo.Context, id string) {
	for _, p := range adminCookiePaths {
		c.SetCookie(&http.Cookie{
			Name: Cookie, Value: id, Path: p,
			MaxAge: int(sessionTTL / time.Second), HttpOnly: true,
			SameSite: http.SameSiteStrictMode, Secure: a.secure(c.Request()),
		})
	}
}
