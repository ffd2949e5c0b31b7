package redisstore

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
)

// sentinelDownAfter is how long the Sentinel waits on an unreachable
// primary before it fails it over.
const sentinelDownAfter = time.Second

// startSentinel starts a Sentinel (redis-server --sentinel) monitoring the
// primary at primaryAddr under master, with a quorum of one.
func startSentinel(t *testing.T, master, primaryAddr string) string {
	bin := requireBinary(t, "redis-server")
	port := freePort(t)
	host, pport, _ := strings.Cut(primaryAddr, ":")
	conf := filepath.Join(t.TempDir(), "sentinel.conf")
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\nsentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s %d\nsentinel failover-timeout %s 10000\n",
		port, master, host, pport, master, sentinelDownAfter.Milliseconds(), master)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server --sentinel: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	sc := redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer sc.Close()
	eventually(t, 10*time.Second, "Sentinel naming the primary and its replica", func() bool {
		got, err := sc.GetMasterAddrByName(ctx, master).Result()
		reps, err2 := sc.Replicas(ctx, master).Result()
		return err == nil && err2 == nil && len(got) == 2 && got[0]+":"+got[1] == primaryAddr && len(reps) == 1
	})
	return addr
}

// TestRedisSentinelFailover runs a primary with one replica under Redis
// Sentinel and kills the primary: the Sentinel promotes the replica, and a
// store configured with the Sentinel (not the primary's address) follows
// it — every commit acknowledged with wait_replicas 1 before the failover
// is replayed from the promoted replica, and new keys are claimed and
// committed. With no replica left, a store with wait_replicas 1 neither
// commits nor replays (ErrNotReplicated).
func TestRedisSentinelFailover(t *testing.T) {
	primary := startRedisServer(t, freePort(t))
	replica := startRedisServer(t, freePort(t), "--replicaof", "127.0.0.1", fmt.Sprint(primary.port))
	rc := redis.NewClient(&redis.Options{Addr: replica.addr()})
	defer rc.Close()
	eventually(t, 10*time.Second, "replica in sync", func() bool {
		info, err := rc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	const master = "llmgate-test"
	sentinel := startSentinel(t, master, primary.addr())

	base := Options{SentinelMaster: master, SentinelAddrs: []string{sentinel}, Prefix: testPrefix(), PollInterval: time.Hour}
	acked := base
	acked.WaitReplicas, acked.WaitTimeout = 1, time.Second
	r := openTestRedis(t, acked)
	rec := storetest.JSONRecord()
	var keys []cache.Key
	for i := range 20 {
		k := cache.Key{Endpoint: chatEP, ID: fmt.Sprint("before-failover-", i)}
		cl, err := r.Claim(ctx, k, "fp", lease)
		if err != nil || cl.Status != cache.Claimed {
			t.Fatalf("Claim %v: %+v, %v", k, cl, err)
		}
		if err := r.Commit(ctx, k, cl.Owner, rec, ttl); err != nil {
			t.Fatalf("Commit %v (wait_replicas 1): %v", k, err)
		}
		keys = append(keys, k)
	}

	primary.kill()
	killed := time.Now()
	// The promoted replica has no replica of its own, so the store that
	// waits for one can neither commit nor replay there (its clients are
	// told to retry); one that does not wait goes on.
	plain := openTestRedis(t, base)
	var cl cache.Claim
	var err, lastErr error
	eventually(t, 30*time.Second, "successful claim after the failover", func() bool {
		cl, err = plain.Claim(ctx, keys[0], "fp", lease)
		if err != nil && (lastErr == nil || err.Error() != lastErr.Error()) {
			t.Logf("%v after the kill: %v", time.Since(killed).Round(time.Millisecond), err)
		}
		lastErr = err
		return err == nil
	})
	t.Logf("primary %s killed: the store is served by the promoted replica %s after %v (down-after %v)",
		primary.addr(), replica.addr(), time.Since(killed).Round(time.Millisecond), sentinelDownAfter)
	if cl.Status != cache.Done {
		t.Fatalf("a key committed with wait_replicas 1 before the failover: %v, want done", cl.Status)
	}
	if info, err := rc.Info(ctx, "replication").Result(); err != nil || !strings.Contains(info, "role:master") {
		t.Fatalf("the replica was not promoted: %v\n%s", err, info)
	}
	for _, k := range keys {
		got, err := plain.Claim(ctx, k, "fp", lease)
		if err != nil || got.Status != cache.Done || string(got.Record.Body) != string(rec.Body) {
			t.Fatalf("after the failover %v: %v, %v; want its committed record", k, got.Status, err)
		}
	}
	if got, err := r.Claim(ctx, keys[1], "fp", lease); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("replay with wait_replicas 1 and no replica left: %v, %v; want ErrNotReplicated", got.Status, err)
	}
	probe := cache.Key{Endpoint: chatEP, ID: "after-failover"}
	nc, err := r.Claim(ctx, probe, "fp", lease)
	if err != nil || nc.Status != cache.Claimed {
		t.Fatalf("new claim after the failover: %+v, %v", nc, err)
	}
	if err := r.Commit(ctx, probe, nc.Owner, rec, ttl); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("commit with wait_replicas 1 and no replica left: %v, want ErrNotReplicated", err)
	}
	probe2 := cache.Key{Endpoint: chatEP, ID: "after-failover-2"}
	nc, err = plain.Claim(ctx, probe2, "fp", lease)
	if err != nil || nc.Status != cache.Claimed {
		t.Fatalf("new claim after the failover: %+v, %v", nc, err)
	}
	if err := plain.Commit(ctx, probe2, nc.Owner, rec, ttl); err != nil {
		t.Fatalf("commit after the failover: %v", err)
	}
	for _, k := range []cache.Key{probe, probe2} {
		if got, err := plain.Claim(ctx, k, "fp", lease); err != nil || got.Status != cache.Done {
			t.Fatalf("replay of %v after the failover: %v, %v", k, got.Status, err)
		}
	}
}
