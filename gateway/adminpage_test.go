package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
	"github.com/llmgate/llmgate/gateway/admin"
)

// noRedirect is a client that shows the page's 303s instead of following
// them, and keeps no cookies: each test passes the ones it means to send.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

type pageResult struct {
	result
	cookies []*http.Cookie
}

// page sends a browser-like request: a form body when form is not nil, and
// the given cookies and headers.
func (h *harness) page(method, path string, form url.Values, cookies []*http.Cookie, hdr map[string]string) pageResult {
	h.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, h.srv.URL+path, body)
	if err != nil {
		h.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for _, c := range cookies {
		req.AddCookie(c)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := noRedirect.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return pageResult{result{status: res.StatusCode, header: res.Header, body: b}, res.Cookies()}
}

// login signs in through the form and returns the admin cookie.
func (h *harness) login() []*http.Cookie {
	h.t.Helper()
	r := h.page(http.MethodPost, "/admin/login", url.Values{"token": {adminToken}}, nil, nil)
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/admin/" {
		h.t.Fatalf("login: %d %v %s", r.status, r.header, r.body)
	}
	var out []*http.Cookie
	for _, c := range r.cookies {
		if c.Name == admin.Cookie && c.Path == "/admin" {
			out = append(out, c)
		}
	}
	if len(out) != 1 {
		h.t.Fatalf("login set cookies %v", r.cookies)
	}
	return out
}

// flashOf returns the flash cookie a page action set, for the next GET.
func flashOf(t *testing.T, r pageResult) []*http.Cookie {
	t.Helper()
	for _, c := range r.cookies {
		if c.Name == "llmgate_flash" {
			return []*http.Cookie{c}
		}
	}
	t.Fatalf("no flash cookie in %v", r.cookies)
	return nil
}

func wantPageHeaders(t *testing.T, r pageResult) {
	t.Helper()
	want := map[string]string{
		"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
		"X-Frame-Options":         "DENY",
		"Referrer-Policy":         "no-referrer",
		"Cache-Control":           "no-store",
		"X-Content-Type-Options":  "nosniff",
	}
	for k, v := range want {
		if got := r.header.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	for k := range r.header {
		if strings.HasPrefix(k, "Access-Control-") {
			t.Errorf("CORS header %s set", k)
		}
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Errorf("Content-Type = %q", ct)
	}
}

func wantNoSecrets(t *testing.T, body []byte, secrets ...string) {
	t.Helper()
	for _, s := range append([]string{adminToken, upstreamKey}, secrets...) {
		if strings.Contains(string(body), s) {
			t.Errorf("page contains the secret %q", s)
		}
	}
}

func TestAdminPageLogin(t *testing.T) {
	h := newHarness(t, nil)

	r := h.page(http.MethodGet, "/admin/login", nil, nil, nil)
	if r.status != http.StatusOK || !strings.Contains(string(r.body), `name="token"`) || !strings.Contains(string(r.body), `type="password"`) {
		t.Fatalf("login form: %d %s", r.status, r.body)
	}
	wantPageHeaders(t, r)

	r = h.page(http.MethodPost, "/admin/login", url.Values{"token": {"wrong"}}, nil, nil)
	if r.status != http.StatusUnauthorized || !strings.Contains(string(r.body), "Wrong admin token") || !strings.Contains(string(r.body), `name="token"`) {
		t.Fatalf("wrong token: %d %s", r.status, r.body)
	}
	if len(r.cookies) != 0 {
		t.Fatalf("wrong token set cookies %v", r.cookies)
	}
	wantPageHeaders(t, r)
	wantNoSecrets(t, r.body, "wrong")

	r = h.page(http.MethodPost, "/admin/login", url.Values{"token": {adminToken}}, nil, nil)
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/admin/" {
		t.Fatalf("right token: %d %v", r.status, r.header)
	}
	paths := map[string]bool{}
	for _, c := range r.cookies {
		if c.Name != admin.Cookie {
			continue
		}
		paths[c.Path] = true
		if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Secure || c.MaxAge <= 0 {
			t.Errorf("cookie attributes: %s", c.String())
		}
	}
	if !paths["/admin"] || !paths["/metrics"] || len(paths) != 2 {
		t.Fatalf("cookie paths %v", paths)
	}

	// The cookie opens the page and /metrics, not the JSON API.
	ck := h.login()
	for _, p := range []string{"/admin/", "/metrics"} {
		if r := h.page(http.MethodGet, p, nil, ck, nil); r.status != http.StatusOK {
			t.Errorf("GET %s with the cookie: %d", p, r.status)
		}
	}
	if r := h.page(http.MethodGet, "/admin/breakers", nil, ck, nil); r.status != http.StatusUnauthorized {
		t.Errorf("GET /admin/breakers with the cookie: %d, want 401", r.status)
	}

	// Signing out clears it.
	r = h.page(http.MethodPost, "/admin/logout", nil, ck, nil)
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/admin/login" {
		t.Fatalf("logout: %d %v", r.status, r.header)
	}
	for _, c := range r.cookies {
		if c.Name == admin.Cookie && c.MaxAge >= 0 {
			t.Fatalf("logout left cookie %s", c.String())
		}
	}
}

func TestAdminPageRequiresToken(t *testing.T) {
	h := newHarness(t, nil)
	for _, tc := range []struct {
		name    string
		cookies []*http.Cookie
		hdr     map[string]string
	}{
		{name: "nothing"},
		{name: "wrong cookie", cookies: []*http.Cookie{{Name: admin.Cookie, Value: "nope"}}},
		{name: "wrong bearer", hdr: map[string]string{"Authorization": "Bearer nope"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.page(http.MethodGet, "/admin/", nil, tc.cookies, tc.hdr)
			if r.status != http.StatusSeeOther || r.header.Get("Location") != "/admin/login" {
				t.Fatalf("status %d, Location %q", r.status, r.header.Get("Location"))
			}
		})
	}
	// An API client with a wrong token still gets adminAuth's JSON 401.
	r := h.page(http.MethodGet, "/admin/breakers", nil, nil, map[string]string{"Authorization": "Bearer nope"})
	wantOpenAIError(t, r.result, http.StatusUnauthorized)
	// The page's form endpoints need the token too.
	r = h.page(http.MethodPost, "/admin/ui/breakers/primary/open", nil, nil, nil)
	wantOpenAIError(t, r.result, http.StatusUnauthorized)
	if st, _ := h.gw.breakers.Status(breaker.Key{Upstream: "primary"}); st.State != breaker.Closed {
		t.Fatalf("breaker %s after an unauthenticated post", st.State)
	}
	// A Bearer header works as well as the cookie.
	if r := h.page(http.MethodGet, "/admin/", nil, nil, map[string]string{"Authorization": "Bearer " + adminToken}); r.status != http.StatusOK {
		t.Fatalf("bearer: %d", r.status)
	}
}

func TestAdminPageShowsState(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Clients = []config.Client{{Name: "team-a", Key: "client-key-a-secret"}}
		c.Retry.MaxAttempts = 1
	})
	h.fake.SetDefault(fakeprovider.Step{Status: 503})
	h.chat(chatBody, map[string]string{"Authorization": "Bearer client-key-a-secret", "Idempotency-Key": "invoice-42/<summary>"})
	ck := h.login()

	r := h.page(http.MethodGet, "/admin/", nil, ck, nil)
	if r.status != http.StatusOK {
		t.Fatalf("page: %d %s", r.status, r.body)
	}
	wantPageHeaders(t, r)
	wantNoSecrets(t, r.body, "client-key-a-secret")
	body := string(r.body)
	for _, want := range []string{
		`<tr id="breaker-primary">`,
		`<span class="badge state closed">closed</span>`,
		`action="/admin/ui/breakers/primary/open"`,
		`<meta http-equiv="refresh" content="5; url=/admin/">`,
		`1 waiting`,
		`team-a`,
		// The key is shown, escaped.
		`invoice-42/&lt;summary&gt;`,
		`action="/admin/ui/deadletters/replay?upstream=primary&amp;class=transient"`,
		`<code>claim</code>`,
		`<code>cache_miss</code>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	if strings.Contains(body, "<summary>") || strings.Contains(body, "<script") {
		t.Error("page has unescaped or script markup")
	}
}

func TestAdminPageRefusesCrossOrigin(t *testing.T) {
	h := newHarness(t, nil)
	ck := h.login()
	host := strings.TrimPrefix(h.srv.URL, "http://")
	for _, tc := range []struct {
		name string
		hdr  map[string]string
		want int
	}{
		{"origin elsewhere", map[string]string{"Origin": "http://evil.example"}, http.StatusForbidden},
		{"sec-fetch-site cross-site", map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": h.srv.URL}, http.StatusForbidden},
		{"sec-fetch-site same-site", map[string]string{"Sec-Fetch-Site": "same-site"}, http.StatusForbidden},
		{"referer elsewhere", map[string]string{"Referer": "http://evil.example/page"}, http.StatusForbidden},
		{"null origin", map[string]string{"Origin": "null"}, http.StatusForbidden},
		// What a browser sends for the page's own form under
		// Referrer-Policy: no-referrer.
		{"browser same-origin", map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "null"}, http.StatusSeeOther},
		{"origin same host", map[string]string{"Origin": h.srv.URL}, http.StatusSeeOther},
		{"referer same host", map[string]string{"Referer": "http://" + host + "/admin/"}, http.StatusSeeOther},
		{"not a browser", nil, http.StatusSeeOther},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.page(http.MethodPost, "/admin/ui/breakers/primary/open", nil, ck, tc.hdr)
			if r.status != tc.want {
				t.Fatalf("status %d, want %d: %s", r.status, tc.want, r.body)
			}
			st, _ := h.gw.breakers.Status(breaker.Key{Upstream: "primary"})
			if tc.want == http.StatusForbidden && st.Forced {
				t.Fatal("refused post forced the breaker")
			}
			if err := h.gw.admin.SetBreakerForced(context.Background(), breaker.Key{Upstream: "primary"}, false); err != nil {
				t.Fatal(err)
			}
		})
	}
	// Logging in is a form post too.
	r := h.page(http.MethodPost, "/admin/login", url.Values{"token": {adminToken}}, nil, map[string]string{"Origin": "http://evil.example"})
	if r.status != http.StatusForbidden || len(r.cookies) != 0 {
		t.Fatalf("cross-origin login: %d %v", r.status, r.cookies)
	}
}

func TestAdminPageForcesBreaker(t *testing.T) {
	h := newHarness(t, nil)
	ck := h.login()
	same := map[string]string{"Origin": h.srv.URL}

	r := h.page(http.MethodPost, "/admin/ui/breakers/primary/open", nil, ck, same)
	if r.status != http.StatusSeeOther || r.header.Get("Location") != "/admin/" {
		t.Fatalf("force open: %d %v %s", r.status, r.header, r.body)
	}
	if st, _ := h.gw.breakers.Status(breaker.Key{Upstream: "primary"}); st.State != breaker.Open || !st.Forced {
		t.Fatalf("breaker after force open: %+v", st)
	}
	page := h.page(http.MethodGet, "/admin/", nil, append(ck, flashOf(t, r)...), nil)
	for _, want := range []string{`<span class="badge state open">open</span>`, `>forced</span>`, `Breaker primary forced open.`, `/admin/ui/breakers/primary/close`} {
		if !strings.Contains(string(page.body), want) {
			t.Errorf("page after force open lacks %s", want)
		}
	}
	// The flash is shown once.
	if again := h.page(http.MethodGet, "/admin/", nil, ck, nil); strings.Contains(string(again.body), "forced open.") {
		t.Error("flash shown without its cookie")
	}

	r = h.page(http.MethodPost, "/admin/ui/breakers/primary/close", nil, ck, same)
	if r.status != http.StatusSeeOther {
		t.Fatalf("close: %d", r.status)
	}
	if st, _ := h.gw.breakers.Status(breaker.Key{Upstream: "primary"}); st.State != breaker.Closed || st.Forced {
		t.Fatalf("breaker after close: %+v", st)
	}

	r = h.page(http.MethodPost, "/admin/ui/breakers/nosuch/open", nil, ck, same)
	page = h.page(http.MethodGet, "/admin/", nil, append(ck, flashOf(t, r)...), nil)
	if !strings.Contains(string(page.body), `No upstream is named &#34;nosuch&#34;.`) {
		t.Errorf("unknown upstream: %s", page.body)
	}
}

func TestAdminPageDeadLetterActions(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Retry.MaxAttempts = 1
		c.DeadLetters.ReplayPerSecond = 1000
	})
	h.fake.SetDefault(fakeprovider.Step{Status: 503})
	for _, k := range []string{"a", "b", "c", "d"} {
		h.chat(chatBody, key("op-"+k))
	}
	if l := listDLQ(t, h, ""); l.Total != 4 {
		t.Fatalf("dead letters %d", l.Total)
	}
	ck := h.login()
	same := map[string]string{"Origin": h.srv.URL}
	h.fake.SetDefault(fakeprovider.Step{})

	// Discard one, replay one.
	l := listDLQ(t, h, "")
	r := h.page(http.MethodPost, "/admin/ui/deadletters/"+l.DeadLetters[0].ID+"/discard", nil, ck, same)
	if r.status != http.StatusSeeOther {
		t.Fatalf("discard: %d %s", r.status, r.body)
	}
	r = h.page(http.MethodPost, "/admin/ui/deadletters/"+l.DeadLetters[1].ID+"/replay", nil, ck, same)
	page := h.page(http.MethodGet, "/admin/", nil, append(ck, flashOf(t, r)...), nil)
	if !strings.Contains(string(page.body), "succeeded (200)") || !strings.Contains(string(page.body), "2 waiting") {
		t.Fatalf("after replay: %s", page.body)
	}

	// Replay the rest as a group.
	r = h.page(http.MethodPost, "/admin/ui/deadletters/replay?upstream=primary&class=transient", nil, ck, same)
	page = h.page(http.MethodGet, "/admin/", nil, append(ck, flashOf(t, r)...), nil)
	if !strings.Contains(string(page.body), "Replayed 2 dead letters of transient on primary: 2 succeeded, 0 failed.") ||
		!strings.Contains(string(page.body), "0 waiting") {
		t.Fatalf("after group replay: %s", page.body)
	}
	if l := listDLQ(t, h, ""); l.Total != 0 {
		t.Fatalf("dead letters left %+v", l)
	}
}

func TestAdminPageDisabled(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.AdminToken = "" })
	for _, tc := range []struct {
		method, path string
		form         url.Values
	}{
		{http.MethodGet, "/admin/", nil},
		{http.MethodGet, "/admin/login", nil},
		{http.MethodPost, "/admin/login", url.Values{"token": {""}}},
		{http.MethodPost, "/admin/ui/breakers/primary/open", nil},
	} {
		r := h.page(tc.method, tc.path, tc.form, []*http.Cookie{{Name: admin.Cookie, Value: ""}}, nil)
		if r.status != http.StatusForbidden {
			t.Errorf("%s %s: %d, want 403", tc.method, tc.path, r.status)
		}
		for _, c := range r.cookies {
			if c.Name == admin.Cookie {
				t.Errorf("%s %s set the admin cookie", tc.method, tc.path)
			}
		}
	}
	if st, _ := h.gw.breakers.Status(breaker.Key{Upstream: "primary"}); st.Forced {
		t.Fatal("breaker forced with admin disabled")
	}
}

// TestAdminPageTokenCharacters: the cookie carries a session id, so a token
// with bytes a cookie cannot hold signs in like any other.
func TestAdminPageTokenCharacters(t *testing.T) {
	for _, token := range []string{"token with spaces, and a comma", `token;with"bytes`} {
		t.Run(token, func(t *testing.T) {
			h := newHarness(t, func(c *config.Config) { c.AdminToken = token })
			r := h.page(http.MethodPost, "/admin/login", url.Values{"token": {token}}, nil, nil)
			if r.status != http.StatusSeeOther {
				t.Fatalf("login: %d %s", r.status, r.body)
			}
			var ck []*http.Cookie
			for _, c := range r.cookies {
				if c.Name == admin.Cookie && c.Path == "/admin" {
					ck = append(ck, c)
				}
			}
			if p := h.page(http.MethodGet, "/admin/", nil, ck, nil); p.status != http.StatusOK {
				t.Fatalf("page with the cookie: %d", p.status)
			}
		})
	}
}

// The page shows the tokens counted since start, used and saved by replays,
// as the usage fields of the answers said.
func TestAdminPageShowsTokens(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Clients = []config.Client{{Name: "team-a", Key: "client-key-a-secret"}}
	})
	hdr := map[string]string{"Authorization": "Bearer client-key-a-secret", "Idempotency-Key": "tokens-1"}
	first := h.chat(chatBody, hdr)
	h.chat(chatBody, hdr) // a replay: saved
	var u struct {
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(first.body, &u); err != nil || u.Usage.PromptTokens == 0 {
		t.Fatalf("answer usage: %v %s", err, first.body)
	}
	body := string(h.page(http.MethodGet, "/admin/", nil, h.login(), nil).body)
	for kind, want := range map[string]int{
		"input": u.Usage.PromptTokens, "output": u.Usage.CompletionTokens,
		"saved-input": u.Usage.PromptTokens, "saved-output": u.Usage.CompletionTokens, "missing": 0,
	} {
		if s := fmt.Sprintf(`data-tokens="%s">%d<`, kind, want); !strings.Contains(body, s) {
			t.Errorf("page lacks %s", s)
		}
	}
	if !strings.Contains(body, "<td>team-a</td>") {
		t.Error("page lacks the per-client row")
	}
}
