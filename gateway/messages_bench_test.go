package gateway

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	badgerstore "github.com/llmgate/llmgate/cache/badger"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// BenchmarkMessagesRoute is the request path, handler to upstream and
// back (real loopback upstreams; no client connection), for
// /v1/chat/completions and /v1/messages in one gateway, JSON and stream:
// what the Anthropic route costs beside the chat route. The upstreams
// differ (the chat fake generates its answer, the Anthropic fake writes a
// canned one), which the figures include.
func BenchmarkMessagesRoute(b *testing.B) {
	chat := httptest.NewServer(fakeprovider.New(fakeprovider.Options{KeepRequests: -1}))
	defer chat.Close()
	fa := fakeprovider.NewAnthropic()
	fa.Discard = true
	ant := httptest.NewServer(fa)
	defer ant.Close()
	cfg := testConfig(chat.URL)
	cfg.Upstreams[0].Models = []string{"gpt-*"}
	cfg.Upstreams = append(cfg.Upstreams, config.Upstream{Name: "anthropic", BaseURL: ant.URL, APIKey: anthropicKey,
		API: config.APIAnthropic, Models: []string{"claude-*"}, Timeout: config.Duration(5 * time.Second)})
	h := benchGateway(b, cfg)
	for _, c := range []struct{ name, path, body string }{
		{"chat/json", "/v1/chat/completions", chatBody},
		{"messages/json", "/v1/messages", messagesBody},
		{"chat/stream", "/v1/chat/completions", streamBody},
		{"messages/stream", "/v1/messages", messagesStreamBody},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req := httptest.NewRequest(http.MethodPost, c.path, strings.NewReader(c.body))
				req.Header.Set("Content-Type", "application/json")
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
		})
	}
}

// benchGateway is a gateway on cfg over real Badger in a temp dir, closed
// (with its store) when b ends; its handler.
func benchGateway(b *testing.B, cfg config.Config) http.Handler {
	b.Helper()
	cfg.DataDir = b.TempDir()
	store, err := badgerstore.Open(badgerstore.Options{Dir: cfg.DataDir})
	if err != nil {
		b.Fatal(err)
	}
	gw, err := New(Options{Config: cfg, Store: store})
	if err != nil {
		store.Close()
		b.Fatal(err)
	}
	b.Cleanup(func() {
		gw.Close()
		store.Close()
	})
	return gw.Handler()
}
