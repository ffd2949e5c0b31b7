package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/llmgate/llmgate/config"
)

// TestUpstreamCredential: a hop's key goes out as its upstream's auth
// says — x-api-key for an Anthropic upstream unless it says bearer — and
// the client's own Authorization and x-api-key never do; anthropic-version
// is the client's when it sent one, any value, else the upstream's default.
func TestUpstreamCredential(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		up                        config.Upstream
		clientVersion             string
		wantAuth, wantKey, wantAV string
	}{
		{"openai", config.Upstream{}, "", "Bearer sk-hop", "", ""},
		{"anthropic", config.Upstream{API: config.APIAnthropic}, "", "", "sk-hop", "2023-06-01"},
		{"anthropic, the client's version", config.Upstream{API: config.APIAnthropic}, "2026-10-21", "", "sk-hop", "2026-10-21"},
		{"anthropic under a bearer token", config.Upstream{API: config.APIAnthropic, Auth: config.AuthBearer}, "", "Bearer sk-hop", "", "2023-06-01"},
		{"anthropic, its own default", config.Upstream{API: config.APIAnthropic, AnthropicVersion: "2024-01-01"}, "", "", "sk-hop", "2024-01-01"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.up.Name, tc.up.BaseURL = "u", "https://provider.test"
			u, err := newUpstream(tc.up)
			if err != nil {
				t.Fatal(err)
			}
			in := httptest.NewRequest(http.MethodPost, "/v1/messages", nil)
			in.Header.Set("Authorization", "Bearer gw-client-key")
			in.Header.Set("X-Api-Key", "gw-client-key")
			if tc.clientVersion != "" {
				in.Header.Set("Anthropic-Version", tc.clientVersion)
			}
			req, err := u.newUpstreamRequest(context.Background(), in, outgoing{suffix: "/v1/messages", key: "sk-hop"}, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got := req.Header.Get("Authorization"); got != tc.wantAuth {
				t.Errorf("Authorization = %q, want %q", got, tc.wantAuth)
			}
			if got := req.Header.Get("X-Api-Key"); got != tc.wantKey {
				t.Errorf("X-Api-Key = %q, want %q", got, tc.wantKey)
			}
			if got := req.Header.Get("Anthropic-Version"); got != tc.wantAV {
				t.Errorf("Anthropic-Version = %q, want %q", got, tc.wantAV)
			}
		})
	}
}
