package redisstore

import (
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
)

func TestRedisOwners(t *testing.T) {
	redisAddr(t)
	storetest.RunOwners(t, func(t *testing.T, now func() time.Time) storetest.OwnerStore {
		return openTestRedis(t, Options{Now: now})
	})
}

// TestOwnersSharedByReplicas: an entry one replica writes is read by
// another on the same Redis, and Redis itself expires it (its PX is the ttl).
func TestOwnersSharedByReplicas(t *testing.T) {
	base := Options{URL: "redis://" + redisAddr(t), Prefix: testPrefix()}
	a := openTestRedis(t, base)
	b := openTestRedis(t, base)
	if err := a.PutOwner(ctx, "acme", "conv_1", cache.Owner{Upstream: "openai", Kind: "conversation"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	got, err := b.GetOwner(ctx, "acme", "conv_1")
	if err != nil || got.Upstream != "openai" || got.Kind != "conversation" || got.Client != "acme" {
		t.Fatalf("on the other replica: %+v, %v", got, err)
	}
	pttl, err := b.client.PTTL(ctx, b.ownerKey("acme", "conv_1")).Result()
	if err != nil || pttl <= 59*time.Minute || pttl > time.Hour {
		t.Fatalf("PTTL = %v, %v; want about 1h", pttl, err)
	}
}
