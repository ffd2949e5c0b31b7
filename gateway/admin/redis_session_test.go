package admin_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	redisstore "github.com/llmgate/llmgate/cache/redis"
	"github.com/llmgate/llmgate/gateway/admin"
	"github.com/llmgate/llmgate/gateway/admin/sessiontest"
)

// The Redis store keeps sessions for every replica: the same contract.
// Expiry is Redis's own (PX), on real time, so it is not advanced here.
func TestRedisSessionsContract(t *testing.T) {
	addr := os.Getenv("LLMGATE_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second})
	err := c.Ping(context.Background()).Err()
	c.Close()
	if err != nil {
		if os.Getenv("LLMGATE_REQUIRE_REDIS") == "1" {
			t.Fatalf("Redis expected at %s (LLMGATE_REQUIRE_REDIS=1): %v", addr, err)
		}
		t.Skipf("Redis unreachable at %s (%v); LLMGATE_REQUIRE_REDIS=1 makes this a failure", addr, err)
	}
	sessiontest.Run(t, sessiontest.Options{New: func(t *testing.T) admin.SessionStore {
		var b [6]byte
		_, _ = rand.Read(b[:])
		prefix := "llmgate-test-" + hex.EncodeToString(b[:]) + ":"
		s, err := redisstore.Open(context.Background(), redisstore.Options{URL: "redis://" + addr, Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			s.Close()
			leaveNoKeys(t, addr, prefix)
		})
		return s
	}})
}

// leaveNoKeys deletes the keys under prefix on the shared Redis at addr
// (sessions live for hours), then fails if a SCAN still finds one.
func leaveNoKeys(t *testing.T, addr, prefix string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	ctx := context.Background()
	scan := func() []string {
		keys, err := scanAll(ctx, c, prefix+"*")
		if err != nil {
			t.Errorf("SCAN %s*: %v", prefix, err)
		}
		return keys
	}
	if keys := scan(); len(keys) > 0 {
		c.Del(ctx, keys...)
	}
	if left := scan(); len(left) > 0 {
		t.Errorf("the test left %d keys under %q in Redis, e.g. %q", len(left), prefix, left[0])
	}
}

func scanAll(ctx context.Context, c *redis.Client, match string) ([]string, error) {
	var keys []string
	iter := c.Scan(ctx, 0, match, 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	return keys, iter.Err()
}
