package admin

// The one-time sign-in code: a link that opens the page once, from this
// machine, without pasting the admin token. `gateway -demo` makes the code
// (Options.SignInCode) and prints the link, so that a newcomer clicks
// through to the page. What the link opens is an ordinary page session,
// the same as a sign-in with the token on /admin/login gives.
//
// Why each limit:
//   - Once: the link is printed in a terminal and may end up in a
//     scrollback, a screen share or a shell history; after its first use
//     it opens nothing.
//   - Loopback only, and no forwarding header: the gateway's own machine is
//     where the link was printed. A request that a proxy forwarded (even one
//     on this machine) may come from anywhere, so it is refused too.
//   - Expiry (SignInCodeTTL): an unused link does not stay good for as long
//     as the process runs.
//
// Wrong codes are not throttled like sign-ins with the token: the code is
// 256 random bits, and only this machine may try.

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net/http"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
)

// SignInCodePath is where a one-time sign-in code is spent:
// GET SignInCodePath?code=<code>.
const SignInCodePath = "/admin/login/once"

// DefaultSignInCodeTTL is how long a sign-in code is good for when
// Options.SignInCodeTTL is not set.
const DefaultSignInCodeTTL = 10 * time.Minute

// errSignInCode is a code that is wrong, already used or expired.
var errSignInCode = errors.New("the one-time sign-in code is wrong, used or expired")

// signInCode is the one-time sign-in code, as its SHA-256 digest.
type signInCode struct {
	digest  [32]byte
	expires time.Time
	used    atomic.Bool
}

// newSignInCode returns the code of o, good from now; nil when o sets
// none.
func newSignInCode(o Options, now time.Time) *signInCode {
	if o.SignInCode == "" {
		return nil
	}
	ttl := o.SignInCodeTTL
	if ttl <= 0 {
		ttl = DefaultSignInCodeTTL
	}
	return &signInCode{digest: sha256.Sum256([]byte(o.SignInCode)), expires: now.Add(ttl)}
}

// signInWithCode begins a page session for the one-time sign-in code and
// returns its id, for the cookie. It succeeds once; then, as for a wrong or
// expired code, the error is errSignInCode. If the session cannot be
// stored the code stays unused, so that the link can be opened again.
func (a *Admin) signInWithCode(ctx context.Context, code string) (string, error) {
	sc := a.signInCode
	if sc == nil || code == "" || !a.now().Before(sc.expires) {
		return "", errSignInCode
	}
	sum := sha256.Sum256([]byte(code))
	if subtle.ConstantTimeCompare(sum[:], sc.digest[:]) != 1 || !sc.used.CompareAndSwap(false, true) {
		return "", errSignInCode
	}
	id, err := a.sessions.create(ctx)
	if err != nil {
		sc.used.Store(false)
		return "", err
	}
	return id, nil
}

// fromThisMachine reports whether r came straight from this machine: its
// peer is a loopback address, and it carries no header with which a proxy
// names a client elsewhere.
func fromThisMachine(r *http.Request) bool {
	for _, h := range []string{"Forwarded", "X-Forwarded-For", "X-Real-Ip"} {
		if r.Header.Get(h) != "" {
			return false
		}
	}
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	return err == nil && ap.Addr().Unmap().IsLoopback()
}

// pageLoginOnce spends a one-time sign-in code: a session cookie and the
// page, as pageLogin gives for the token.
func (a *Admin) pageLoginOnce(c echo.Context) error {
	if !a.enabled() {
		return a.pageDisabled(c)
	}
	if a.signInCode == nil {
		return echo.ErrNotFound
	}
	r := c.Request()
	if !fromThisMachine(r) {
		a.log.Warn("admin page: one-time sign-in refused: not from this machine", "remote", r.RemoteAddr)
		return a.render(c, http.StatusForbidden, "login", loginView{Title: "llmgate admin",
			Error: "A one-time sign-in link works only in a browser on the gateway's own machine. Sign in with the admin token."})
	}
	id, err := a.signInWithCode(r.Context(), c.QueryParam("code"))
	if errors.Is(err, errSignInCode) {
		return a.render(c, http.StatusUnauthorized, "login", loginView{Title: "llmgate admin",
			Error: "This sign-in link was used already, has expired, or is not this gateway's. Sign in with the admin token."})
	}
	if err != nil {
		a.log.Warn("admin page: starting a session failed", "err", err)
		return a.render(c, http.StatusServiceUnavailable, "login", loginView{Title: "llmgate admin",
			Error: "The link is right, but the session could not be stored; see the gateway's log."})
	}
	a.setSessionCookies(c, id) // the same cookies as pageLogin sets
	a.log.Info("admin page: operator signed in with the one-time code", "remote", r.RemoteAddr)
	// The code is in this URL: no Referer and no cache may keep it.
	pageHeaders(c)
	return c.Redirect(http.StatusSeeOther, "/admin/")
}
