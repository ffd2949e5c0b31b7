package redisstore

import (
	"errors"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
)

// TestRedisWaitReplicas runs a primary and one replica of the test's own.
// With WaitReplicas 1, a commit returns once the replica has the record;
// with the replica paused (SIGSTOP), or with more replicas asked for than
// exist, the commit fails with ErrNotReplicated after WaitTimeout — and
// the record is committed on the primary all the same: a Release finds it
// no longer in flight, and a Claim replays it.
func TestRedisWaitReplicas(t *testing.T) {
	primary := startRedisServer(t, freePort(t))
	replica := startRedisServer(t, freePort(t), "--replicaof", "127.0.0.1", strconv.Itoa(primary.port))
	pc := redis.NewClient(&redis.Options{Addr: primary.addr()})
	defer pc.Close()
	eventually(t, 10*time.Second, "the replica in sync", func() bool {
		info, err := pc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online")
	})

	url := "redis://" + primary.addr()
	t.Run("suite", func(t *testing.T) {
		// The whole contract holds with every commit waiting for the replica.
		storetest.Run(t, func(t *testing.T, now func() time.Time) storetest.Store {
			return observeRedis(openTestRedis(t, Options{URL: url, Now: now, PollInterval: time.Hour, WaitReplicas: 1, WaitTimeout: 2 * time.Second}))
		})
	})
	r := openTestRedis(t, Options{URL: url, WaitReplicas: 1, WaitTimeout: 300 * time.Millisecond})
	commit := func(r *Store, id string) (cache.Key, string, error) {
		k := cache.Key{Endpoint: chatEP, ID: id}
		c, err := r.Claim(ctx, k, "fp", lease)
		if err != nil || c.Status != cache.Claimed {
			t.Fatalf("Claim %s: %+v, %v", id, c, err)
		}
		return k, c.Owner, r.Commit(ctx, k, c.Owner, storetest.StreamRecord(), ttl)
	}
	if _, _, err := commit(r, "replicated"); err != nil {
		t.Fatalf("Commit with the replica up: %v", err)
	}

	if err := replica.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	k, owner, err := commit(r, "not-replicated")
	// While the replica lacks the record, no duplicate or retry may be
	// shown it as an answer: a failover now would lose it, and the retry
	// after would get another. Its claim fails as the commit did.
	other := openTestRedis(t, Options{URL: url, Prefix: r.prefix, WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond})
	c, claimErr := other.Claim(ctx, k, "fp", lease)
	// Nor may a request that claims nothing (over its quota, no-store)
	// be shown it: GetReplay holds it back as Claim does (before, such a
	// lookup read it with a plain Get and replayed it).
	_, replayErr := other.GetReplay(ctx, k, "fp")
	if err := replica.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(replayErr, ErrNotReplicated) {
		t.Errorf("GetReplay of the unreplicated record with the replica paused: %v; want ErrNotReplicated", replayErr)
	}
	if !errors.Is(claimErr, ErrNotReplicated) {
		t.Errorf("Claim of the unreplicated record with the replica paused: %v, %v; want ErrNotReplicated, no replay", c.Status, claimErr)
	}
	if !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("Commit with the replica paused: %v, want ErrNotReplicated", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the failed WAIT took %v, WaitTimeout is 300ms", d)
	}
	// What the caller's release after a failed commit meets: the record is
	// committed, not in flight; the key replays.
	if err := r.Release(ctx, k, owner); !errors.Is(err, cache.ErrNotOwner) {
		t.Fatalf("Release after the unreplicated commit: %v, want ErrNotOwner", err)
	}
	if c, err := r.Claim(ctx, k, "fp", lease); err != nil || c.Status != cache.Done {
		t.Fatalf("Claim after the unreplicated commit: %+v, %v, want Done", c, err)
	}
	if rec, err := r.GetReplay(ctx, k, "fp"); err != nil || rec.State != cache.Committed {
		t.Fatalf("GetReplay once replicated: %+v, %v", rec, err)
	}

	two := openTestRedis(t, Options{URL: url, WaitReplicas: 2, WaitTimeout: 100 * time.Millisecond})
	if _, _, err := commit(two, "two-replicas"); !errors.Is(err, ErrNotReplicated) || !strings.Contains(err.Error(), "1 of 2") {
		t.Fatalf("Commit asking for 2 replicas of 1: %v", err)
	}
}
