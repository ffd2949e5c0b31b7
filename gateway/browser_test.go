package gateway

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/llmgate/llmgate/breaker"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// chromiumPath is where Debian's chromium package puts the browser.
const chromiumPath = "/usr/bin/chromium"

// newBrowser starts a headless Chromium for the test and returns a context
// driving one tab, bounded by timeout. It skips the test when there is no
// browser, unless LLMGATE_REQUIRE_BROWSER=1 (CI), where that is a failure.
func newBrowser(t *testing.T, timeout time.Duration) context.Context {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("LLMGATE_REQUIRE_BROWSER") == "1" {
			t.Fatalf("LLMGATE_REQUIRE_BROWSER=1 but there is no browser at %s: %v", chromiumPath, err)
		}
		t.Skipf("no browser at %s (apt-get install chromium): %v", chromiumPath, err)
	}
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox, // CI runs as root, where Chromium's sandbox cannot start
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	tabCtx, cancelTab := chromedp.NewContext(allocCtx)
	// Cleanups run last-in first-out: the tab closes, then the browser
	// process is killed and waited for, before the user-data dir (an
	// earlier cleanup) is removed.
	t.Cleanup(cancel)
	t.Cleanup(cancelAlloc)
	t.Cleanup(cancelTab)
	if err := chromedp.Do(tabCtx); err != nil {
		t.Fatalf("starting %s: %v", chromiumPath, err)
	}
	return tabCtx
}

// TestAdminPageInBrowser drives the page in a real browser: log in through
// the form, see the open breaker, close it with its button.
func TestAdminPageInBrowser(t *testing.T) {
	ctx := newBrowser(t, 60*time.Second)
	h := newHarness(t, func(c *config.Config) {
		c.Breaker.ConsecutiveFailures = 2
		c.Retry.MaxAttempts = 1
	})
	// The upstream goes down: two keyed requests fail and open the
	// breaker, a third is refused by it — three dead letters for the page.
	h.fake.SetDefault(fakeprovider.Step{Status: 503})
	for i := range 3 {
		h.chat(chatBody, key(fmt.Sprintf("nightly-report/%d", i)))
	}
	if st, _ := h.gw.breakers.Status(breaker.Key{Upstream: "primary", Model: "gpt-4o-mini"}); st.State != breaker.Open {
		t.Fatalf("breaker %s after two failures, want open", st.State)
	}

	// The model's row: its breaker is the one the failures opened.
	const state = chromedp.CSS(`[id="breaker-primary/gpt-4o-mini"] .state`)
	err := chromedp.Do(ctx,
		chromedp.Navigate(h.srv.URL+"/admin/login"),
		chromedp.WaitVisible(chromedp.CSS(`#token`)),
		chromedp.SendKeys(chromedp.CSS(`#token`), adminToken),
		chromedp.Click(chromedp.CSS(`button[type=submit]`)),
		chromedp.WaitVisible(state),
	)
	if err != nil {
		t.Fatalf("log in: %v", err)
	}
	if before := run(t, ctx, chromedp.Text(state)); before != "open" {
		t.Fatalf("breaker badge reads %q, want open", before)
	}
	shotOpen := run(t, ctx, chromedp.FullScreenshot(100))

	err = chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`[id="breaker-primary/gpt-4o-mini"] button.close`)),
		// Only the page an action redirects to has a flash message.
		chromedp.WaitVisible(chromedp.CSS(`#flash`)),
	)
	if err != nil {
		t.Fatalf("close the breaker: %v", err)
	}
	if after := run(t, ctx, chromedp.Text(state)); after != "closed" {
		t.Fatalf("breaker badge reads %q after Close, want closed", after)
	}
	shotClosed := run(t, ctx, chromedp.FullScreenshot(100))
	if st, _ := h.gw.breakers.Status(breaker.Key{Upstream: "primary", Model: "gpt-4o-mini"}); st.State != breaker.Closed {
		t.Fatalf("breaker %s after Close, want closed", st.State)
	}
	// Logging in through the page leaves no trace of the token.
	if strings.Contains(h.logs.String(), adminToken) {
		t.Fatal("the admin token is in the gateway's log")
	}

	dir := t.TempDir()
	writeShot(t, filepath.Join(dir, "admin-open.png"), shotOpen)
	writeShot(t, filepath.Join(dir, "admin-closed.png"), shotClosed)
	if p := os.Getenv("LLMGATE_SCREENSHOT"); p != "" {
		writeShot(t, p, shotOpen)
		writeShot(t, strings.TrimSuffix(p, filepath.Ext(p))+"-closed"+filepath.Ext(p), shotClosed)
	}
}

// run runs one browser action that returns a value, failing the test on
// its error.
func run[T any](t *testing.T, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func writeShot(t *testing.T, path string, png []byte) {
	t.Helper()
	if ct := http.DetectContentType(png); ct != "image/png" {
		t.Fatalf("screenshot is %s, not a PNG", ct)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}
