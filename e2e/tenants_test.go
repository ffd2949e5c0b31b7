package e2e

import (
	"net/http"
	"testing"

	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// Issue 13, item 1: two real gateway processes chained — an edge with two
// tenants in front of an inner gateway whose one client is the edge. The
// key the edge forwards is derived from the tenant, so bob reusing alice's
// key and body gets no replay of alice's answer, and a different body under
// her key tells him nothing (no 422).
func TestChainedGatewaysKeepTenantsApart(t *testing.T) {
	fake, upURL := newFake(t, fakeprovider.Options{})
	bin := gatewayBin(t, "")
	inner := start(t, bin, []string{"-config", writeConfig(t, t.TempDir(), upURL,
		"clients:\n  - name: edge\n    key: sk-e2e-upstream-key\n")}, nil)
	edge := start(t, bin, []string{"-config", writeConfig(t, t.TempDir(), inner.URL,
		"clients:\n  - name: alice\n    key: key-alice\n  - name: bob\n    key: key-bob\n")}, nil)

	const bodyA = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"alice's question"}]}`
	const bodyB = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"bob's probe"}]}`
	as := func(who, key string) map[string]string {
		return map[string]string{"Authorization": "Bearer key-" + who, "Idempotency-Key": key}
	}
	url := edge.URL + "/v1/chat/completions"
	if st, _, b := post(t, url, bodyA, as("alice", "order-4711")); st != 200 {
		t.Fatalf("alice: %d %s", st, b)
	}
	st, h, b := post(t, url, bodyA, as("bob", "order-4711"))
	if st != 200 || h.Get("Idempotent-Replayed") == "true" {
		t.Fatalf("bob with alice's key and body: %d replayed=%q %s", st, h.Get("Idempotent-Replayed"), b)
	}
	if st, _, b := post(t, url, bodyA, as("alice", "order-4712")); st != 200 {
		t.Fatalf("alice: %d %s", st, b)
	}
	if st, _, b := post(t, url, bodyB, as("bob", "order-4712")); st != http.StatusOK {
		t.Fatalf("bob's other body under alice's key: %d %s (a 422 would tell him alice used it)", st, b)
	}
	if n := fake.Calls(""); n != 4 {
		t.Fatalf("upstream calls = %d, want 4 (one per tenant and key)", n)
	}
	seen := map[string]bool{}
	for _, r := range fake.Requests() {
		k := r.Header.Get("Idempotency-Key")
		if k == "order-4711" || k == "order-4712" || seen[k] {
			t.Fatalf("forwarded key %q: raw, or shared by two tenants", k)
		}
		seen[k] = true
	}
}
