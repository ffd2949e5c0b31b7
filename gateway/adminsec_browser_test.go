package gateway

import (
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// TestAdminCrossSiteFormsInBrowser signs an operator in to the page in a
// real Chromium, then opens a page served from another loopback port — the
// same site, so the SameSite=Strict cookie rides along — that auto-submits
// forms (and no-cors fetches) to the admin API and to the page's own form
// routes. None of them may change anything: the breaker stays closed, the
// dead letter stays, the operator stays signed in. The page's own forms
// still work afterwards.
func TestAdminCrossSiteFormsInBrowser(t *testing.T) {
	ctx := newBrowser(t, 90*time.Second)
	h := newHarness(t, func(c *config.Config) {
		c.Retry.MaxAttempts = 1
		c.DeadLetters.ReplayPerSecond = 1000
	})
	// One dead letter; with the upstream healthy again, a replay of it
	// would succeed and resolve it, and a discard would delete it.
	h.fake.SetDefault(fakeprovider.Step{Status: 503})
	h.chat(chatBody, key("csrf/victim"))
	dl := listDLQ(t, h, "")
	if dl.Total != 1 {
		t.Fatalf("dead letters %d, want 1", dl.Total)
	}
	id := dl.DeadLetters[0].ID
	h.fake.SetDefault(fakeprovider.Step{})

	// The gateway as the browser sees it, recording every request that
	// has been answered and how, so the test knows the attacks were
	// delivered and refused.
	var mu sync.Mutex
	var done []string
	status := map[string]int{}
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.gw.Handler().ServeHTTP(sw, r)
		mu.Lock()
		req := r.Method + " " + r.URL.RequestURI()
		done = append(done, req)
		status[req] = sw.status
		mu.Unlock()
	}))
	t.Cleanup(front.Close)
	answered := func(req string) bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(done, req)
	}

	targets := []string{
		"/admin/breakers/primary/open",
		"/admin/deadletters/" + id + "/replay",
		"/admin/deadletters/replay?upstream=primary&class=transient",
		"/admin/ui/breakers/primary/open",
		"/admin/ui/deadletters/" + id + "/replay",
		"/admin/ui/deadletters/" + id + "/discard",
		"/admin/ui/deadletters/replay?upstream=primary&class=transient",
		"/admin/logout",
	}
	fetched := []string{"/admin/breakers/primary/open", "/admin/ui/breakers/primary/open"}
	var page strings.Builder
	page.WriteString("<!doctype html><title>cat pictures</title>\n")
	for i, p := range targets {
		fmt.Fprintf(&page, "<iframe name=f%d></iframe><form method=post target=f%d action=\"%s\"><input type=hidden name=x value=1></form>\n",
			i, i, html.EscapeString(front.URL+p))
	}
	page.WriteString("<script>\nfor (const f of document.forms) f.submit();\n")
	for _, p := range fetched {
		fmt.Fprintf(&page, "fetch(%q, {method: 'POST', mode: 'no-cors', credentials: 'include', body: 'x=1'});\n", front.URL+p)
	}
	page.WriteString("</script>\n")
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(page.String()))
	}))
	t.Cleanup(evil.Close)
	if strings.Split(evil.URL, ":")[1] != strings.Split(front.URL, ":")[1] {
		t.Fatalf("the two servers are not on the same host: %s, %s", evil.URL, front.URL)
	}

	const state = chromedp.CSS(`#breaker-primary .state`)
	err := chromedp.Do(ctx,
		chromedp.Navigate(front.URL+"/admin/login"),
		chromedp.WaitVisible(chromedp.CSS(`#token`)),
		chromedp.SendKeys(chromedp.CSS(`#token`), adminToken),
		chromedp.Click(chromedp.CSS(`button[type=submit]`)),
		chromedp.WaitVisible(state),
		chromedp.Navigate(evil.URL),
	)
	if err != nil {
		t.Fatalf("sign in, then open the other page: %v", err)
	}
	// Wait, bounded, until the gateway has answered every attack.
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range targets {
		for !answered("POST " + p) {
			if time.Now().After(deadline) {
				t.Fatalf("the browser never sent POST %s; answered: %q", p, done)
			}
			select {
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}

	mu.Lock()
	for _, p := range targets {
		st := status["POST "+p]
		t.Logf("cross-site POST %s: %d", p, st)
		if want := http.StatusForbidden; strings.HasPrefix(p, "/admin/ui/") || p == "/admin/logout" {
			if st != want {
				t.Errorf("cross-site POST %s: %d, want %d (the origin check)", p, st, want)
			}
		} else if st != http.StatusUnauthorized {
			t.Errorf("cross-site POST %s: %d, want 401 (the API takes no cookie)", p, st)
		}
	}
	mu.Unlock()
	if st, _ := h.gw.breakers.Status(breaker.Key{Upstream: "primary"}); st.State != breaker.Closed || st.Forced {
		t.Errorf("a cross-site form changed the breaker: %+v", st)
	}
	if l := listDLQ(t, h, ""); l.Total != 1 {
		t.Errorf("a cross-site form replayed or discarded the dead letter: %d left", l.Total)
	}
	if strings.Contains(h.logs.String(), adminToken) {
		t.Error("the admin token is in the gateway's log")
	}

	// The operator is still signed in, and the page's own form works.
	err = chromedp.Do(ctx,
		chromedp.Navigate(front.URL+"/admin/"),
		chromedp.WaitVisible(state),
		chromedp.Click(chromedp.CSS(`#breaker-primary button.open`)),
		chromedp.WaitVisible(chromedp.CSS(`#flash`)),
	)
	if err != nil {
		t.Fatalf("force open from the page: %v", err)
	}
	if st, _ := h.gw.breakers.Status(breaker.Key{Upstream: "primary"}); st.State != breaker.Open || !st.Forced {
		t.Fatalf("the page's own Force open did not force the breaker: %+v", st)
	}
}

// statusWriter records the status a handler answered with. Unwrap lets
// http.ResponseController reach the connection beneath.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
