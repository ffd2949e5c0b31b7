package redisstore

import (
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
)

func TestRedisBudgets(t *testing.T) {
	redisAddr(t)
	storetest.RunBudgets(t, func(t *testing.T, now func() time.Time) storetest.BudgetStore {
		return openTestRedis(t, Options{Now: now})
	})
}

// TestBudgetsSharedByReplicas: two replicas on one Redis reserve on the
// same counter, and a client's counters share one hash tag (one Cluster
// slot, so one script can reserve on all of them).
func TestBudgetsSharedByReplicas(t *testing.T) {
	base := Options{URL: "redis://" + redisAddr(t), Prefix: testPrefix()}
	a := openTestRedis(t, base)
	b := openTestRedis(t, base)
	until := time.Now().Add(time.Hour)
	hold := func(id string) cache.BudgetHold {
		return cache.BudgetHold{ID: id, TTL: time.Minute, Lines: []cache.BudgetLine{
			{Counter: "day.tokens.total@2026-12-02", Limit: 100, Amount: 60, Until: until},
			{Counter: "minute.tokens.total@2026-12-02T03:00", Limit: 1000, Amount: 60, Until: until}}}
	}
	if n, err := a.ReserveBudget(ctx, "acme", hold("r1")); n != 0 || err != nil {
		t.Fatalf("replica a: %d, %v", n, err)
	}
	if n, err := b.ReserveBudget(ctx, "acme", hold("r2")); n != 1 || err != nil {
		t.Fatalf("replica b over the shared limit: %d, %v; want refused on line 1", n, err)
	}
	k1, k2 := a.budgetKey("acme", "day"), a.budgetKey("acme", "minute")
	if tag(k1) != tag(k2) || tag(k1) != "acme" {
		t.Fatalf("hash tags %q, %q; want both acme", tag(k1), tag(k2))
	}
	pttl, err := b.client.PTTL(ctx, a.budgetKey("acme", "day.tokens.total@2026-12-02")).Result()
	if err != nil || pttl <= 59*time.Minute || pttl > time.Hour {
		t.Fatalf("PTTL = %v, %v; want about 1h", pttl, err)
	}
}

// tag is a key's Cluster hash tag.
func tag(key string) string {
	i := strings.IndexByte(key, '{')
	j := strings.IndexByte(key[i:], '}')
	return key[i+1 : i+j]
}
