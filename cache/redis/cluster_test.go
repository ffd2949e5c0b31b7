package redisstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
)

// clusterNodeTimeout is the cluster's node timeout: a master unreachable
// for this long is failed over to its replica.
const clusterNodeTimeout = 1000 * time.Millisecond

// testCluster is a local Redis Cluster of three masters, each with one
// replica, on free loopback ports.
type testCluster struct {
	nodes []*redisServer
	url   string // every master, for Options.URL with Cluster
}

// startCluster starts six redis-server processes with cluster mode on and
// joins them (redis-cli --cluster create --cluster-replicas 1): three
// masters, one replica each.
func startCluster(t *testing.T) *testCluster {
	cli := requireBinary(t, "redis-cli")
	c := &testCluster{}
	var addrs []string
	for len(c.nodes) < 6 {
		// The cluster bus listens on port+10000.
		port := freePort(t)
		if port+10000 > 65535 || !portFree(port+10000) {
			continue
		}
		dir := t.TempDir()
		c.nodes = append(c.nodes, startRedisServer(t, port, "--cluster-enabled", "yes",
			"--cluster-config-file", dir+"/nodes.conf", "--cluster-node-timeout", fmt.Sprint(clusterNodeTimeout.Milliseconds())))
		addrs = append(addrs, c.nodes[len(c.nodes)-1].addr())
	}
	start := time.Now()
	out, err := exec.Command(cli, append(append([]string{"--cluster", "create"}, addrs...),
		"--cluster-replicas", "1", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, a := range addrs {
		rc := redis.NewClient(&redis.Options{Addr: a})
		eventually(t, 20*time.Second, "cluster_state:ok and three replicas on "+a, func() bool {
			info, err := rc.ClusterInfo(ctx).Result()
			nodes, err2 := rc.ClusterNodes(ctx).Result()
			return err == nil && err2 == nil && strings.Contains(info, "cluster_state:ok") && strings.Count(nodes, "slave") == 3
		})
		rc.Close()
	}
	for _, a := range addrs {
		rc := redis.NewClient(&redis.Options{Addr: a})
		eventually(t, 20*time.Second, "replication in sync on "+a, func() bool {
			info, err := rc.Info(ctx, "replication").Result()
			return err == nil && (strings.Contains(info, "role:master") || strings.Contains(info, "master_link_status:up"))
		})
		rc.Close()
	}
	t.Logf("cluster of %v (3 masters, 3 replicas) ready in %v", addrs, time.Since(start))
	c.url = "redis://" + addrs[0] + "?addr=" + addrs[1] + "&addr=" + addrs[2]
	return c
}

// node is the process serving addr.
func (c *testCluster) node(addr string) *redisServer {
	for _, n := range c.nodes {
		if n.addr() == addr {
			return n
		}
	}
	return nil
}

// TestRedisCluster starts a Redis Cluster of three masters with a replica
// each and runs the store suite, the cross-replica tests and a master
// failover on it. Opt in with LLMGATE_TEST_REDIS_CLUSTER=1 (CI does).
func TestRedisCluster(t *testing.T) {
	if os.Getenv("LLMGATE_TEST_REDIS_CLUSTER") != "1" {
		t.Skip("set LLMGATE_TEST_REDIS_CLUSTER=1 to start a local six-node Redis Cluster (needs redis-server and redis-cli)")
	}
	c := startCluster(t)
	url := c.url
	t.Run("suite", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T, now func() time.Time) storetest.Store {
			return observeRedis(openTestRedis(t, Options{URL: url, Cluster: true, Now: now, PollInterval: time.Hour}))
		})
	})
	t.Run("cross replica", func(t *testing.T) {
		testCrossReplica(t, Options{URL: url, Cluster: true})
	})
	t.Run("keys spread over the masters", func(t *testing.T) {
		r := openTestRedis(t, Options{URL: url, Cluster: true})
		for i := range 30 {
			if _, err := r.Claim(ctx, cache.Key{Endpoint: chatEP, ID: fmt.Sprint(i)}, "fp", lease); err != nil {
				t.Fatal(err)
			}
		}
		var mu sync.Mutex
		per := map[string]int{}
		r.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			n, err := c.DBSize(ctx).Result()
			mu.Lock()
			per[c.Options().Addr] = int(n)
			mu.Unlock()
			return err
		})
		used := 0
		for _, n := range per {
			if n > 0 {
				used++
			}
		}
		if used < 2 {
			t.Fatalf("keys per master = %v: hash tags put them all in one place", per)
		}
		st := r.Stats()
		if st.Records != 30 || st.InFlight != 30 {
			t.Fatalf("Stats = %+v, want 30 in flight", st)
		}
	})
	// Last: it kills a master.
	t.Run("master failover", func(t *testing.T) { testClusterFailover(t, c) })
}

// testClusterFailover kills the master holding committed keys; its replica
// takes over, and the same store goes on: every commit acknowledged with
// wait_replicas 1 is still replayed from the promoted replica, and new
// keys in the failed-over slots are claimed and committed.
func testClusterFailover(t *testing.T, c *testCluster) {
	r := openTestRedis(t, Options{URL: c.url, Cluster: true, WaitReplicas: 1, WaitTimeout: time.Second, PollInterval: time.Hour})
	rec := storetest.JSONRecord()
	var keys []cache.Key
	for i := range 30 {
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
	master, err := r.cluster.MasterForKey(ctx, r.recordKey(recordIdent(keys[0])))
	if err != nil {
		t.Fatal(err)
	}
	victim := c.node(master.Options().Addr)
	if victim == nil {
		t.Fatalf("no process serves master %s", master.Options().Addr)
	}
	var onVictim []cache.Key
	for _, k := range keys {
		if m, err := r.cluster.MasterForKey(ctx, r.recordKey(recordIdent(k))); err == nil && m.Options().Addr == victim.addr() {
			onVictim = append(onVictim, k)
		}
	}
	victim.kill()
	killed := time.Now()
	// The promoted replica has no replica of its own: the store that
	// waits for one can neither commit nor replay in its slots (its
	// clients are told to retry); one that does not wait goes on there.
	plain := openTestRedis(t, Options{URL: c.url, Cluster: true, Prefix: r.prefix, PollInterval: time.Hour})
	// The replica is promoted after the node timeout and an election; the
	// store's calls to those slots fail meanwhile, then succeed.
	probe := cache.Key{Endpoint: chatEP, ID: "after-failover"}
	var cl cache.Claim
	var lastErr error
	eventually(t, 30*time.Second, "successful claim in the failed-over slots", func() bool {
		cl, err = plain.Claim(ctx, keys[0], "fp", lease)
		if err != nil && (lastErr == nil || err.Error() != lastErr.Error()) {
			t.Logf("%v after the kill: %v", time.Since(killed).Round(time.Millisecond), err)
		}
		lastErr = err
		return err == nil
	})
	took := time.Since(killed)
	t.Logf("master %s killed: the store is served by its replica after %v (node timeout %v); %d of %d committed keys were on it",
		victim.addr(), took.Round(time.Millisecond), clusterNodeTimeout, len(onVictim), len(keys))
	// A failover takes the node timeout and an election (a few seconds
	// here); the store follows it within clusterReload, not go-redis's
	// default minute.
	if took > 15*time.Second {
		t.Errorf("the store followed the failover after %v, want within 15s", took)
	}
	if cl.Status != cache.Done {
		t.Fatalf("a key committed with wait_replicas 1 before the failover: %v, want done", cl.Status)
	}
	// The store that waits follows the failover too (its own slot map).
	eventually(t, 10*time.Second, "the waiting store reaching the promoted replica", func() bool {
		_, err := r.Claim(ctx, onVictim[0], "fp", lease)
		return errors.Is(err, ErrNotReplicated)
	})
	onVictimSet := map[cache.Key]bool{}
	for _, k := range onVictim {
		onVictimSet[k] = true
	}
	for _, k := range keys {
		got, err := plain.Claim(ctx, k, "fp", lease)
		if err != nil || got.Status != cache.Done || string(got.Record.Body) != string(rec.Body) {
			t.Fatalf("after the failover %v: %+v, %v; want its committed record", k, got.Status, err)
		}
		// The store that waits for a replica replays only where one is.
		got, err = r.Claim(ctx, k, "fp", lease)
		if onVictimSet[k] != errors.Is(err, ErrNotReplicated) || (!onVictimSet[k] && got.Status != cache.Done) {
			t.Fatalf("replay with wait_replicas 1 of %v (on the failed-over master: %v): %v, %v", k, onVictimSet[k], got.Status, err)
		}
	}
	nc, err := plain.Claim(ctx, probe, "fp", lease)
	if err != nil || nc.Status != cache.Claimed {
		t.Fatalf("new claim after the failover: %+v, %v", nc, err)
	}
	if err := plain.Commit(ctx, probe, nc.Owner, rec, ttl); err != nil {
		t.Fatalf("commit after the failover: %v", err)
	}
	if got, err := plain.Claim(ctx, probe, "fp", lease); err != nil || got.Status != cache.Done {
		t.Fatalf("replay after the failover: %+v, %v", got.Status, err)
	}
}
