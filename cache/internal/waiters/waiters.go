// Package waiters wakes the goroutines waiting on a key, for the stores'
// Wait: each key with waiters has one channel, closed (and forgotten) when
// the key's record changes.
package waiters

import "sync"

// Broadcast is the set of keys with waiters. Entries are reference-counted
// so a key whose waiters all left for another reason (ctx, lease timer)
// does not stay in the map. The zero value is ready to use.
type Broadcast struct {
	mu     sync.Mutex
	m      map[string]*Entry
	closed bool
}

// Entry is one key's wake-up channel, shared by its waiters.
type Entry struct {
	ch chan struct{}
	n  int
}

// Done is closed when the key's waiters are woken.
func (e *Entry) Done() <-chan struct{} { return e.ch }

// Subscribe registers a waiter on key; the caller must Unsubscribe it. ok
// is false once the broadcast is closed.
func (b *Broadcast) Subscribe(key string) (e *Entry, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, false
	}
	if b.m == nil {
		b.m = make(map[string]*Entry)
	}
	e = b.m[key]
	if e == nil {
		e = &Entry{ch: make(chan struct{})}
		b.m[key] = e
	}
	e.n++
	return e, true
}

// Unsubscribe removes a waiter Subscribe registered.
func (b *Broadcast) Unsubscribe(key string, e *Entry) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e.n--
	if e.n == 0 && b.m[key] == e {
		delete(b.m, key)
	}
}

// Wake wakes every waiter of key.
func (b *Broadcast) Wake(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.m[key]; e != nil {
		close(e.ch)
		delete(b.m, key)
	}
}

// WakeAll wakes every waiter, whatever its key; unlike Close, it admits new
// ones.
func (b *Broadcast) WakeAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.wakeAll()
}

// Close wakes every waiter and refuses new ones.
func (b *Broadcast) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.wakeAll()
}

func (b *Broadcast) wakeAll() {
	for k, e := range b.m {
		close(e.ch)
		delete(b.m, k)
	}
}

// Len is the number of keys with waiters, for tests.
func (b *Broadcast) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}
