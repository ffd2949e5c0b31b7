package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// dispatch reads the store's one pub/sub connection until Close: wake
// messages wake the key's local waiters, breaker messages go to the
// watchers. A (re)subscription means messages may have been lost while the
// connection was down, so it wakes every waiter (each re-reads its record)
// and has every watcher re-read the overrides.
func (r *Store) dispatch(ch <-chan any) {
	defer close(r.psDone)
	wakePrefix := r.prefix + redisWakeNS
	breakers := r.breakersKey()
	var wakeSubscribed, breakersSubscribed bool
	for m := range ch {
		switch m := m.(type) {
		case *redis.Subscription:
			switch {
			case m.Kind == "psubscribe" && m.Channel == r.wakePattern:
				wakeSubscribed = true
				r.subscriptions.Add(1)
				r.waiters.WakeAll()
			case m.Kind == "subscribe" && m.Channel == breakers:
				breakersSubscribed = true
				r.watchersResync()
			}
			if wakeSubscribed && breakersSubscribed {
				r.readyOnce.Do(func() { close(r.ready) })
			}
		case *redis.Message:
			switch {
			case m.Pattern == r.wakePattern:
				if ident, ok := strings.CutPrefix(m.Channel, wakePrefix); ok {
					r.waiters.Wake(ident)
				}
			case m.Channel == breakers:
				if len(m.Payload) < 2 || (m.Payload[0] != '0' && m.Payload[0] != '1') {
					r.log.Warn("redis store: unreadable breaker message", slog.String("payload", m.Payload))
					continue
				}
				r.watchersDeliver(breakerEvent{upstream: m.Payload[1:], open: m.Payload[0] == '1'})
			}
		}
	}
}

func (r *Store) breakersKey() string { return r.prefix + redisBreakers }

// SetBreakerOverride forces upstream's breaker open on every replica
// (open), or clears the override (!open), which the replicas apply as a
// forced close. It writes the hash P+"breakers" and publishes the change on
// the channel of the same name in one script.
//
// The hash has no TTL, unlike every other key: an operator's forced open
// must not lapse by itself, and the hash holds at most one field per
// upstream.
func (r *Store) SetBreakerOverride(ctx context.Context, upstream string, open bool) error {
	if upstream == "" {
		return errors.New("set breaker override: empty upstream name")
	}
	if err := r.begin(ctx); err != nil {
		return fmt.Errorf("set breaker override %s: %w", upstream, err)
	}
	flag := "0"
	if open {
		flag = "1"
	}
	key := r.breakersKey()
	if err := breakerScript.Run(ctx, r.client, []string{key}, upstream, flag, key).Err(); err != nil {
		return fmt.Errorf("set breaker override %s: %w", upstream, r.mapErr(err))
	}
	return nil
}

// BreakerOverrides returns the upstreams forced open.
func (r *Store) BreakerOverrides(ctx context.Context) (map[string]bool, error) {
	if err := r.begin(ctx); err != nil {
		return nil, fmt.Errorf("read breaker overrides: %w", err)
	}
	all, err := r.client.HGetAll(ctx, r.breakersKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("read breaker overrides: %w", r.mapErr(err))
	}
	out := make(map[string]bool, len(all))
	for u, v := range all {
		if v == "open" {
			out[u] = true
		}
	}
	return out, nil
}

// WatchBreakerOverrides calls fn for every override change published by any
// replica, this one included, in order, from the calling goroutine. It
// first reads the overrides and calls fn(upstream, true) for each; it does
// so again after every (re)subscription of the pub/sub connection, also
// calling fn(upstream, false) for an upstream it had reported open that no
// longer is, so a replica that missed messages converges. A failed read is
// retried every PollInterval. It returns when ctx is done or the store
// closes.
//
// fn may hear of one change twice (a change published while a re-read is
// under way is reported by both). With the breaker registry that is
// harmless: ForceOpen of a forced-open breaker changes nothing, and a
// repeated ForceClose only resets the counts once more.
func (r *Store) WatchBreakerOverrides(ctx context.Context, fn func(upstream string, open bool)) {
	w := &breakerWatcher{signal: make(chan struct{}, 1), resync: true}
	w.signal <- struct{}{}
	r.watchMu.Lock()
	if r.closed.Load() {
		r.watchMu.Unlock()
		return
	}
	r.watchers[w] = struct{}{}
	r.watchMu.Unlock()
	defer func() {
		r.watchMu.Lock()
		delete(r.watchers, w)
		r.watchMu.Unlock()
	}()

	known := map[string]bool{} // upstreams fn was last told are open
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.done:
			return
		case <-w.signal:
		case <-retry:
			retry = nil
		}
		resync, events := w.take()
		if resync {
			now, err := r.BreakerOverrides(ctx)
			if err != nil {
				if ctx.Err() != nil || r.closed.Load() {
					return
				}
				r.log.Warn("redis store: breaker overrides", slog.Any("err", err))
				w.flagResync()
				retry = time.After(r.poll)
				continue
			}
			for _, u := range slices.Sorted(maps.Keys(now)) {
				fn(u, true)
			}
			for _, u := range slices.Sorted(maps.Keys(known)) {
				if !now[u] {
					fn(u, false)
				}
			}
			known = now
		}
		for _, e := range events {
			fn(e.upstream, e.open)
			if e.open {
				known[e.upstream] = true
			} else {
				delete(known, e.upstream)
			}
		}
	}
}

type breakerEvent struct {
	upstream string
	open     bool
}

// maxPendingEvents bounds a slow watcher's queue; past it, the events are
// dropped for a re-read, which subsumes them.
const maxPendingEvents = 1024

// breakerWatcher is one WatchBreakerOverrides call's mailbox: dispatch
// never blocks on fn.
type breakerWatcher struct {
	mu     sync.Mutex
	resync bool
	events []breakerEvent
	signal chan struct{} // capacity 1
}

// take returns and clears what is pending.
func (w *breakerWatcher) take() (bool, []breakerEvent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	resync, events := w.resync, w.events
	w.resync, w.events = false, nil
	return resync, events
}

// flagResync asks for a re-read; the events pending so far happened before
// it, so the re-read covers them.
func (w *breakerWatcher) flagResync() {
	w.mu.Lock()
	w.resync, w.events = true, nil
	w.mu.Unlock()
}

func (w *breakerWatcher) notify() {
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

func (r *Store) watchersResync() {
	r.watchMu.Lock()
	defer r.watchMu.Unlock()
	for w := range r.watchers {
		w.flagResync()
		w.notify()
	}
}

func (r *Store) watchersDeliver(e breakerEvent) {
	r.watchMu.Lock()
	defer r.watchMu.Unlock()
	for w := range r.watchers {
		w.mu.Lock()
		if len(w.events) >= maxPendingEvents {
			w.resync, w.events = true, nil
		} else {
			w.events = append(w.events, e)
		}
		w.mu.Unlock()
		w.notify()
	}
}
