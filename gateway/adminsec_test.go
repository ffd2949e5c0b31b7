package gateway

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/admin"
)

// The admin security rules, each with the test that holds it:
//
//   - The page's sign-in cookie opens only the page (and GET /metrics); the
//     JSON API takes only the Bearer token: TestAdminAPIRefusesPageCookie.
//   - The cookie carries a random session id, not the token, and signing
//     out revokes it server-side: TestAdminSessionCookie.
//   - Failed sign-ins are slowed per source address and logged as a
//     summary, never the token: TestAdminLoginThrottled (and, for the
//     policy itself, admin.TestThrottlePolicy).
//   - X-Forwarded-For and X-Forwarded-Proto are believed only from
//     server.trusted_proxies: TestAdminLoginThrottlePerAddress,
//     TestAdminCookieSecure.
//   - Cross-site forms change nothing, in a real browser:
//     TestAdminCrossSiteFormsInBrowser.
//   - Slow bodies are cut: TestSlowBodiesAreCut.

// TestAdminAPIRefusesPageCookie: a cross-site form can carry the page's
// cookie (SameSite does not stop a page on another port of the same host),
// so the JSON API must not accept it at all.
func TestAdminAPIRefusesPageCookie(t *testing.T) {
	h := newHarness(t, nil)
	ck := h.login()
	for _, tc := range []struct{ method, path string }{
		{http.MethodGet, "/admin/breakers"},
		{http.MethodGet, "/admin/deadletters"},
		{http.MethodPost, "/admin/breakers/primary/open"},
		{http.MethodPost, "/admin/deadletters/replay?upstream=primary&class=transient"},
		{http.MethodGet, "/admin/debug/pprof/cmdline"},
	} {
		// What a browser sends for a form on a page on another port.
		r := h.page(tc.method, tc.path, url.Values{}, ck, map[string]string{"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:1"})
		if r.status != http.StatusUnauthorized {
			t.Errorf("%s %s with the page cookie: %d, want 401", tc.method, tc.path, r.status)
		}
		// Nor without the browser's headers.
		r = h.page(tc.method, tc.path, url.Values{}, ck, nil)
		if r.status != http.StatusUnauthorized {
			t.Errorf("%s %s with the page cookie, no browser headers: %d, want 401", tc.method, tc.path, r.status)
		}
	}
	if st, _ := h.gw.breakers.Status(breaker.Key{Upstream: "primary"}); st.State != breaker.Closed || st.Forced {
		t.Fatalf("breaker after cookie-only API posts: %+v", st)
	}
	// The Bearer token still opens the API.
	if r := h.admin(http.MethodGet, "/admin/breakers"); r.status != http.StatusOK {
		t.Fatalf("bearer: %d %s", r.status, r.body)
	}
}

// TestAdminSessionCookie: the cookie is a 32-byte random session id, a new
// one per sign-in, and a copy of it stops working once the operator signs
// out.
func TestAdminSessionCookie(t *testing.T) {
	h := newHarness(t, nil)
	ck := h.login()
	v := ck[0].Value
	if strings.Contains(v, adminToken) {
		t.Fatalf("the cookie carries the admin token: %s", ck[0])
	}
	if b, err := base64.RawURLEncoding.DecodeString(v); err != nil || len(b) != 32 {
		t.Fatalf("cookie value %q is not 32 bytes of base64url: %v", v, err)
	}
	if again := h.login(); again[0].Value == v {
		t.Fatal("two sign-ins got the same session id")
	}
	if r := h.page(http.MethodGet, "/admin/", nil, ck, nil); r.status != http.StatusOK {
		t.Fatalf("page with the session: %d", r.status)
	}
	copied := []*http.Cookie{{Name: admin.Cookie, Value: v}}

	r := h.page(http.MethodPost, "/admin/logout", nil, ck, map[string]string{"Origin": h.srv.URL})
	if r.status != http.StatusSeeOther {
		t.Fatalf("logout: %d", r.status)
	}
	r = h.page(http.MethodGet, "/admin/", nil, copied, nil)
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/admin/login" {
		t.Fatalf("page with a copy of a signed-out cookie: %d %q, want a redirect to the login form", r.status, r.header.Get("Location"))
	}
	r = h.page(http.MethodPost, "/admin/ui/breakers/primary/open", nil, copied, map[string]string{"Origin": h.srv.URL})
	wantOpenAIError(t, r.result, http.StatusUnauthorized)
	if r := h.page(http.MethodGet, "/metrics", nil, copied, nil); r.status != http.StatusUnauthorized {
		t.Fatalf("/metrics with a signed-out cookie: %d", r.status)
	}
}

// TestAdminLoginThrottled sends 300 wrong tokens from one address, as fast
// as the gateway answers: after a few, it answers 429 with a Retry-After
// instead of trying them, and the log has a line or two, not 300.
func TestAdminLoginThrottled(t *testing.T) {
	h := newHarness(t, nil)
	counts := map[int]int{}
	for i := range 300 {
		r := h.page(http.MethodPost, "/admin/login", url.Values{"token": {"wrong-" + strconv.Itoa(i)}}, nil, nil)
		counts[r.status]++
		if r.status == http.StatusTooManyRequests {
			if n, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || n < 1 {
				t.Fatalf("429 with Retry-After %q", r.header.Get("Retry-After"))
			}
			wantPageHeaders(t, r)
		}
	}
	t.Logf("answers to 300 wrong tokens: %v", counts)
	if counts[http.StatusUnauthorized] > 10 || counts[http.StatusTooManyRequests] < 280 {
		t.Errorf("answers %v: want at most 10 tries of a token and the rest 429", counts)
	}
	logged := 0
	for _, line := range strings.Split(h.logs.String(), "\n") {
		if strings.Contains(line, "admin page") && strings.Contains(line, "sign-in") || strings.Contains(line, "wrong token") {
			logged++
		}
	}
	if logged == 0 || logged > 3 {
		t.Errorf("%d log lines about failed sign-ins, want 1 to 3:\n%s", logged, h.logs.String())
	}
	if strings.Contains(h.logs.String(), "wrong-1") {
		t.Error("a tried token is in the log")
	}
	// The correct token while this address must wait is not tried either.
	r := h.page(http.MethodPost, "/admin/login", url.Values{"token": {adminToken}}, nil, nil)
	if r.status != http.StatusTooManyRequests {
		t.Errorf("right token during the delay: %d, want 429", r.status)
	}
}

// TestAdminLoginThrottlePerAddress: behind a trusted proxy, sign-ins are
// throttled by the client address it reports; from any other peer the
// header is ignored (and that is logged once), so every client behind an
// unlisted proxy shares one address.
func TestAdminLoginThrottlePerAddress(t *testing.T) {
	wrong := url.Values{"token": {"wrong"}}
	from := func(ip string) map[string]string { return map[string]string{"X-Forwarded-For": ip} }

	t.Run("trusted proxy", func(t *testing.T) {
		h := newHarness(t, func(c *config.Config) { c.Server.TrustedProxies = []string{"127.0.0.1"} })
		for range 5 {
			h.page(http.MethodPost, "/admin/login", wrong, nil, from("203.0.113.5"))
		}
		if r := h.page(http.MethodPost, "/admin/login", wrong, nil, from("203.0.113.5")); r.status != http.StatusTooManyRequests {
			t.Fatalf("sixth try from 203.0.113.5: %d, want 429", r.status)
		}
		// A client further left in the header is the client's own say.
		if r := h.page(http.MethodPost, "/admin/login", wrong, nil, from("198.51.100.1, 203.0.113.5")); r.status != http.StatusTooManyRequests {
			t.Fatalf("a forged entry escaped the throttle: %d", r.status)
		}
		if r := h.page(http.MethodPost, "/admin/login", url.Values{"token": {adminToken}}, nil, from("203.0.113.6")); r.status != http.StatusSeeOther {
			t.Fatalf("another client's right token: %d, want 303", r.status)
		}
		if !strings.Contains(h.logs.String(), `"remote":"203.0.113.5"`) {
			t.Errorf("the log does not name the client:\n%s", h.logs.String())
		}
	})

	t.Run("untrusted peer", func(t *testing.T) {
		h := newHarness(t, nil)
		for i := range 5 {
			h.page(http.MethodPost, "/admin/login", wrong, nil, from("203.0.113."+strconv.Itoa(i)))
		}
		if r := h.page(http.MethodPost, "/admin/login", wrong, nil, from("203.0.113.99")); r.status != http.StatusTooManyRequests {
			t.Fatalf("a new X-Forwarded-For from an untrusted peer escaped the throttle: %d", r.status)
		}
		if n := strings.Count(h.logs.String(), "not in server.trusted_proxies"); n != 1 {
			t.Errorf("the ignored header is logged %d times, want once", n)
		}
		if strings.Contains(h.logs.String(), `"remote":"203.0.113.`) {
			t.Error("an untrusted X-Forwarded-For reached the log as the client's address")
		}
	})
}

// TestAdminCookieSecure: server.cookie_secure decides the Secure attribute
// of the page's cookies; on auto, from TLS here or a trusted proxy's
// X-Forwarded-Proto: https.
func TestAdminCookieSecure(t *testing.T) {
	https := map[string]string{"X-Forwarded-Proto": "https"}
	for _, tc := range []struct {
		name    string
		setting string
		trusted bool
		hdr     map[string]string
		want    bool
	}{
		{"auto, plain http", config.CookieSecureAuto, false, nil, false},
		{"auto, untrusted peer says https", config.CookieSecureAuto, false, https, false},
		{"auto, trusted proxy says https", config.CookieSecureAuto, true, https, true},
		{"auto, trusted proxy says http", config.CookieSecureAuto, true, map[string]string{"X-Forwarded-Proto": "http"}, false},
		{"true", config.CookieSecureTrue, false, nil, true},
		{"false, trusted proxy says https", config.CookieSecureFalse, true, https, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *config.Config) {
				c.Server.CookieSecure = tc.setting
				if tc.trusted {
					c.Server.TrustedProxies = []string{"127.0.0.0/8"}
				}
			})
			r := h.page(http.MethodPost, "/admin/login", url.Values{"token": {adminToken}}, nil, tc.hdr)
			if r.status != http.StatusSeeOther {
				t.Fatalf("login: %d", r.status)
			}
			var session []*http.Cookie
			for _, c := range r.cookies {
				if c.Name == admin.Cookie {
					session = append(session, c)
				}
			}
			if len(session) != 2 {
				t.Fatalf("cookies %v", r.cookies)
			}
			hdr := map[string]string{"Origin": h.srv.URL}
			for k, v := range tc.hdr {
				hdr[k] = v
			}
			act := h.page(http.MethodPost, "/admin/ui/breakers/primary/close", nil, session[:1], hdr)
			for _, c := range append(session, flashOf(t, act)...) {
				if c.Secure != tc.want {
					t.Errorf("%s (path %s): Secure %v, want %v", c.Name, c.Path, c.Secure, tc.want)
				}
			}
		})
	}
}
