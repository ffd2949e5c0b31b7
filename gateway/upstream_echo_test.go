package gateway

import (
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
)

// keyEchoUpstream answers every request with status and an error body that
// quotes the credential it was sent, as some OpenAI-compatible servers do
// (LiteLLM's proxy: "Received API Key = sk-…").
type keyEchoUpstream struct{ status atomic.Int32 }

func (e *keyEchoUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	cred := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if k := r.Header.Get("X-Api-Key"); k != "" {
		cred = k
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(int(e.status.Load()))
	fmt.Fprintf(w, `{"error":{"message":"Invalid request. Received API Key = %s, key=%s.","type":"invalid_request_error"}}`, cred, cred)
}

// TestUpstreamErrorEchoingKeyRedacted: an upstream error body that quotes
// the key the gateway sent it (the upstream's api_key, or a client's own
// upstream_api_keys entry) reaches no client, log, dead letter or stored
// byte: every copy is replaced with [redacted], the rest of the body is
// relayed as it came.
func TestUpstreamErrorEchoingKeyRedacted(t *testing.T) {
	const ownKey = "sk-alice-own-provider-key-778899"
	echo := &keyEchoUpstream{}
	url := newTestServer(t, echo)
	h := newHarness(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = url + "/v1"
		c.Upstreams[0].Models = []string{"gpt-*"}
		c.Upstreams = append(c.Upstreams, config.Upstream{Name: "anthropic", BaseURL: url, APIKey: anthropicKey,
			API: config.APIAnthropic, Models: []string{"claude-*"}, Timeout: config.Duration(5 * time.Second)})
		c.Clients = []config.Client{
			{Name: "alice", Key: aliceKey, UpstreamAPIKeys: map[string]string{"primary": ownKey}},
			{Name: "bob", Key: bobKey},
		}
	})
	secrets := map[string]string{"upstream key": upstreamKey, "anthropic key": anthropicKey, "alice's own key": ownKey}
	var seen strings.Builder
	check := func(name string, r result, status int) {
		t.Helper()
		fmt.Fprintf(&seen, "%d %v %s\n", r.status, r.header, r.body)
		if r.status != status {
			t.Fatalf("%s: status %d, want %d: %s", name, r.status, status, r.body)
		}
	}

	echo.status.Store(http.StatusBadRequest)
	r := h.do(http.MethodPost, "/v1/chat/completions", chatBody, map[string]string{"Authorization": "Bearer " + bobKey})
	check("shared key, 400", r, http.StatusBadRequest)
	if want := `{"error":{"message":"Invalid request. Received API Key = [redacted], key=[redacted].","type":"invalid_request_error"}}`; string(r.body) != want {
		t.Errorf("400 body = %s, want %s", r.body, want)
	}
	r = h.do(http.MethodPost, "/v1/messages", messagesBody, map[string]string{"Authorization": "Bearer " + bobKey, "Anthropic-Version": "2023-06-01"})
	check("anthropic, 400", r, http.StatusBadRequest)

	echo.status.Store(http.StatusServiceUnavailable)
	r = h.do(http.MethodPost, "/v1/chat/completions", chatBody, map[string]string{"Authorization": "Bearer " + aliceKey, "Idempotency-Key": "echo-1"})
	if r.status < 500 {
		t.Fatalf("own key, keyed 503: status %d: %s", r.status, r.body)
	}
	fmt.Fprintf(&seen, "%d %v %s\n", r.status, r.header, r.body)
	for _, path := range []string{"/admin/deadletters", "/admin/breakers", "/admin/stats"} {
		r := h.admin(http.MethodGet, path)
		check(path, r, http.StatusOK)
	}
	if !strings.Contains(seen.String(), "[redacted]") {
		t.Errorf("no echo came back redacted: %s", seen.String())
	}
	var files strings.Builder
	_ = filepath.WalkDir(h.cfg.DataDir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := os.ReadFile(path)
			files.Write(b)
		}
		return nil
	})
	for name, s := range secrets {
		for where, text := range map[string]string{"logs": h.logs.String(), "answers": seen.String(), "data dir": files.String()} {
			if strings.Contains(text, s) {
				t.Errorf("the %s appears in the %s", name, where)
			}
		}
	}
}
