package idempotency

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"

	"github.com/llmgate/llmgate/cache"
)

// The log's key hash is scoped by tenant: the same key sent by two clients
// is two records and two hashes, so a log reader cannot tell that two
// tenants use the same key (nor correlate one tenant's lines with
// another's). Without clients (scope ""), the hash is what it always was,
// so existing log searches and the golden files keep working.
func TestHashKeyScopedByClient(t *testing.T) {
	alice := HashKey(cache.Key{Scope: "alice", Endpoint: "/v1/chat/completions", ID: "order-1"})
	bob := HashKey(cache.Key{Scope: "bob", Endpoint: "/v1/chat/completions", ID: "order-1"})
	if alice == bob {
		t.Fatalf("alice's and bob's key order-1 log the same hash %s", alice)
	}
	if again := HashKey(cache.Key{Scope: "alice", Endpoint: "/v1/responses", ID: "order-1"}); again != alice {
		t.Errorf("one tenant's key hashes %s on another endpoint, %s before: lines of one key should correlate", again, alice)
	}
	sum := sha256.Sum256([]byte("order-1"))
	if got, want := HashKey(cache.Key{ID: "order-1"}), hex.EncodeToString(sum[:6]); got != want {
		t.Errorf("unscoped key hashes %s, want the previous form %s", got, want)
	}
	ref := sha256.Sum256([]byte("alice\x00order-1"))
	if want := hex.EncodeToString(ref[:6]); alice != want {
		t.Errorf("scoped key hashes %s, want %s (sha256 of scope NUL id): the hash links log lines across versions", alice, want)
	}
	if len(alice) != 12 {
		t.Errorf("hash %q is %d characters, want 12", alice, len(alice))
	}
}

// A pooled MAC gives what a fresh HMAC gives, on every reuse and from
// many goroutines at once (a pooled hash is Reset to just after the key).
func TestPooledMACMatchesHMAC(t *testing.T) {
	secret := []byte("forward-secret")
	want := func(k cache.Key) string {
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(k.Scope + "\x00" + k.Endpoint + "\x00" + k.ID))
		return "llmgate-" + hex.EncodeToString(m.Sum(nil))
	}
	mac := NewMAC(secret)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				k := cache.Key{Scope: fmt.Sprint("team-", g), Endpoint: "/v1/chat/completions", ID: fmt.Sprint("op-", i)}
				if got := mac.ForwardKey(k); got != want(k) {
					t.Errorf("ForwardKey(%v) = %s, want %s", k, got, want(k))
					return
				}
			}
		})
	}
	wg.Wait()
}
