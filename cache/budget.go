package cache

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// A budget counter is one client's spend under one budget in one window
// (package budget names them): what its settled runs were charged
// (Spent) and what the runs in flight hold (Held, the sum of their
// reservations). A reservation is all or nothing across the counters it
// names: it is taken only if, for every one, Spent + Held + its amount
// stays within the limit. A reservation whose run never settles (its
// gateway crashed) expires after its ttl, and its amount is free again.
//
// Amounts are integers (tokens, or money in micro-units): no float is
// involved on either store; on Redis, Spent and Held are kept with
// HINCRBY (exact 64-bit) and compared in Lua, exactly up to 2⁵³.

// BudgetLine is one counter a reservation or a settlement touches.
type BudgetLine struct {
	// Counter names the counter within its scope (printable ASCII).
	Counter string
	// Limit caps Spent + Held (a reservation only).
	Limit int64
	// Amount is what a reservation holds, or what a settlement charges.
	Amount int64
	// Until is when the counter itself may be dropped: its window's end,
	// plus the time its last reservation may take to settle.
	Until time.Time
}

// BudgetHold is one reservation: its id (unique, random), the counters it
// holds budget on, and how long it holds it if never settled.
type BudgetHold struct {
	ID    string
	Lines []BudgetLine
	TTL   time.Duration
}

// BudgetCount is a counter as read: settled spend and live reservations.
type BudgetCount struct {
	Spent, Held int64
}

// AddCapped is a + b for a, b ≥ 0, saturating at math.MaxInt64: an
// upstream that reports absurd usage fills its counter (and its charge),
// never wraps it to a negative spend that every reservation would fit
// beside.
func AddCapped(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}

// ValidateBudget checks a scope, a reservation id and counter names as
// both stores key them.
func ValidateBudget(scope, id string, lines []BudgetLine) error {
	if len(lines) == 0 {
		return errors.New("no budget counters")
	}
	for i, l := range lines {
		if err := (Key{Scope: scope, Endpoint: "", ID: l.Counter}).Validate(); err != nil {
			return fmt.Errorf("budget counter %q: %w", l.Counter, err)
		}
		for _, e := range lines[:i] {
			if e.Counter == l.Counter {
				return fmt.Errorf("budget counter %q named twice", l.Counter)
			}
		}
		if l.Amount < 0 || l.Limit < 0 {
			return fmt.Errorf("budget counter %q: negative amount or limit", l.Counter)
		}
	}
	if err := (Key{Scope: scope, Endpoint: "", ID: id}).Validate(); err != nil {
		return fmt.Errorf("budget reservation %q: %w", id, err)
	}
	return nil
}
