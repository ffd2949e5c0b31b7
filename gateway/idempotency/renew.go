package idempotency

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/llmgate/llmgate/cache"
)

// renewals keeps the leases of a Keeper's calls in flight alive with one
// timer for all of them, not one per call (a timer started and stopped on
// every keyed request, and the closures around it, for a renewal that most
// calls end before). A call adds its lease as it starts and removes it as
// it ends: a map insert and delete. The timer ticks every 24th of the
// lease while any lease is held, and each tick starts the renewals of the
// leases a quarter of the lease has passed for since they were claimed or
// last renewed, each on a goroutine of its own (a store on a network may
// take its time) after a random delay within the tick, so that the leases
// one tick finds do not reach the store all at once; a lease is renewed
// at most a third of the lease after the last time, as a timer per call
// renewed it. A tick that finds no lease lets the timer lapse: an idle
// Keeper holds no timer and no goroutine.
type renewals struct {
	lease time.Duration
	now   func() time.Time
	// start runs a renewal on a goroutine of its own within delay (a
	// test's runs it when it says).
	start func(delay time.Duration, renew func())

	mu sync.Mutex
	// due holds each lease's next renewal; one being renewed is absent
	// (renewing) until its renewal ends.
	due      map[*Lease]time.Time
	renewing map[*Lease]bool
	timer    *time.Timer
	armed    bool
}

func newRenewals(lease time.Duration) *renewals {
	return &renewals{lease: lease, now: time.Now, start: spread,
		due: map[*Lease]time.Time{}, renewing: map[*Lease]bool{}}
}

// spread runs renew on a goroutine of its own after a random part of
// within.
func spread(within time.Duration, renew func()) {
	time.AfterFunc(rand.N(within), renew)
}

// every is how long a lease goes unrenewed; tickEvery, how often the
// timer looks (and the most a renewal it starts is delayed: spread).
func (r *renewals) every() time.Duration { return r.lease / 4 }
func (r *renewals) tickEvery() time.Duration {
	return max(r.lease/24, time.Millisecond)
}

// add holds l until remove, renewing it.
func (r *renewals) add(l *Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.due[l] = r.now().Add(r.every())
	if r.armed {
		return
	}
	r.armed = true
	if r.timer == nil {
		r.timer = time.AfterFunc(r.tickEvery(), r.tick)
		return
	}
	r.timer.Reset(r.tickEvery())
}

// remove stops renewing l. A renewal of it under way is not waited for
// (Lease.StopRenewing does that).
func (r *renewals) remove(l *Lease) {
	r.mu.Lock()
	delete(r.due, l)
	delete(r.renewing, l)
	r.mu.Unlock()
}

// tick starts the renewals due and arms the timer again while any lease
// is held.
func (r *renewals) tick() {
	r.mu.Lock()
	now := r.now()
	var due []*Lease
	for l, at := range r.due {
		if !now.Before(at) {
			due = append(due, l)
			delete(r.due, l)
			r.renewing[l] = true
		}
	}
	if len(r.due) == 0 && len(r.renewing) == 0 {
		r.armed = false
	} else {
		r.timer.Reset(r.tickEvery())
	}
	r.mu.Unlock()
	for _, l := range due {
		r.start(r.tickEvery(), func() { r.renewed(l) })
	}
}

// renewed renews l, and puts it back to be renewed again unless it was
// removed meanwhile (or its renewal said it is lost: keep reports false).
func (r *renewals) renewed(l *Lease) {
	l.renewOnce()
	keep := l.keep()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.renewing[l] {
		delete(r.renewing, l)
		if keep {
			r.due[l] = r.now().Add(r.every())
		}
	}
}

// Renew keeps the claim alive while a long call or stream runs, until
// StopRenewing: the Keeper's one timer renews it (renewals).
func (l *Lease) Renew(ctx context.Context) {
	l.renewCtx = ctx
	l.k.renewals.add(l)
}

// StopRenewing ends Renew. It waits for a renewal under way, so none runs
// after it returns.
func (l *Lease) StopRenewing() {
	l.k.renewals.remove(l)
	l.renewMu.Lock()
	l.renewStopped = true
	l.renewMu.Unlock()
}

// renewOnce renews the lease in the store, unless it was stopped or its
// call's context has ended. A renewal that finds the key no longer ours
// stops the renewals.
func (l *Lease) renewOnce() {
	l.renewMu.Lock()
	defer l.renewMu.Unlock()
	if l.renewStopped {
		return
	}
	if l.renewCtx.Err() != nil {
		l.renewLost = true
		return
	}
	octx, cancel := l.k.opCtx(l.renewCtx)
	at := l.k.renewals.now()
	err := l.k.store.Renew(octx, l.req.Key, l.owner, l.k.lease)
	cancel()
	switch {
	case err == nil:
		l.heldAt = at
	case errors.Is(err, cache.ErrNotOwner) && l.settling.Load():
		// The call committed or released the key as this renewal ran:
		// there is nothing left to renew, and no one took it over.
		l.renewLost = true
	default:
		l.k.log.Warn("renewing idempotency lease failed", "idempotency_key", HashKey(l.req.Key), "err", err)
		l.renewLost = errors.Is(err, cache.ErrNotOwner)
		if l.renewLost && l.markTaken() {
			l.k.metrics.IdemEvent("taken_over")
		}
	}
}

// confirm renews the lease at once, while the call renews it (Renew),
// when the store last confirmed it half a lease ago or more: its renewals
// (every quarter to third of a lease) are overdue, so the process was
// stopped or stalled, and past a whole lease another owner may hold the
// key by now. So a retry (Taken is asked only as one is due) is made only
// under a lease known to be held for half a lease more, not one whose
// renewal has yet to run after the stall.
func (l *Lease) confirm() {
	l.renewMu.Lock()
	stale := l.renewCtx != nil && !l.renewStopped && !l.heldAt.IsZero() &&
		!l.k.renewals.now().Before(l.heldAt.Add(l.k.lease/2))
	l.renewMu.Unlock()
	if stale {
		l.renewOnce()
	}
}

// keep reports whether the lease is to be renewed again.
func (l *Lease) keep() bool {
	l.renewMu.Lock()
	defer l.renewMu.Unlock()
	return !l.renewLost && !l.renewStopped
}
