package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	badgerstore "github.com/llmgate/llmgate/cache/badger"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// harness is a gateway in front of a scripted fake upstream, both real HTTP
// servers on loopback, with a real Badger store in a temp dir.
type harness struct {
	t     *testing.T
	fake  *fakeprovider.Server
	up    *httptest.Server
	gw    *Gateway
	srv   *httptest.Server
	store *badgerstore.Store
	logs  *syncBuffer
	cfg   config.Config
}

const (
	upstreamKey = "sk-upstream-secret-0123456789"
	adminToken  = "admin-secret-token-abcdef"
)

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testConfig is a config for one upstream named "primary" at url, with
// fast retries so tests do not wait on backoff.
func testConfig(url string) config.Config {
	c := config.Default()
	c.AdminToken = adminToken
	c.Upstreams = []config.Upstream{{
		Name: "primary", BaseURL: url + "/v1", APIKey: upstreamKey,
		Models: []string{"*"}, Timeout: config.Duration(5 * time.Second),
	}}
	c.Retry.BaseDelay = config.Duration(time.Millisecond)
	c.Retry.MaxDelay = config.Duration(5 * time.Millisecond)
	c.Retry.BudgetMinPerSecond = 1000
	c.Idempotency.WaitTimeout = config.Duration(10 * time.Second)
	return c
}

func newHarness(t *testing.T, mutate func(c *config.Config)) *harness {
	t.Helper()
	return newHarnessStore(t, mutate, nil, fakeprovider.Options{})
}

// newHarnessStore is newHarness with the store wrapped by wrap (fault
// injection) and the fake upstream built with fo.
func newHarnessStore(t *testing.T, mutate func(c *config.Config), wrap func(Store) Store, fo fakeprovider.Options) *harness {
	t.Helper()
	return newHarnessOptions(t, mutate, wrap, fo, nil)
}

// newHarnessOptions is newHarnessStore with the gateway's Options adjusted
// by opts (a clock, say) before it is built.
func newHarnessOptions(t *testing.T, mutate func(c *config.Config), wrap func(Store) Store, fo fakeprovider.Options, opts func(*Options)) *harness {
	t.Helper()
	h := &harness{t: t, fake: fakeprovider.New(fo), logs: &syncBuffer{}}
	h.up = httptest.NewServer(h.fake)
	t.Cleanup(h.up.Close)
	t.Cleanup(h.fake.Close)
	h.cfg = testConfig(h.up.URL)
	if mutate != nil {
		mutate(&h.cfg)
	}
	if err := h.cfg.Validate(); err != nil {
		t.Fatalf("test config invalid: %v", err)
	}
	h.cfg.DataDir = t.TempDir()
	store, err := badgerstore.Open(badgerstore.Options{Dir: h.cfg.DataDir})
	if err != nil {
		t.Fatal(err)
	}
	h.store = store
	t.Cleanup(func() { store.Close() })
	var st Store = store
	if wrap != nil {
		st = wrap(store)
	}
	o := Options{Config: h.cfg, Store: st,
		Logger: slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	if opts != nil {
		opts(&o)
	}
	gw, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	h.gw = gw
	h.srv = httptest.NewServer(gw.Handler())
	t.Cleanup(h.srv.Close)
	t.Cleanup(gw.Close)
	return h
}

type result struct {
	status int
	header http.Header
	body   []byte
}

// requestLimit bounds every harness request, reading the answer included,
// so that a gateway that hangs fails the test instead of hanging it.
const requestLimit = 30 * time.Second

var testClient = &http.Client{Timeout: requestLimit}

// do sends a request to the gateway and reads the whole answer.
func (h *harness) do(method, path, body string, hdr map[string]string) result {
	h.t.Helper()
	r, err := h.try(method, path, body, hdr)
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

// try is do for goroutines other than the test's, which must not call
// t.Fatal: it returns the error instead.
func (h *harness) try(method, path, body string, hdr map[string]string) (result, error) {
	res, err := h.send(context.Background(), method, path, body, hdr)
	if err != nil {
		return result{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return result{}, fmt.Errorf("%s %s: reading body: %w", method, path, err)
	}
	return result{status: res.StatusCode, header: res.Header, body: b}, nil
}

// chatAsync sends a chat request from its own goroutine; await takes its
// result. The request is bounded by requestLimit, so await is too.
func (h *harness) chatAsync(body string, hdr map[string]string) <-chan asyncResult {
	ch := make(chan asyncResult, 1)
	go func() {
		r, err := h.try(http.MethodPost, "/v1/chat/completions", body, hdr)
		ch <- asyncResult{r, err}
	}()
	return ch
}

type asyncResult struct {
	r   result
	err error
}

func (h *harness) await(ch <-chan asyncResult) result {
	h.t.Helper()
	a := <-ch
	if a.err != nil {
		h.t.Fatal(a.err)
	}
	return a.r
}

func (h *harness) send(ctx context.Context, method, path, body string, hdr map[string]string) (*http.Response, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, h.srv.URL+path, rd)
	if err != nil {
		return nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return testClient.Do(req)
}

func (h *harness) chat(body string, hdr map[string]string) result {
	h.t.Helper()
	return h.do(http.MethodPost, "/v1/chat/completions", body, hdr)
}

func (h *harness) admin(method, path string) result {
	h.t.Helper()
	return h.do(method, path, "", map[string]string{"Authorization": "Bearer " + adminToken})
}

const chatBody = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hello"}]}`
const streamBody = `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Hello"}]}`

// wantOpenAIError checks r is an OpenAI error object with the status.
func wantOpenAIError(t *testing.T, r result, status int) map[string]any {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d; body %s", r.status, status, r.body)
	}
	var e struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal(r.body, &e); err != nil || e.Error == nil {
		t.Fatalf("body is not an OpenAI error object: %s", r.body)
	}
	for _, f := range []string{"message", "type", "param", "code"} {
		if _, ok := e.Error[f]; !ok {
			t.Fatalf("error object lacks %q: %s", f, r.body)
		}
	}
	if m, _ := e.Error["message"].(string); m == "" {
		t.Fatalf("error message empty: %s", r.body)
	}
	return e.Error
}

func newTestServer(t *testing.T, h http.Handler) string {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	if c, ok := h.(interface{ Close() }); ok {
		t.Cleanup(c.Close)
	}
	return s.URL
}

func readAllBody(t *testing.T, res *http.Response) []byte {
	t.Helper()
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
