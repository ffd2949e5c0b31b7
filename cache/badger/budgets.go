package badgerstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/llmgate/llmgate/cache"
)

// budgetNS starts the storage key of a budget counter:
//
//	'b' 0x00 scope 0x00 counter   budgetCounter as JSON; Badger TTL = its Until
//
// A counter carries its live reservations, each with its expiry, so a
// reservation a crash left unsettled is in Badger with the counter and
// expires with its ttl: after a restart the budget it held is free once
// that has passed, and the spent amount is intact.
const budgetNS = 'b'

func budgetKey(scope, counter string) []byte {
	b := make([]byte, 0, 3+len(scope)+len(counter))
	b = append(b, budgetNS, 0)
	b = append(b, scope...)
	b = append(b, 0)
	return append(b, counter...)
}

// budgetCounter is one counter as stored. Integers only: JSON numbers of
// int64 fields decode exactly.
type budgetCounter struct {
	Spent int64 `json:"s"`
	Held  int64 `json:"h"`
	// Res are the live reservations by id.
	Res map[string]budgetRes `json:"r,omitempty"`
}

// budgetRes is one reservation on a counter: its amount and expiry (Unix
// milliseconds, store clock). Once expired it is a tombstone (Gone) until
// Expires again: its settlement, if it ever comes, still charges, once.
type budgetRes struct {
	Amount  int64 `json:"a"`
	Expires int64 `json:"e"`
	Gone    bool  `json:"g,omitempty"`
}

// fits reports whether l's amount fits beside c's spend and holds under
// l's limit (a spend saturated at the largest integer fits nothing).
func (c *budgetCounter) fits(l cache.BudgetLine) bool {
	return cache.AddCapped(cache.AddCapped(c.Spent, c.Held), l.Amount) <= l.Limit
}

// purge frees the reservations expired at now (ms), leaving tombstones
// that last ttl (ms), and drops the tombstones expired.
func (c *budgetCounter) purge(now, ttl int64) {
	for id, r := range c.Res {
		switch {
		case r.Expires > now:
		case r.Gone:
			delete(c.Res, id)
		default:
			c.Held -= r.Amount
			c.Res[id] = budgetRes{Expires: now + ttl, Gone: true}
		}
	}
}

// ReserveBudget takes h on every counter it names, or on none: refused
// is the 1-based index of the first line whose limit it would pass (0
// when taken). Reserving an id already held is a no-op that succeeds.
// One Badger transaction, under the store's budget lock (one process
// owns the directory, so the lock serialises every reservation).
func (s *Store) ReserveBudget(ctx context.Context, scope string, h cache.BudgetHold) (refused int, err error) {
	if err := cache.ValidateBudget(scope, h.ID, h.Lines); err != nil {
		return 0, fmt.Errorf("reserve budget: %w", err)
	}
	unlock, err := s.begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("reserve budget: %w", err)
	}
	defer unlock()
	s.budgetMu.Lock()
	defer s.budgetMu.Unlock()
	now := s.now().UnixMilli()
	err = s.update(func(txn *badger.Txn) error {
		refused = 0
		counters, err := readCounters(txn, scope, h.Lines)
		if err != nil {
			return err
		}
		for i, l := range h.Lines {
			c := counters[i]
			if _, held := c.Res[h.ID]; held {
				return nil // a retry of this very reservation
			}
			if !c.fits(l) {
				c.purge(now, h.TTL.Milliseconds())
				if !c.fits(l) {
					refused = i + 1
					return nil
				}
			}
		}
		for i, l := range h.Lines {
			c := counters[i]
			c.Held += l.Amount
			c.Res[h.ID] = budgetRes{Amount: l.Amount, Expires: now + h.TTL.Milliseconds()}
		}
		return writeCounters(txn, scope, h.Lines, counters, s.now())
	})
	if err != nil {
		return 0, fmt.Errorf("reserve budget: %w", err)
	}
	return refused, nil
}

// SettleBudget replaces the reservation id by what its run was charged:
// on each line's counter that holds it (or its tombstone: it expired),
// it is dropped and the line's amount added to the spent. A counter that
// holds neither was settled already: it is left as it is.
func (s *Store) SettleBudget(ctx context.Context, scope, id string, lines []cache.BudgetLine) error {
	if err := cache.ValidateBudget(scope, id, lines); err != nil {
		return fmt.Errorf("settle budget: %w", err)
	}
	unlock, err := s.begin(ctx)
	if err != nil {
		return fmt.Errorf("settle budget: %w", err)
	}
	defer unlock()
	s.budgetMu.Lock()
	defer s.budgetMu.Unlock()
	err = s.update(func(txn *badger.Txn) error {
		counters, err := readCounters(txn, scope, lines)
		if err != nil {
			return err
		}
		for i, l := range lines {
			c := counters[i]
			r, held := c.Res[id]
			if !held {
				continue
			}
			if !r.Gone {
				c.Held -= r.Amount
			}
			delete(c.Res, id)
			c.Spent = cache.AddCapped(c.Spent, l.Amount)
		}
		return writeCounters(txn, scope, lines, counters, s.now())
	})
	if err != nil {
		return fmt.Errorf("settle budget: %w", err)
	}
	return nil
}

// ReadBudgets reads counters of scope; one never written reads as zero.
// Expired reservations are not counted in Held.
func (s *Store) ReadBudgets(ctx context.Context, scope string, counters []string) ([]cache.BudgetCount, error) {
	unlock, err := s.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("read budgets: %w", err)
	}
	defer unlock()
	lines := make([]cache.BudgetLine, len(counters))
	for i, c := range counters {
		lines[i].Counter = c
	}
	out := make([]cache.BudgetCount, len(counters))
	now := s.now().UnixMilli()
	err = s.db.View(func(txn *badger.Txn) error {
		cs, err := readCounters(txn, scope, lines)
		if err != nil {
			return err
		}
		for i, c := range cs {
			c.purge(now, 0)
			out[i] = cache.BudgetCount{Spent: c.Spent, Held: c.Held}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read budgets: %w", mapClosed(err))
	}
	return out, nil
}

func readCounters(txn *badger.Txn, scope string, lines []cache.BudgetLine) ([]*budgetCounter, error) {
	out := make([]*budgetCounter, len(lines))
	for i, l := range lines {
		c := &budgetCounter{}
		item, err := txn.Get(budgetKey(scope, l.Counter))
		switch {
		case errors.Is(err, badger.ErrKeyNotFound):
		case err != nil:
			return nil, err
		default:
			if err := item.Value(func(v []byte) error { return json.Unmarshal(v, c) }); err != nil {
				return nil, fmt.Errorf("budget counter %q: %w", l.Counter, err)
			}
		}
		if c.Res == nil {
			c.Res = map[string]budgetRes{}
		}
		if c.Spent < 0 {
			// Only a sum that wrapped around (before AddCapped) is negative:
			// it was past the largest integer.
			c.Spent = math.MaxInt64
		}
		out[i] = c
	}
	return out, nil
}

func writeCounters(txn *badger.Txn, scope string, lines []cache.BudgetLine, counters []*budgetCounter, now time.Time) error {
	for i, l := range lines {
		v, err := json.Marshal(counters[i])
		if err != nil {
			return err
		}
		e := badger.NewEntry(budgetKey(scope, l.Counter), v)
		if d := l.Until.Sub(now); d > 0 {
			e.ExpiresAt = badgerExpiry(d)
		}
		if err := txn.SetEntry(e); err != nil {
			return err
		}
	}
	return nil
}
