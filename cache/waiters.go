package cache

import "sync"

// broadcast wakes the waiters of a key: each key with waiters has one
// channel, closed (and forgotten) when the key's record changes. Entries are
// reference-counted so a key whose waiters all left for another reason (ctx,
// lease timer) does not stay in the map.
type broadcast struct {
	mu     sync.Mutex
	m      map[string]*waitEntry
	closed bool
}

type waitEntry struct {
	ch chan struct{}
	n  int
}

// subscribe registers a waiter on key. ok is false once the store is closed.
func (b *broadcast) subscribe(key string) (e *waitEntry, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, false
	}
	if b.m == nil {
		b.m = make(map[string]*waitEntry)
	}
	e = b.m[key]
	if e == nil {
		e = &waitEntry{ch: make(chan struct{})}
		b.m[key] = e
	}
	e.n++
	return e, true
}

func (b *broadcast) unsubscribe(key string, e *waitEntry) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e.n--
	if e.n == 0 && b.m[key] == e {
		delete(b.m, key)
	}
}

// wake wakes every waiter of key.
func (b *broadcast) wake(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.m[key]; e != nil {
		close(e.ch)
		delete(b.m, key)
	}
}

// close wakes every waiter and refuses new ones.
func (b *broadcast) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for k, e := range b.m {
		close(e.ch)
		delete(b.m, k)
	}
}

// len is the number of keys with waiters, for tests.
func (b *broadcast) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}
