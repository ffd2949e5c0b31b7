package badgerstore

import (
	"context"
	"errors"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/internal/codec"
)

// maxDeadLetters bounds how many dead letters a listing reads; a queue
// that long needs an operator, and the alert says so long before.
const maxDeadLetters = 100_000

// PutDeadLetter records d (its ID is set from its key), merging with an
// earlier record of the same key. It expires after ttl. In the same
// transaction it deletes the client's oldest letters that the new one
// puts over Options.DeadLetters (their ids in d.Dropped); it fails with
// cache.ErrFull, writing nothing, when the letter would take the live
// entries past Options.MaxBytes.
func (s *Store) PutDeadLetter(ctx context.Context, k cache.Key, d *cache.DeadLetter, ttl time.Duration) error {
	d.ID = cache.DeadLetterID(k)
	d.Client, d.Endpoint, d.Key = k.Scope, k.Endpoint, k.ID
	key := deadLetterKey(d.ID)
	sh, err := s.lockKey(ctx, key)
	if err != nil {
		return err
	}
	defer s.unlockKey(sh)
	s.letters.put.Lock()
	defer s.letters.put.Unlock()
	// Added before the write: the set may name a dead letter that is not
	// there (the write failed), never miss one that is.
	exp := badgerExpiry(ttl)
	s.deadMu.Lock()
	s.dead[d.ID] = max(s.dead[d.ID], exp)
	s.deadMu.Unlock()
	var (
		rec  cache.DeadLetter
		meta letterMeta
		drop []string
		vlen int
		// credited is what this letter's deletes took off the live
		// figure; given back if the write fails.
		credited int64
	)
	err = s.update(func(txn *badger.Txn) error {
		prev, err := s.loadDeadLetter(txn, key)
		if err != nil && !errors.Is(err, cache.ErrNotFound) {
			return err
		}
		rec = *d
		cache.MergeDeadLetter(&rec, prev)
		rec.ExpiresAt = s.now().Add(ttl)
		v, err := codec.EncodeDeadLetter(&rec)
		if err != nil {
			return err
		}
		vlen = len(v)
		meta = letterMeta{size: cache.DeadLetterSize(len(key), len(v)), last: rec.LastAt.UnixNano(), exp: exp}
		if err := s.roomUnderCap(meta.size); err != nil {
			return err
		}
		drop = s.letters.plan(k.Scope, d.ID, meta, s.bound)
		e := badger.NewEntry(key, v)
		e.ExpiresAt = exp
		if err := txn.SetEntry(e); err != nil {
			return err
		}
		for _, id := range drop {
			if err := txn.Delete(deadLetterKey(id)); err != nil {
				return err
			}
		}
		// Taken off before the commit, so that a scan never misses
		// these letters and sees them taken off too (see live).
		n := s.letters.liveSize(k.Scope, append([]string{d.ID}, drop...), uint64(time.Now().Unix()))
		s.live.deleted(n - credited)
		credited = n
		return nil
	})
	if err != nil {
		s.live.deleted(-credited)
		return err
	}
	s.live.wrote(len(key), vlen)
	s.letters.set(k.Scope, d.ID, meta)
	s.letters.remove(drop...)
	s.deadMu.Lock()
	for _, id := range drop {
		delete(s.dead, id)
	}
	s.deadMu.Unlock()
	rec.Dropped = drop
	*d = rec
	return nil
}

func (s *Store) loadDeadLetter(txn *badger.Txn, key []byte) (*cache.DeadLetter, error) {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, cache.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	v, err := item.ValueCopy(nil)
	if err != nil {
		return nil, err
	}
	d, err := codec.DecodeDeadLetter(v)
	if err != nil {
		return nil, err
	}
	if !d.ExpiresAt.IsZero() && !s.now().Before(d.ExpiresAt) {
		return nil, cache.ErrNotFound
	}
	d.Stored = cache.DeadLetterSize(len(key), len(v))
	return d, nil
}

// GetDeadLetter returns the dead letter with id, body included.
func (s *Store) GetDeadLetter(ctx context.Context, id string) (*cache.DeadLetter, error) {
	unlock, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var d *cache.DeadLetter
	err = s.db.View(func(txn *badger.Txn) error {
		var err error
		d, err = s.loadDeadLetter(txn, deadLetterKey(id))
		return err
	})
	return d, mapClosed(err)
}

// DeleteDeadLetter removes a dead letter; ErrNotFound if there is none
// (answered from the in-memory set of ids, without touching Badger). A
// keyed success asks MayHaveDeadLetter first and calls this only when it
// may find one.
func (s *Store) DeleteDeadLetter(ctx context.Context, id string) error {
	unlock, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	key := deadLetterKey(id)
	sh := s.flights.lock(key)
	defer sh.mu.Unlock()
	if !s.MayHaveDeadLetter(id) {
		return cache.ErrNotFound
	}
	err = s.update(func(txn *badger.Txn) error {
		if _, err := s.loadDeadLetter(txn, key); err != nil {
			return err
		}
		return txn.Delete(key)
	})
	if err == nil || errors.Is(err, cache.ErrNotFound) {
		s.deadMu.Lock()
		delete(s.dead, id)
		s.deadMu.Unlock()
		s.letters.remove(id)
	}
	return err
}

// MayHaveDeadLetter reports whether the dead letter id may be stored: the
// in-memory set of ids names every stored letter (from before its write;
// it may name one whose write failed or that has expired), so false is
// certain. It implements deadletter.Lister.
func (s *Store) MayHaveDeadLetter(id string) bool {
	s.deadMu.Lock()
	_, ok := s.dead[id]
	s.deadMu.Unlock()
	return ok
}

// forgetExpiredDeadLetters drops from the set the ids whose Badger TTL has
// run out by the real clock (Badger's own): Badger no longer returns them,
// so they need no delete.
func (s *Store) forgetExpiredDeadLetters() {
	now := uint64(time.Now().Unix())
	s.letters.expire(now)
	s.deadMu.Lock()
	defer s.deadMu.Unlock()
	for id, exp := range s.dead {
		if exp != 0 && exp <= now {
			delete(s.dead, id)
		}
	}
}

// ListDeadLetters returns the dead letters matching f, newest first
// (by last failure), without bodies.
func (s *Store) ListDeadLetters(ctx context.Context, f cache.DeadLetterFilter) ([]cache.DeadLetter, error) {
	unlock, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var out []cache.DeadLetter
	now := s.now()
	err = s.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.Prefix = deadLetterKeyPrefix
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid() && len(out) < maxDeadLetters; it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			d, err := codec.DecodeDeadLetter(v)
			if err != nil {
				s.log.Warn("skipping unreadable dead letter", "err", err)
				continue
			}
			if !d.ExpiresAt.IsZero() && !now.Before(d.ExpiresAt) {
				continue
			}
			if f.Match(d) {
				d.Stored = cache.DeadLetterSize(len(it.Item().Key()), len(v))
				d.Body = nil
				out = append(out, *d)
			}
		}
		return nil
	})
	if err != nil {
		return nil, mapClosed(err)
	}
	cache.SortDeadLetters(out)
	return out, nil
}
