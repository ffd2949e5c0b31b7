package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/llmgate/llmgate/config"
	"github.com/llmgate/llmgate/e2e/fakeprovider"
)

// With the store down a content-cached stream is served unkeyed, and a
// duplicate of it on the same replica is served too: it used to join the
// first (registered for joiners before its claim failed, and left so for
// the whole unkeyed call, which records nothing), wait for a status line
// that never came, and get 409 idempotency_key_in_flight — about an
// Idempotency-Key neither request sent. Found by review.
func TestContentCacheStoreDownDuplicateServed(t *testing.T) {
	var fs *faultyStore
	h := newHarnessStore(t, func(c *config.Config) {
		c.Idempotency.WaitTimeout = config.Duration(300 * time.Millisecond)
	}, func(s Store) Store { fs = &faultyStore{Store: s}; return fs }, fakeprovider.Options{ChunkDelay: 200 * time.Millisecond})
	fs.failClaim.Store(true)
	hdr := map[string]string{"X-Llmgate-Cache": "on"}
	first := h.chatAsync(streamBody, hdr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.fake.WaitForCalls(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// The first is streaming (its events 200 ms apart), unkeyed.
	second := h.chat(streamBody, hdr)
	if r := h.await(first); r.status != 200 {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	if second.status != 200 {
		t.Fatalf("duplicate of a content-cached stream with the store down: %d %s", second.status, second.body)
	}
	if n := h.fake.Calls(""); n != 2 {
		t.Fatalf("%d upstream calls, want 2 (nothing is cached with the store down)", n)
	}
}
