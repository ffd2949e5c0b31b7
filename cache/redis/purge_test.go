package redisstore

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
)

// usedMemory is Redis's INFO used_memory.
func usedMemory(t *testing.T, r *Store) int64 {
	t.Helper()
	info, err := r.client.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no used_memory in INFO")
	return 0
}

// TestPurgeGivesMemoryBack: purging a tenant deletes its records, dead
// letters and their index from Redis, and Redis's used_memory falls by
// about what they took (UNLINK frees in Redis's background thread, so it
// is awaited), while another tenant's records stay and its commits go on.
func TestPurgeGivesMemoryBack(t *testing.T) {
	clock := storetest.NewClock()
	r := openTestRedis(t, Options{Now: clock.Now, PollInterval: time.Hour})
	base := usedMemory(t, r)
	body := make([]byte, 64<<10)
	commit := func(scope string, i int) {
		t.Helper()
		k := cache.Key{Scope: scope, Endpoint: chatEP, ID: fmt.Sprint(i)}
		c, err := r.Claim(ctx, k, "fp", lease)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Commit(ctx, k, c.Owner, &cache.Record{Status: 200, Body: body}, ttl); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 100 {
		commit("mallory", i)
		d := &cache.DeadLetter{Body: body, LastAt: clock.Now()}
		if err := r.PutDeadLetter(ctx, cache.Key{Scope: "mallory", Endpoint: chatEP, ID: fmt.Sprint("dl", i)}, d, ttl); err != nil {
			t.Fatal(err)
		}
	}
	commit("alice", 0)
	full := usedMemory(t, r)
	grew := full - base
	if grew < 100*64<<10 {
		t.Fatalf("used_memory grew by %d bytes only", grew)
	}
	p, err := r.PurgeScope(ctx, "mallory")
	if err != nil || p.Records != 100 || p.DeadLetters != 100 {
		t.Fatalf("purge: %+v, %v", p, err)
	}
	for _, pattern := range []string{"r:{mallory*", "d:*", "dl:*", "dlb:*"} {
		if keys, _ := r.client.Keys(ctx, r.prefix+pattern).Result(); len(keys) != 0 {
			t.Fatalf("keys left after the purge: %v", keys)
		}
	}
	var after int64
	deadline := time.Now().Add(10 * time.Second)
	for after = usedMemory(t, r); full-after < grew/2 && time.Now().Before(deadline); after = usedMemory(t, r) {
		r.client.Ping(ctx) // UNLINK's background free; asked again, not slept on
	}
	if full-after < grew/2 {
		t.Fatalf("used_memory %d before the purge, %d after: less than half of the %d bytes written given back", full, after, grew)
	}
	commit("alice", 1)
	if _, err := r.Get(ctx, cache.Key{Scope: "alice", Endpoint: chatEP, ID: "0"}); err != nil {
		t.Fatalf("alice's record after mallory's purge: %v", err)
	}
	t.Logf("used_memory: %d before, %d filled (+%d), %d after the purge (-%d)", base, full, grew, after, full-after)
}

// A purge bumps its client's purge mark (every replica's storage limits
// read it to learn of the purge), that client's only, with a TTL.
func TestPurgeBumpsPurgeMark(t *testing.T) {
	r := openTestRedis(t, Options{})
	for _, scope := range []string{"acme", "globex"} {
		if n, err := r.PurgeMark(ctx, scope); err != nil || n != 0 {
			t.Fatalf("%s before any purge: %d, %v", scope, n, err)
		}
	}
	for range 2 {
		if _, err := r.PurgeScope(ctx, "acme"); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := r.PurgeMark(ctx, "acme"); err != nil || n != 2 {
		t.Fatalf("acme after two purges: %d, %v; want 2", n, err)
	}
	if n, err := r.PurgeMark(ctx, "globex"); err != nil || n != 0 {
		t.Fatalf("globex after acme's purges: %d, %v; want 0", n, err)
	}
}
