package badgerstore

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/dgraph-io/badger/v4"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/internal/codec"
)

// scopeKeyPrefix is the storage-key prefix of every record of scope:
// 'i' 0 scope 0. Key.Validate forbids NUL in a scope, so no other scope's
// keys start with it.
func scopeKeyPrefix(scope string) []byte {
	b := make([]byte, 0, 3+len(scope))
	b = append(b, recordNS, 0)
	b = append(b, scope...)
	return append(b, 0)
}

func validScope(scope string) error {
	if strings.IndexByte(scope, 0) >= 0 {
		return fmt.Errorf("%w: scope must not contain NUL", cache.ErrInvalidKey)
	}
	return nil
}

// ScanCommitted calls fn for each record committed under scope that has
// not expired by the store's clock, with its StoredSize and expiry. It
// iterates the scope's key prefix in one read-only transaction and decodes
// each value (a record's encoding up to ValueThreshold, 256 bytes, is in the
// LSM tree, a larger one is read from the value log); fn is called inside
// that transaction.
func (s *Store) ScanCommitted(ctx context.Context, scope string, fn func(cache.CommittedRecord) error) error {
	if err := validScope(scope); err != nil {
		return fmt.Errorf("scan committed %q: %w", scope, err)
	}
	unlock, err := s.begin(ctx)
	if err != nil {
		return fmt.Errorf("scan committed %q: %w", scope, err)
	}
	defer unlock()
	now := s.now()
	err = s.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.PrefetchValues = false
		opts.Prefix = scopeKeyPrefix(scope)
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			var cr cache.CommittedRecord
			var live bool
			err := it.Item().Value(func(v []byte) error {
				r, err := codec.DecodeRecord(v) // aliases v: used only inside
				if err != nil {
					return err
				}
				live = r.State == cache.Committed && (r.ExpiresAt.IsZero() || now.Before(r.ExpiresAt))
				cr = cache.CommittedRecord{Size: r.StoredSize(), ExpiresAt: r.ExpiresAt}
				return nil
			})
			if err != nil {
				s.log.Warn("scan committed: skipping unreadable record", slog.Any("err", err))
				continue
			}
			if live {
				if err := fn(cr); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("scan committed %q: %w", scope, mapClosed(err))
	}
	return nil
}

// PurgeScope deletes every record and dead letter of scope (see the
// contract in package cache). In-flight records go first, under their
// shards' locks, so that an owner's Commit either finished before (and its
// record is deleted below) or fails with ErrNotOwner; then the committed
// records, found by a key-only scan of the scope's prefix and deleted in
// write batches; then the dead letters, read whole and matched on their
// client.
func (s *Store) PurgeScope(ctx context.Context, scope string) (cache.Purged, error) {
	var p cache.Purged
	if err := validScope(scope); err != nil {
		return p, fmt.Errorf("purge %q: %w", scope, err)
	}
	unlock, err := s.begin(ctx)
	if err != nil {
		return p, fmt.Errorf("purge %q: %w", scope, err)
	}
	defer unlock()
	prefix := scopeKeyPrefix(scope)
	deleted := map[string]bool{}
	for _, k := range s.flights.dropPrefix(prefix) {
		deleted[k] = true
	}
	keys, err := s.keysWithPrefix(prefix)
	if err == nil {
		err = s.deleteKeys(keys)
	}
	if err == nil {
		for _, k := range keys {
			deleted[string(k)] = true
		}
	}
	for k := range deleted {
		s.waiters.Wake(k)
	}
	p.Records = len(deleted)
	if err != nil {
		return p, fmt.Errorf("purge %q: records: %w", scope, mapClosed(err))
	}
	if p.DeadLetters, err = s.purgeDeadLetters(ctx, scope); err != nil {
		return p, fmt.Errorf("purge %q: dead letters: %w", scope, mapClosed(err))
	}
	if p.Owners, err = s.purgeOwners(scope); err != nil {
		return p, fmt.Errorf("purge %q: owners: %w", scope, mapClosed(err))
	}
	s.afterPurge()
	return p, nil
}

// deleteKeys deletes keys in write batches, which split themselves under
// Badger's transaction size limit. A delete is a write: below the reserve
// it fails with cache.ErrFull (see roomToWrite) before reaching Badger.
func (s *Store) deleteKeys(keys [][]byte) error {
	if len(keys) == 0 {
		return nil
	}
	if err := s.roomToWrite(); err != nil {
		return err
	}
	s.gcMu.RLock()
	defer s.gcMu.RUnlock()
	wb := s.db.NewWriteBatch()
	defer wb.Cancel()
	for _, k := range keys {
		if err := wb.Delete(k); err != nil {
			return err
		}
	}
	return wb.Flush()
}

// purgeDeadLetters deletes the dead letters whose client is scope. Their
// keys are hashes of the whole key, so each value is read.
func (s *Store) purgeDeadLetters(ctx context.Context, scope string) (int, error) {
	var keys [][]byte
	err := s.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.Prefix = deadLetterKeyPrefix
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			err := it.Item().Value(func(v []byte) error {
				d, err := codec.DecodeDeadLetter(v)
				if err == nil && d.Client == scope {
					keys = append(keys, it.Item().KeyCopy(nil))
				}
				return nil // an unreadable one is nobody's to purge
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = s.deleteKeys(keys)
	}
	if err != nil {
		return 0, err
	}
	s.deadMu.Lock()
	for _, k := range keys {
		delete(s.dead, string(k[len(deadLetterKeyPrefix):]))
	}
	s.deadMu.Unlock()
	s.letters.removeClient(scope)
	return len(keys), nil
}

// dropPrefix removes every in-flight record whose storage key starts with
// prefix and returns their keys, whose waiters the caller wakes.
func (f *flights) dropPrefix(prefix []byte) []string {
	var gone []string
	p := string(prefix)
	for i := range f.shards {
		sh := &f.shards[i]
		sh.mu.Lock()
		for k := range sh.m {
			if strings.HasPrefix(k, p) {
				delete(sh.m, k)
				f.n.Add(-1)
				gone = append(gone, k)
			}
		}
		sh.mu.Unlock()
	}
	return gone
}

// keysWithPrefix lists the Badger keys under prefix.
func (s *Store) keysWithPrefix(prefix []byte) ([][]byte, error) {
	var keys [][]byte
	err := s.eachKey(prefix, func(item *badger.Item) { keys = append(keys, item.KeyCopy(nil)) })
	return keys, err
}

// eachKey calls fn with every item under prefix, in one read transaction,
// without reading values.
func (s *Store) eachKey(prefix []byte, fn func(*badger.Item)) error {
	return s.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.PrefetchValues = false
		opts.Prefix = prefix
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			fn(it.Item())
		}
		return nil
	})
}
