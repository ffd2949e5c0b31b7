package gateway

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache/storetest"
	"github.com/llmgate/llmgate/config"
)

// TestOwnershipEntriesCountAgainstQuota: under a shared key every object
// a client creates leaves an ownership entry in the store, kept for its
// ttl (30 days for a stored response). Those entries count against the
// client's stored-bytes quota as its keyed records do: once over it, its
// next create is a 429 client_storage_quota_exceeded with no upstream
// call, while another client's creates go on; a restart counts them again
// from the store. Before, unkeyed uploads wrote entries no quota saw, and
// one tenant could fill store.max_bytes until every tenant's keyed calls
// got 503 idempotency_store_full (found by the hostile-tenant run).
func TestOwnershipEntriesCountAgainstQuota(t *testing.T) {
	h, up := ownersHarness(t, func(c *config.Config) {
		c.ClientLimits = config.ClientLimits{MaxStoredBytes: 600}
	})
	refused := func(who map[string]string) {
		t.Helper()
		up.requests()
		r := uploadAs(h, who)
		e := wantOpenAIError(t, r, http.StatusTooManyRequests)
		if e["code"] != "client_storage_quota_exceeded" || r.header.Get("Retry-After") == "" {
			t.Fatalf("%v, Retry-After %q", e, r.header.Get("Retry-After"))
		}
		// The message says what an unkeyed create is refused for, not
		// that requests without a key still work.
		if msg, _ := e["message"].(string); !strings.Contains(msg, "create objects at the provider") {
			t.Fatalf("message %q does not say creates are refused", msg)
		}
		if seen := up.requests(); len(seen) != 0 {
			t.Fatalf("a refused create reached the upstream: %+v", seen)
		}
	}
	keyed := func() result {
		t.Helper()
		return h.do(http.MethodPost, "/v1/responses", responseBody, with(asAlice, "Idempotency-Key", "made-before"))
	}
	first := keyed()
	if first.status != http.StatusOK {
		t.Fatalf("keyed create: %d %s", first.status, first.body)
	}
	n := 0
	for ; n < 100; n++ {
		r := uploadAs(h, asAlice)
		if r.status == http.StatusTooManyRequests {
			break
		}
		if r.status != http.StatusOK {
			t.Fatalf("upload %d: %d %s", n, r.status, r.body)
		}
	}
	if n < 3 || n >= 100 {
		t.Fatalf("alice's uploads were refused after %d", n)
	}
	refused(asAlice)
	// Over the quota, her keyed create's answer is still replayed, and
	// what creates nothing kept is not refused.
	if r := keyed(); r.status != http.StatusOK || r.header.Get("Idempotent-Replayed") != "true" || string(r.body) != string(first.body) {
		t.Fatalf("replay over the quota: %d %v %s", r.status, r.header, r.body)
	}
	if r := h.do(http.MethodPost, "/v1/responses", `{"model":"gpt-4o","input":"hi","store":false}`, asAlice); r.status != http.StatusOK {
		t.Fatalf("a response with store false over the quota: %d %s", r.status, r.body)
	}
	if r := uploadAs(h, asBob); r.status != http.StatusOK {
		t.Fatalf("bob's upload while alice is over her quota: %d %s", r.status, r.body)
	}
	// Counted again from the store at start (exact sizes, where this
	// process estimated): at most a create or two more.
	restartWith(t, h, storetest.NewClock(), nil)
	for range 2 {
		if r := uploadAs(h, asAlice); r.status != http.StatusOK {
			break
		}
	}
	refused(asAlice)
}

// TestCreatesRefusedWhileStoreFull: with the store full, a create under a
// shared key is a 503 ownership_store_full with no upstream call (its
// ownership entry could not be kept); reading one's objects still works,
// and creates resume once there is room. Before, creates went on writing
// entries past store.max_bytes.
func TestCreatesRefusedWhileStoreFull(t *testing.T) {
	bs, clock, free := fullableStore(t)
	h, up := ownersHarnessStore(t, nil, func(Store) Store { return bs })
	resp, _ := create(t, h, up, responseBody, asAlice)

	free.Store(10 << 20)
	clock.Advance(time.Second)
	up.requests()
	r := h.do(http.MethodPost, "/v1/responses", responseBody, asBob)
	e := wantOpenAIError(t, r, http.StatusServiceUnavailable)
	if e["code"] != "ownership_store_full" || r.header.Get("Retry-After") != "30" {
		t.Fatalf("create while full: %v, Retry-After %q", e, r.header.Get("Retry-After"))
	}
	if seen := up.requests(); len(seen) != 0 {
		t.Fatalf("a refused create reached the upstream: %+v", seen)
	}
	if r := h.do(http.MethodGet, "/v1/responses/"+resp, "", asAlice); r.status != http.StatusOK {
		t.Fatalf("reading her response while full: %d %s", r.status, r.body)
	}

	free.Store(1 << 30)
	clock.Advance(time.Second)
	if r := h.do(http.MethodPost, "/v1/responses", responseBody, asBob); r.status != http.StatusOK {
		t.Fatalf("create with room again: %d %s", r.status, r.body)
	}
}
