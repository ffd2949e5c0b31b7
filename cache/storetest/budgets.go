package storetest

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
)

// BudgetStore is what RunBudgets exercises: the budget counters (see
// cache.BudgetLine).
type BudgetStore interface {
	ReserveBudget(ctx context.Context, scope string, h cache.BudgetHold) (refused int, err error)
	SettleBudget(ctx context.Context, scope, id string, lines []cache.BudgetLine) error
	ReadBudgets(ctx context.Context, scope string, counters []string) ([]cache.BudgetCount, error)
}

// RunBudgets runs the budget behaviour every store must share, each case
// on a fresh, empty store that open returns on the given clock.
func RunBudgets(t *testing.T, open func(t *testing.T, now func() time.Time) BudgetStore) {
	t.Run("reserve up to the limit, then refuse", func(t *testing.T) { budgetUpToLimit(t, open) })
	t.Run("all or nothing", func(t *testing.T) { budgetAllOrNothing(t, open) })
	t.Run("settle replaces the reservation", func(t *testing.T) { budgetSettle(t, open) })
	t.Run("a leaked reservation expires", func(t *testing.T) { budgetLeakExpires(t, open) })
	t.Run("resent reserve and settle count once", func(t *testing.T) { budgetResent(t, open) })
	t.Run("scopes are apart", func(t *testing.T) { budgetScopes(t, open) })
	t.Run("concurrent reservations never pass the limit", func(t *testing.T) { budgetConcurrent(t, open) })
	t.Run("amounts of zero", func(t *testing.T) { budgetZero(t, open) })
	t.Run("a counter named twice in one hold is refused", func(t *testing.T) { budgetCounterTwice(t, open) })
	t.Run("a charge past the integer range saturates", func(t *testing.T) { budgetSaturates(t, open) })
}

type budgetOpener = func(t *testing.T, now func() time.Time) BudgetStore

func budgetHold(id string, amount, limit int64, clock *Clock, counters ...string) cache.BudgetHold {
	h := cache.BudgetHold{ID: id, TTL: time.Minute}
	for _, c := range counters {
		h.Lines = append(h.Lines, cache.BudgetLine{Counter: c, Limit: limit, Amount: amount, Until: clock.Now().Add(time.Hour)})
	}
	return h
}

func readBudget(t *testing.T, s BudgetStore, scope string, counters ...string) []cache.BudgetCount {
	t.Helper()
	got, err := s.ReadBudgets(ctx, scope, counters)
	if err != nil {
		t.Fatalf("ReadBudgets: %v", err)
	}
	return got
}

func reserve(t *testing.T, s BudgetStore, scope string, h cache.BudgetHold) int {
	t.Helper()
	n, err := s.ReserveBudget(ctx, scope, h)
	if err != nil {
		t.Fatalf("ReserveBudget: %v", err)
	}
	return n
}

func budgetUpToLimit(t *testing.T, open budgetOpener) {
	clock := NewClock()
	s := open(t, clock.Now)
	for i, id := range []string{"a", "b", "c"} {
		if n := reserve(t, s, "acme", budgetHold(id, 30, 90, clock, "day")); n != 0 {
			t.Fatalf("reservation %d refused (%d), want it to fit", i, n)
		}
	}
	if n := reserve(t, s, "acme", budgetHold("d", 1, 90, clock, "day")); n != 1 {
		t.Fatalf("reservation over the limit = %d, want 1 (refused on line 1)", n)
	}
	if got := readBudget(t, s, "acme", "day"); got[0] != (cache.BudgetCount{Held: 90}) {
		t.Fatalf("counter = %+v, want held 90", got[0])
	}
}

func budgetAllOrNothing(t *testing.T, open budgetOpener) {
	clock := NewClock()
	s := open(t, clock.Now)
	reserve(t, s, "acme", budgetHold("a", 50, 100, clock, "minute"))
	h := budgetHold("b", 60, 1000, clock, "day", "minute")
	h.Lines[1].Limit = 100
	if n := reserve(t, s, "acme", h); n != 2 {
		t.Fatalf("refused = %d, want 2 (the minute counter)", n)
	}
	if got := readBudget(t, s, "acme", "day", "minute"); got[0].Held != 0 || got[1].Held != 50 {
		t.Fatalf("counters = %+v: a refused reservation held budget", got)
	}
}

func budgetSettle(t *testing.T, open budgetOpener) {
	clock := NewClock()
	s := open(t, clock.Now)
	reserve(t, s, "acme", budgetHold("a", 40, 100, clock, "day"))
	lines := []cache.BudgetLine{{Counter: "day", Amount: 25, Until: clock.Now().Add(time.Hour)}}
	if err := s.SettleBudget(ctx, "acme", "a", lines); err != nil {
		t.Fatal(err)
	}
	if got := readBudget(t, s, "acme", "day"); got[0] != (cache.BudgetCount{Spent: 25}) {
		t.Fatalf("after settle = %+v, want spent 25, held 0", got[0])
	}
	// 75 left: 75 fits, 76 does not.
	if n := reserve(t, s, "acme", budgetHold("b", 76, 100, clock, "day")); n != 1 {
		t.Fatalf("76 over 25 spent of 100 = %d, want refused", n)
	}
	if n := reserve(t, s, "acme", budgetHold("c", 75, 100, clock, "day")); n != 0 {
		t.Fatalf("75 over 25 spent of 100 = %d, want reserved", n)
	}
}

func budgetLeakExpires(t *testing.T, open budgetOpener) {
	clock := NewClock()
	s := open(t, clock.Now)
	reserve(t, s, "acme", budgetHold("leaked", 100, 100, clock, "day"))
	if n := reserve(t, s, "acme", budgetHold("b", 10, 100, clock, "day")); n != 1 {
		t.Fatal("a second reservation fit beside a full one")
	}
	clock.Advance(time.Minute) // the leaked one's ttl
	if n := reserve(t, s, "acme", budgetHold("c", 100, 100, clock, "day")); n != 0 {
		t.Fatalf("after the leaked reservation's ttl: refused (%d)", n)
	}
	// Its run settles late after all: it is charged, once.
	lines := []cache.BudgetLine{{Counter: "day", Amount: 7, Until: clock.Now().Add(time.Hour)}}
	for range 2 {
		if err := s.SettleBudget(ctx, "acme", "leaked", lines); err != nil {
			t.Fatal(err)
		}
	}
	if got := readBudget(t, s, "acme", "day"); got[0].Spent != 7 || got[0].Held != 100 {
		t.Fatalf("counter = %+v, want spent 7 (the late settlement, once), held 100", got[0])
	}
}

func budgetResent(t *testing.T, open budgetOpener) {
	clock := NewClock()
	s := open(t, clock.Now)
	for range 2 {
		reserve(t, s, "acme", budgetHold("a", 40, 100, clock, "day"))
	}
	lines := []cache.BudgetLine{{Counter: "day", Amount: 30, Until: clock.Now().Add(time.Hour)}}
	for range 2 {
		if err := s.SettleBudget(ctx, "acme", "a", lines); err != nil {
			t.Fatal(err)
		}
	}
	if got := readBudget(t, s, "acme", "day"); got[0] != (cache.BudgetCount{Spent: 30}) {
		t.Fatalf("counter = %+v, want spent 30 held 0", got[0])
	}
}

func budgetScopes(t *testing.T, open budgetOpener) {
	clock := NewClock()
	s := open(t, clock.Now)
	reserve(t, s, "acme", budgetHold("a", 100, 100, clock, "day"))
	if n := reserve(t, s, "globex", budgetHold("a", 100, 100, clock, "day")); n != 0 {
		t.Fatal("one client's reservation took another's budget")
	}
}

func budgetConcurrent(t *testing.T, open budgetOpener) {
	clock := NewClock()
	s := open(t, clock.Now)
	var wg sync.WaitGroup
	var mu sync.Mutex
	taken := 0
	for i := range 50 {
		wg.Go(func() {
			n, err := s.ReserveBudget(ctx, "acme", budgetHold(string(rune('A'+i)), 7, 100, clock, "day", "minute"))
			if err == nil && n == 0 {
				mu.Lock()
				taken++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if taken != 14 { // 14 × 7 = 98 ≤ 100 < 105
		t.Fatalf("%d of 50 concurrent reservations of 7 taken under 100, want 14", taken)
	}
}

// budgetZero: a line of amount 0 (a model with no price under a cost
// budget, an output budget on embeddings) is held, settled and, once
// expired, purged like any other, beside lines that are not 0.
func budgetZero(t *testing.T, open budgetOpener) {
	clock := NewClock()
	s := open(t, clock.Now)
	h := budgetHold("z", 0, 100, clock, "out", "tot")
	h.Lines[1].Amount = 40
	if n := reserve(t, s, "acme", h); n != 0 {
		t.Fatalf("refused (%d)", n)
	}
	lines := []cache.BudgetLine{{Counter: "out", Amount: 0, Until: clock.Now().Add(time.Hour)}, {Counter: "tot", Amount: 20, Until: clock.Now().Add(time.Hour)}}
	if err := s.SettleBudget(ctx, "acme", "z", lines); err != nil {
		t.Fatalf("settling a line of 0: %v", err)
	}
	if got := readBudget(t, s, "acme", "out", "tot"); got[0] != (cache.BudgetCount{}) || got[1] != (cache.BudgetCount{Spent: 20}) {
		t.Fatalf("after settle = %+v, want out 0/0 and tot spent 20 held 0", got)
	}
	// A reservation of 0 that is never settled expires; the purge that a
	// reservation near the limit needs passes over it.
	reserve(t, s, "acme", budgetHold("leaked0", 0, 100, clock, "out"))
	reserve(t, s, "acme", budgetHold("leaked90", 90, 100, clock, "out"))
	clock.Advance(time.Minute)
	if n := reserve(t, s, "acme", budgetHold("after", 50, 100, clock, "out")); n != 0 {
		t.Fatalf("after both reservations' ttl: refused (%d)", n)
	}
	if got := readBudget(t, s, "acme", "out"); got[0] != (cache.BudgetCount{Held: 50}) {
		t.Fatalf("counter = %+v, want held 50 (the expired ones purged)", got[0])
	}
}

// budgetCounterTwice: one hold with two lines on one counter would be
// held twice and released once; the store refuses it before writing.
func budgetCounterTwice(t *testing.T, open budgetOpener) {
	clock := NewClock()
	s := open(t, clock.Now)
	if _, err := s.ReserveBudget(ctx, "acme", budgetHold("a", 10, 100, clock, "minute", "minute")); err == nil {
		t.Fatal("a hold naming one counter twice was taken")
	}
	if got := readBudget(t, s, "acme", "minute"); got[0] != (cache.BudgetCount{}) {
		t.Fatalf("counter = %+v after a refused hold, want untouched", got[0])
	}
}

// budgetSaturates: an upstream reporting absurd usage is charged up to
// the largest integer, every line of the hold settled, and the counter
// refuses from then on; it neither wraps around to a negative spend nor
// fails the settlement part way.
func budgetSaturates(t *testing.T, open budgetOpener) {
	clock := NewClock()
	s := open(t, clock.Now)
	for _, run := range []struct {
		id  string
		day int64
	}{{"a", 5}, {"b", math.MaxInt64 - 1}} {
		id := run.id
		if n := reserve(t, s, "acme", budgetHold(id, 10, 100, clock, "day", "minute")); n != 0 {
			t.Fatalf("reserve %s refused (%d)", id, n)
		}
		lines := []cache.BudgetLine{{Counter: "day", Amount: run.day, Until: clock.Now().Add(time.Hour)},
			{Counter: "minute", Amount: 20, Until: clock.Now().Add(time.Hour)}}
		if err := s.SettleBudget(ctx, "acme", id, lines); err != nil {
			t.Fatalf("settle %s: %v", id, err)
		}
	}
	got := readBudget(t, s, "acme", "day", "minute")
	if got[0] != (cache.BudgetCount{Spent: math.MaxInt64}) || got[1] != (cache.BudgetCount{Spent: 40}) {
		t.Fatalf("counters = %+v, want day saturated at the largest integer and minute 40, nothing held", got)
	}
	if n := reserve(t, s, "acme", budgetHold("c", 1, 100, clock, "day")); n != 1 {
		t.Fatalf("a reservation on a saturated counter = %d, want refused", n)
	}
}
