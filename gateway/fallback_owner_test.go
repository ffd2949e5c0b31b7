package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/ownership"
)

// fallbackHarness is alice and bob in front of two upstreams: primary,
// where alice has her own key and which falls back to second, and
// second, which both reach with the shared key. Bob owns a response, a
// conversation and a file on second.
func fallbackHarness(t *testing.T) (h *harness, primary, second *objectUpstream) {
	t.Helper()
	second = &objectUpstream{}
	s := httptest.NewServer(second)
	t.Cleanup(s.Close)
	h, primary = ownersHarness(t, func(c *config.Config) {
		c.Clients[0].UpstreamAPIKeys = map[string]string{"primary": aliceOwn}
		c.Upstreams[0].Models = []string{"gpt-4o"}
		c.Upstreams[0].Fallbacks = []string{"second"}
		c.Upstreams = append(c.Upstreams, config.Upstream{Name: "second", BaseURL: s.URL + "/v1", APIKey: upstreamKey,
			Models: []string{"bob-model"}, Timeout: config.Duration(5 * time.Second)})
	})
	ctx := context.Background()
	err := h.gw.owners.Record(ctx, "bob", "second", []ownership.Ref{
		{Kind: ownership.Response, ID: "resp_bob"},
		{Kind: ownership.Conversation, ID: "conv_bob"},
		{Kind: ownership.File, ID: "file-bob"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	primary.mu.Lock()
	primary.down = true
	primary.mu.Unlock()
	return h, primary, second
}

// TestFallbackHopKeepsOwnership: a client with its own key on the routed
// upstream names another tenant's objects; the routed upstream fails and
// its fallback is reached with the shared key. The fallback hop is never
// sent: the objects were not checked as the client's for that credential.
func TestFallbackHopKeepsOwnership(t *testing.T) {
	for _, rq := range []struct{ method, path, body string }{
		{http.MethodPost, "/v1/responses", `{"model":"gpt-4o","input":"go on","previous_response_id":"resp_bob"}`},
		{http.MethodPost, "/v1/responses", `{"model":"gpt-4o","input":"go on","conversation":"conv_bob"}`},
		{http.MethodPost, "/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"file-bob"}}]}]}`},
		{http.MethodGet, "/v1/responses/resp_bob", ""},
		{http.MethodDelete, "/v1/responses/resp_bob", ""},
		{http.MethodGet, "/v1/conversations/conv_bob", ""},
		{http.MethodDelete, "/v1/conversations/conv_bob", ""},
		{http.MethodGet, "/v1/files/file-bob", ""},
		{http.MethodDelete, "/v1/files/file-bob", ""},
		{http.MethodGet, "/v1/files/file-bob/content", ""},
		{http.MethodGet, "/v1/files", ""},
	} {
		t.Run(rq.method+" "+rq.path+" "+rq.body, func(t *testing.T) {
			h, primary, second := fallbackHarness(t)
			r := h.do(rq.method, rq.path, rq.body, asAlice)
			if r.status == http.StatusOK {
				t.Fatalf("alice reached bob's object through the fallback: %d %s", r.status, r.body)
			}
			if seen := second.requests(); len(seen) != 0 {
				t.Fatalf("the fallback hop was sent with the shared key: %+v", seen)
			}
			if seen := primary.requests(); len(seen) == 0 || seen[0].Auth != "Bearer "+aliceOwn {
				t.Fatalf("primary saw %+v, want alice's own key", seen)
			}
		})
	}
}

// TestFallbackHopWithoutObjects: a request that names no objects still
// falls back to the shared-key upstream when the routed one fails.
func TestFallbackHopWithoutObjects(t *testing.T) {
	h, _, second := fallbackHarness(t)
	r := h.do(http.MethodPost, "/v1/responses", `{"model":"gpt-4o","input":"hello"}`, asAlice)
	if r.status != http.StatusOK || r.header.Get("X-Llmgate-Upstream") != "second" {
		t.Fatalf("%d %v %s", r.status, r.header, r.body)
	}
	if seen := second.requests(); len(seen) != 1 || seen[0].Auth != "Bearer "+upstreamKey {
		t.Fatalf("second saw %+v", seen)
	}
}

// TestObjectCreatedThroughSharedFallbackIsReachable: alice's create fell
// back from primary (her own key) to second (the shared key), so second
// holds the response, recorded as hers there. Continuing it goes to
// second, the one upstream that holds it — not to primary, which answers
// 404 (no retry, no fallback) and would leave it unreachable.
func TestObjectCreatedThroughSharedFallbackIsReachable(t *testing.T) {
	h, primary, second := fallbackHarness(t)
	r := h.do(http.MethodPost, "/v1/responses", `{"model":"gpt-4o","input":"hello"}`, asAlice)
	if r.status != http.StatusOK || r.header.Get("X-Llmgate-Upstream") != "second" {
		t.Fatalf("create: %d %v %s", r.status, r.header, r.body)
	}
	var created struct{ ID string }
	if err := json.Unmarshal(r.body, &created); err != nil || created.ID == "" {
		t.Fatalf("create answered %s: %v", r.body, err)
	}
	primary.mu.Lock()
	primary.down, primary.holdsNone = false, true
	primary.mu.Unlock()
	primary.requests()
	second.requests()

	r = h.do(http.MethodPost, "/v1/responses", `{"model":"gpt-4o","input":"go on","previous_response_id":"`+created.ID+`"}`, asAlice)
	if r.status != http.StatusOK || r.header.Get("X-Llmgate-Upstream") != "second" {
		t.Fatalf("continuing the response alice created: %d %v %s", r.status, r.header.Get("X-Llmgate-Upstream"), r.body)
	}
	if seen := second.requests(); len(seen) != 1 || seen[0].Auth != "Bearer "+upstreamKey {
		t.Fatalf("second saw %+v, want the request under the shared key", seen)
	}
	if seen := primary.requests(); len(seen) != 0 {
		t.Fatalf("primary, which does not hold the response, saw %+v", seen)
	}
	// Bob's objects on second stay out of alice's reach.
	if r := h.do(http.MethodPost, "/v1/responses", `{"model":"gpt-4o","input":"go on","previous_response_id":"resp_bob"}`, asAlice); r.status == http.StatusOK {
		t.Fatalf("alice reached bob's response: %s", r.body)
	}
	if seen := second.requests(); len(seen) != 0 {
		t.Fatalf("second saw alice's request naming bob's response: %+v", seen)
	}
}
