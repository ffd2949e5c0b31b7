package gateway

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// lostRenewals answers every renewal as a store does once another owner
// holds the key (a replica stopped past its lease, a failover that lost
// the claim): cache.ErrNotOwner.
type lostRenewals struct {
	Store
	renewals atomic.Int32
}

func (s *lostRenewals) Renew(ctx context.Context, k cache.Key, owner string, lease time.Duration) error {
	s.renewals.Add(1)
	return cache.ErrNotOwner
}

// A keyed call whose key was taken over makes no further upstream attempt:
// no answer of it could be committed, and a new owner, if one claimed the
// key, runs the request itself, so a retry would pay the provider for an
// answer thrown away (and make two provider calls for one key). The wait
// its upstream asked for (Retry-After) ends when the renewal finds the
// key taken; the client is told to retry with the key (not that retries
// were used up), and the key gets no dead letter.
func TestTakenOverKeyIsNotRetried(t *testing.T) {
	var st *lostRenewals
	h := newHarnessStore(t, func(c *config.Config) {
		c.Clients = []config.Client{{Name: "team-a", Key: "key-a"}}
		// 300 ms: renewed from 75 ms on, well within the upstream's
		// Retry-After of 20 s.
		c.Idempotency.Lease = config.Duration(300 * time.Millisecond)
		c.Retry.MaxAttempts = 3
	}, func(s Store) Store { st = &lostRenewals{Store: s}; return st }, fakeprovider.Options{})
	h.fake.Enqueue(fakeprovider.Step{Status: 503, Header: map[string]string{"Retry-After": "20"}})
	start := time.Now()
	r := h.chat(chatBody, map[string]string{"Authorization": "Bearer key-a", "Idempotency-Key": "order-7/summarize"})
	if n := h.fake.Calls(""); n != 1 {
		t.Fatalf("%d upstream calls for a key taken over during the first attempt's Retry-After, want 1", n)
	}
	// Told to retry with the key (it gets the answer of the call that now
	// holds it, or runs again), not that retries were used up.
	if r.status != 503 || !strings.Contains(string(r.body), `"code":"idempotency_key_taken_over"`) ||
		r.header.Get("X-Should-Retry") != "true" || r.header.Get("Retry-After") != "20" {
		t.Fatalf("client got %d %v %s, want 503 idempotency_key_taken_over, x-should-retry true, the upstream's Retry-After 20", r.status, r.header, r.body)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Fatalf("the call took %v: the Retry-After wait was not ended by the takeover", took)
	}
	if st.renewals.Load() == 0 {
		t.Fatal("no renewal ran")
	}
	if l := listDLQ(t, h, ""); l.Total != 0 {
		t.Fatalf("a key taken over got a dead letter: %+v", l.DeadLetters)
	}
}

// A content-cached call (no key sent: caching is no guarantee a client
// asked for) retries as before when its cache entry's lease is lost, and
// is not told about an Idempotency-Key it never sent (found by review).
func TestTakenOverCacheCallRetries(t *testing.T) {
	h := newHarnessStore(t, func(c *config.Config) {
		c.Upstreams[0].Cache = true
		c.Idempotency.Lease = config.Duration(300 * time.Millisecond)
		c.Retry.MaxAttempts = 3
	}, func(s Store) Store { return &lostRenewals{Store: s} }, fakeprovider.Options{})
	h.fake.Enqueue(fakeprovider.Step{Status: 503, Header: map[string]string{"Retry-After": "1"}})
	r := h.chat(chatBody, nil)
	if r.status != 200 || h.fake.Calls("") != 2 {
		t.Fatalf("a content-cached call failing once: %d %s after %d upstream calls, want 200 after its retry", r.status, r.body, h.fake.Calls(""))
	}
}
