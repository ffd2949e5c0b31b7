package badgerstore

import (
	"fmt"
	"sync"

	"github.com/dgraph-io/badger/v4"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/internal/codec"
)

// letters indexes the dead letters in Badger by client, with their sizes
// and last failures, so that PutDeadLetter keeps each client within its
// cache.DeadLetterBound without reading the others. Like Store.dead it is
// exact because one process owns the directory: filled at Open (reading
// every letter once), changed after each write or delete of a letter, and
// pruned of expired letters by the sweep.
type letters struct {
	// put is held across a PutDeadLetter's plan, write and apply, so that
	// two letters of one client never plan from the same state (each would
	// make room for itself only). Letters are written on final failures
	// only: one at a time is enough.
	put sync.Mutex

	mu    sync.Mutex
	by    map[string]map[string]letterMeta // client → id → letter
	bytes map[string]int64                 // client → sum of its letters' sizes
}

type letterMeta struct {
	size int64
	last int64  // LastAt, Unix nanoseconds: the oldest goes first
	exp  uint64 // Badger expiry, Unix seconds
}

func newLetters() *letters {
	return &letters{by: map[string]map[string]letterMeta{}, bytes: map[string]int64{}}
}

// plan returns the ids of client's oldest letters to delete so that,
// with letter id (size m.size) stored, the client is within b.
func (l *letters) plan(client, id string, m letterMeta, b cache.DeadLetterBound) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	own := l.by[client]
	count, bytes := len(own)+1, l.bytes[client]+m.size
	if prev, ok := own[id]; ok {
		count, bytes = count-1, bytes-prev.size
	}
	var drop []string
	gone := map[string]bool{id: true}
	for b.Over(count, bytes) && count > 1 {
		oldest, om := "", letterMeta{}
		for oid, o := range own {
			if !gone[oid] && (oldest == "" || o.last < om.last || (o.last == om.last && oid < oldest)) {
				oldest, om = oid, o
			}
		}
		gone[oldest] = true
		drop = append(drop, oldest)
		count, bytes = count-1, bytes-om.size
	}
	return drop
}

// liveSize is what client's letters ids (and id, when replaced) take
// that is still counted live: those not expired at now (Unix seconds).
func (l *letters) liveSize(client string, ids []string, now uint64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int64
	for _, id := range ids {
		if m, ok := l.by[client][id]; ok && (m.exp == 0 || m.exp > now) {
			n += m.size
		}
	}
	return n
}

// set records letter id of client.
func (l *letters) set(client, id string, m letterMeta) {
	l.mu.Lock()
	defer l.mu.Unlock()
	own := l.by[client]
	if own == nil {
		own = map[string]letterMeta{}
		l.by[client] = own
	}
	l.bytes[client] += m.size - own[id].size
	own[id] = m
}

// remove forgets the letters ids, whoever's they are.
func (l *letters) remove(ids ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for client, own := range l.by {
		for _, id := range ids {
			if m, ok := own[id]; ok {
				l.bytes[client] -= m.size
				delete(own, id)
			}
		}
		if len(own) == 0 {
			delete(l.by, client)
			delete(l.bytes, client)
		}
	}
}

// removeClient forgets client's letters.
func (l *letters) removeClient(client string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.by, client)
	delete(l.bytes, client)
}

// expire forgets the letters whose Badger expiry is at or before now
// (Unix seconds, real time): Badger no longer returns them.
func (l *letters) expire(now uint64) {
	var ids []string
	l.mu.Lock()
	for _, own := range l.by {
		for id, m := range own {
			if m.exp != 0 && m.exp <= now {
				ids = append(ids, id)
			}
		}
	}
	l.mu.Unlock()
	l.remove(ids...)
}

// loadLetters reads every dead letter in Badger once, for the index and
// the id set.
func (s *Store) loadLetters() (*letters, map[string]uint64, error) {
	l, ids := newLetters(), map[string]uint64{}
	err := s.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.Prefix = deadLetterKeyPrefix
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			id := string(item.Key()[len(deadLetterKeyPrefix):])
			ids[id] = item.ExpiresAt()
			err := item.Value(func(v []byte) error {
				d, err := codec.DecodeDeadLetter(v)
				if err != nil {
					return nil // unreadable: nobody's, counted against nobody
				}
				l.set(d.Client, id, letterMeta{size: cache.DeadLetterSize(len(item.Key()), len(v)),
					last: d.LastAt.UnixNano(), exp: item.ExpiresAt()})
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read dead letters: %w", err)
	}
	return l, ids, nil
}
