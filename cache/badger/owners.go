package badgerstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/internal/codec"
)

// ownerNS starts the storage key of an ownership entry:
//
//	'o' 0x00 scope 0x00 id   codec.EncodeOwner
//
// cache.ValidateOwner forbids NUL in the scope and the id is printable
// ASCII, so the layout is unambiguous, and every entry of a scope shares
// the prefix 'o' 0 scope 0.
const ownerNS = 'o'

func ownerKey(scope, id string) []byte {
	b := make([]byte, 0, 3+len(scope)+len(id))
	b = append(b, ownerNS, 0)
	b = append(b, scope...)
	b = append(b, 0)
	return append(b, id...)
}

// PutOwner stores o under (scope, id) until ttl runs out (see cache.Owner).
// It is one Badger write, durable as a Commit is: in the write-ahead log
// before it returns.
func (s *Store) PutOwner(ctx context.Context, scope, id string, o cache.Owner, ttl time.Duration) error {
	if err := cache.ValidateOwner(scope, id); err != nil {
		return fmt.Errorf("put owner: %w", err)
	}
	if ttl <= 0 {
		return fmt.Errorf("put owner: ttl %v must be positive", ttl)
	}
	unlock, err := s.begin(ctx)
	if err != nil {
		return fmt.Errorf("put owner: %w", err)
	}
	defer unlock()
	now := s.now()
	o.Client, o.CreatedAt, o.ExpiresAt = "", now, now.Add(ttl)
	e := badger.NewEntry(ownerKey(scope, id), codec.EncodeOwner(o))
	e.ExpiresAt = badgerExpiry(ttl)
	if err := s.update(func(txn *badger.Txn) error { return txn.SetEntry(e) }); err != nil {
		return fmt.Errorf("put owner: %w", err)
	}
	s.live.wrote(len(e.Key), len(e.Value))
	return nil
}

// GetOwner returns the entry under (scope, id), or an error wrapping
// cache.ErrNotFound.
func (s *Store) GetOwner(ctx context.Context, scope, id string) (cache.Owner, error) {
	if err := cache.ValidateOwner(scope, id); err != nil {
		// No such id was ever stored.
		return cache.Owner{}, fmt.Errorf("get owner: %w: %w", cache.ErrNotFound, err)
	}
	unlock, err := s.begin(ctx)
	if err != nil {
		return cache.Owner{}, fmt.Errorf("get owner: %w", err)
	}
	defer unlock()
	var o cache.Owner
	err = s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(ownerKey(scope, id))
		if errors.Is(err, badger.ErrKeyNotFound) {
			return cache.ErrNotFound
		}
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			o, err = codec.DecodeOwner(v)
			return err
		})
	})
	if err == nil && !s.now().Before(o.ExpiresAt) {
		err = cache.ErrNotFound
	}
	if err != nil {
		return cache.Owner{}, fmt.Errorf("get owner: %w", mapClosed(err))
	}
	o.Client = scope
	return o, nil
}

// purgeOwners deletes every ownership entry of scope, found by a key-only
// scan of its prefix. The caller holds begin's admission.
func (s *Store) purgeOwners(scope string) (int, error) {
	keys, err := s.keysWithPrefix(ownerKey(scope, ""))
	if err == nil {
		err = s.deleteKeys(keys)
	}
	if err != nil {
		return 0, err
	}
	return len(keys), nil
}

// ScanOwners calls fn for each ownership entry of scope that has not
// expired by the store's clock, with its size (key and value) and expiry:
// what they take of the store counts against the client's stored-bytes
// quota, as its committed records do.
func (s *Store) ScanOwners(ctx context.Context, scope string, fn func(cache.CommittedRecord) error) error {
	if err := validScope(scope); err != nil {
		return fmt.Errorf("scan owners %q: %w", scope, err)
	}
	unlock, err := s.begin(ctx)
	if err != nil {
		return fmt.Errorf("scan owners %q: %w", scope, err)
	}
	defer unlock()
	now := s.now()
	err = s.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.Prefix = ownerKey(scope, "")
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			item := it.Item()
			var o cache.Owner
			err := item.Value(func(v []byte) (err error) {
				o, err = codec.DecodeOwner(v)
				return err
			})
			if err != nil || !now.Before(o.ExpiresAt) {
				continue // unreadable (GetOwner refuses it too) or expired
			}
			size := int64(len(item.Key())) + int64(item.ValueSize())
			if err := fn(cache.CommittedRecord{Size: size, ExpiresAt: o.ExpiresAt}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("scan owners %q: %w", scope, mapClosed(err))
	}
	return nil
}
