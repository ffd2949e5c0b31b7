package badgerstore

import (
	"math"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
)

func TestBadgerBudgets(t *testing.T) {
	storetest.RunBudgets(t, func(t *testing.T, now func() time.Time) storetest.BudgetStore {
		s, err := Open(Options{Dir: t.TempDir(), Now: now})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// TestBudgetsSurviveReopen: the counters and the live reservations are in
// Badger, so a restarted gateway keeps what was spent, and a reservation
// its crash left unsettled holds budget until its ttl, then frees it.
func TestBudgetsSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	clock := storetest.NewClock()
	s := openStore(t, dir, clock)
	until := clock.Now().Add(24 * time.Hour)
	hold := func(id string, amount int64) cache.BudgetHold {
		return cache.BudgetHold{ID: id, TTL: time.Minute, Lines: []cache.BudgetLine{{Counter: "day", Limit: 100, Amount: amount, Until: until}}}
	}
	if _, err := s.ReserveBudget(ctx, "acme", hold("settled", 30)); err != nil {
		t.Fatal(err)
	}
	if err := s.SettleBudget(ctx, "acme", "settled", []cache.BudgetLine{{Counter: "day", Amount: 60, Until: until}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReserveBudget(ctx, "acme", hold("leaked", 40)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, clock)
	got, err := s.ReadBudgets(ctx, "acme", []string{"day"})
	if err != nil || got[0] != (cache.BudgetCount{Spent: 60, Held: 40}) {
		t.Fatalf("after reopen: %+v, %v; want spent 60, held 40", got, err)
	}
	if n, _ := s.ReserveBudget(ctx, "acme", hold("next", 1)); n != 1 {
		t.Fatal("the leaked reservation's budget was free before its ttl")
	}
	clock.Advance(time.Minute)
	if n, _ := s.ReserveBudget(ctx, "acme", hold("next", 40)); n != 0 {
		t.Fatal("the leaked reservation still held budget after its ttl")
	}
}

// A spend that wrapped around to a negative number before AddCapped (an
// earlier release, an absurd charge) reads as saturated: the budget
// refuses, rather than staying off until its window resets.
func TestWrappedSpendReadsSaturated(t *testing.T) {
	clock := storetest.NewClock()
	s := openStore(t, t.TempDir(), clock)
	until := clock.Now().Add(time.Hour)
	if err := s.db.Update(func(txn *badger.Txn) error {
		return txn.Set(budgetKey("acme", "day"), []byte(`{"s":-9223372036854775805}`))
	}); err != nil {
		t.Fatal(err)
	}
	got, err := s.ReadBudgets(ctx, "acme", []string{"day"})
	if err != nil || got[0].Spent != math.MaxInt64 {
		t.Fatalf("ReadBudgets = %+v, %v; want the spend saturated", got, err)
	}
	n, err := s.ReserveBudget(ctx, "acme", cache.BudgetHold{ID: "a", TTL: time.Minute,
		Lines: []cache.BudgetLine{{Counter: "day", Limit: 100, Amount: 1, Until: until}}})
	if err != nil || n != 1 {
		t.Fatalf("a reservation beside a wrapped spend = %d, %v; want refused", n, err)
	}
}
