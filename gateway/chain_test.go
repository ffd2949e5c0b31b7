package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/gateway/request"
)

const (
	frontKey = "sk-gw-front-0123456789"
	t1Key    = "sk-gw-t1-0123456789"
	t2Key    = "sk-gw-t2-0123456789"
)

var (
	asT1 = map[string]string{"Authorization": "Bearer " + t1Key}
	asT2 = map[string]string{"Authorization": "Bearer " + t2Key}
)

// providerSeen is a fake provider that answers each chat completion with a
// new id and records the X-Llmgate-Tenant of each request.
type providerSeen struct {
	mu      sync.Mutex
	n       atomic.Int64
	tenants []string
}

func (p *providerSeen) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	n := p.n.Add(1)
	p.mu.Lock()
	p.tenants = append(p.tenants, r.Header.Get(request.TenantHeader))
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"chatcmpl-%d","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`, n)
}

// chain is an outer gateway (clients t1 and t2) in front of an inner one
// (client front, content cache on) in front of a fake provider.
func chain(t *testing.T, inner func(*config.Config)) (outer, in *harness, p *providerSeen) {
	t.Helper()
	p = &providerSeen{}
	ps := httptest.NewServer(p)
	t.Cleanup(ps.Close)
	in = newHarnessStore(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = ps.URL + "/v1"
		c.Upstreams[0].Cache = true
		c.Clients = []config.Client{{Name: "front", Key: frontKey}, {Name: "alice", Key: aliceKey}, {Name: "bob", Key: bobKey}}
		if inner != nil {
			inner(c)
		}
	}, nil, simOptions())
	outer = newHarnessStore(t, func(c *config.Config) {
		c.Upstreams[0].BaseURL = in.srv.URL + "/v1"
		c.Upstreams[0].APIKey = frontKey
		c.Clients = []config.Client{{Name: "t1", Key: t1Key}, {Name: "t2", Key: t2Key}}
	}, nil, simOptions())
	return outer, in, p
}

func completionID(t *testing.T, r result) string {
	t.Helper()
	var v struct{ ID string }
	if err := json.Unmarshal(r.body, &v); r.status != http.StatusOK || err != nil || v.ID == "" {
		t.Fatalf("%d %s", r.status, r.body)
	}
	return v.ID
}

// TestChainedTenantsDoNotShareTheInnerCache: behind an outer gateway, t1
// and t2 are one client (front) of the inner gateway, whose content cache
// is on. The outer forwards an opaque id per tenant on every request, and
// the inner keeps each tenant's cache entries apart: t2 sending t1's
// prompt gets its own completion, not t1's, while t1 again hits its own.
func TestChainedTenantsDoNotShareTheInnerCache(t *testing.T) {
	outer, _, p := chain(t, nil)
	first := completionID(t, outer.chat(chatBody, asT1))
	if again := completionID(t, outer.chat(chatBody, asT1)); again != first {
		t.Fatalf("t1's own repeat: %s, want the cached %s", again, first)
	}
	if other := completionID(t, outer.chat(chatBody, asT2)); other == first {
		t.Fatalf("t2 got t1's cached completion %s", first)
	}
	if n := p.n.Load(); n != 2 {
		t.Fatalf("provider called %d times, want 2 (one per tenant)", n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.tenants) != 2 || p.tenants[0] == "" || p.tenants[0] == p.tenants[1] || strings.Contains(p.tenants[0], "t1") {
		t.Fatalf("tenant ids the provider saw: %q, want two distinct opaque ones", p.tenants)
	}
}

// TestTenantHeaderOnlyNarrows: a client's forwarded tenant id never
// reaches another client's cache entries, whatever its value; a malformed
// or repeated one is a 400.
func TestTenantHeaderOnlyNarrows(t *testing.T) {
	_, in, p := chain(t, nil)
	as := func(who map[string]string, tenant string) map[string]string {
		return merged(who, map[string]string{request.TenantHeader: tenant})
	}
	alices := completionID(t, in.chat(chatBody, as(asAlice, "x")))
	if bobs := completionID(t, in.chat(chatBody, as(asBob, "x"))); bobs == alices {
		t.Fatal("bob, naming alice's tenant id, got her cached completion")
	}
	if plain := completionID(t, in.chat(chatBody, asAlice)); plain == alices {
		t.Fatal("alice's unnarrowed scope got her narrowed entry")
	}
	if again := completionID(t, in.chat(chatBody, as(asAlice, "x"))); again != alices {
		t.Fatalf("alice's own narrowed repeat: %s, want %s", again, alices)
	}
	before := p.n.Load()
	for _, bad := range []string{"no spaces", strings.Repeat("a", 65), "ünicode"} {
		r := in.chat(chatBody, as(asAlice, bad))
		if e := wantOpenAIError(t, r, http.StatusBadRequest); e["code"] != "invalid_tenant" {
			t.Fatalf("%q: %v", bad, e)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, in.srv.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header = http.Header{"Authorization": {"Bearer " + aliceKey}, "Content-Type": {"application/json"}, request.TenantHeader: {"a", "b"}}
	res, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest || p.n.Load() != before {
		t.Fatalf("two tenant headers: %d, provider called %d more times", res.StatusCode, p.n.Load()-before)
	}
}

// TestChainedStorageQuotaNotRetried: the inner gateway's storage quota
// for the outer one (429 client_storage_quota_exceeded) is a quota error
// to the outer gateway too: passed on once, not retried.
func TestChainedStorageQuotaNotRetried(t *testing.T) {
	outer, in, _ := chain(t, func(c *config.Config) {
		c.Clients[0].Limits.MaxStoredBytes = 1
		c.Upstreams[0].Cache = false
	})
	if r := outer.chat(chatBody, merged(asT1, key("k1"))); r.status != http.StatusOK {
		t.Fatalf("first keyed call: %d %s", r.status, r.body)
	}
	r := outer.chat(chatBody, merged(asT1, key("k2")))
	if r.status != http.StatusTooManyRequests || r.header.Get("X-Llmgate-Outcome") != "quota" {
		t.Fatalf("over the inner quota: %d %v %s", r.status, r.header, r.body)
	}
	if m := in.metricsText(); !strings.Contains(m, `llmgate_client_limited_total{client="front",limit="storage"} 1`) {
		t.Fatalf("the outer gateway retried the inner's quota error:\n%s", grepLines(m, "client_limited"))
	}
}
