package sim_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	badgerstore "github.com/llmgate/llmgate/cache/badger"
	redisstore "github.com/llmgate/llmgate/cache/redis"
	"github.com/llmgate/llmgate/gateway"
	"github.com/llmgate/llmgate/gateway/sim"
)

// simOps and simSeed read LLMGATE_SIM_OPS and LLMGATE_SIM_SEED; without a
// seed each run draws one (and prints it).
func simOps(t *testing.T, def int) int {
	if v := os.Getenv("LLMGATE_SIM_OPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("LLMGATE_SIM_OPS=%q: want a positive number", v)
		}
		return n
	}
	return def
}

// simWorkers reads LLMGATE_SIM_WORKERS, the clients sending at once (0: the
// simulation's default).
func simWorkers(t *testing.T) int {
	v := os.Getenv("LLMGATE_SIM_WORKERS")
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("LLMGATE_SIM_WORKERS=%q: want a positive number", v)
	}
	return n
}

func simSeed(t *testing.T) int64 {
	if v := os.Getenv("LLMGATE_SIM_SEED"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("LLMGATE_SIM_SEED=%q: want an integer", v)
		}
		return n
	}
	return time.Now().UnixNano() % 1_000_000_007
}

// openBadger opens a real Badger store in a temp dir on the simulation's clock.
func openBadger(t *testing.T) func(*sim.Clock) (gateway.Store, error) {
	return func(clk *sim.Clock) (gateway.Store, error) {
		s, err := badgerstore.Open(badgerstore.Options{Dir: t.TempDir(), Now: clk.Now, After: clk.After})
		if err == nil {
			t.Cleanup(func() { s.Close() })
		}
		return s, err
	}
}

// openRedis opens the real Redis under a prefix of its own, deleted after.
func openRedis(t *testing.T) func(*sim.Clock) (gateway.Store, error) {
	addr := os.Getenv("LLMGATE_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second})
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		if os.Getenv("LLMGATE_REQUIRE_REDIS") == "1" {
			t.Fatalf("Redis expected at %s (LLMGATE_REQUIRE_REDIS=1): %v", addr, err)
		}
		t.Skipf("Redis unreachable at %s (%v); LLMGATE_REQUIRE_REDIS=1 makes this a failure", addr, err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "llmgate-sim-" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() { deletePrefix(t, c, prefix) })
	return func(clk *sim.Clock) (gateway.Store, error) {
		s, err := redisstore.Open(context.Background(), redisstore.Options{URL: "redis://" + addr, Prefix: prefix,
			Now: clk.Now, After: clk.After, PollInterval: 100 * time.Millisecond})
		if err == nil {
			t.Cleanup(func() { s.Close() })
		}
		return s, err
	}
}

func deletePrefix(t *testing.T, c *redis.Client, prefix string) {
	ctx := context.Background()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
		if len(keys) == 1000 {
			c.Unlink(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		c.Unlink(ctx, keys...)
	}
	if err := iter.Err(); err != nil {
		t.Errorf("deleting the simulation's keys: %v", err)
	}
}

// TestSimulation runs the seeded fault simulation of the keyed path on each
// store and holds its history to the guarantee: no property may break.
func TestSimulation(t *testing.T) {
	ops, seed := simOps(t, 2000), simSeed(t)
	for _, tc := range []struct {
		name string
		open func(*testing.T) func(*sim.Clock) (gateway.Store, error)
	}{{"badger", openBadger}, {"redis", openRedis}} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := sim.Simulate(sim.Options{Seed: seed, Ops: ops, Workers: simWorkers(t), OpenStore: tc.open(t), Dir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			t.Log(res.Summary())
			if len(res.Violations) > 0 {
				t.Fatal(res.Report())
			}
		})
	}
}
