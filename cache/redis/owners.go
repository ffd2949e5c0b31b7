package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/internal/codec"
)

// redisOwnerNS starts the key of an ownership entry:
//
//	P o:{<scope>:<id>}   a string, codec.EncodeOwner's bytes; TTL = its ttl
//
// Parts are escaped as a record's are (escapePart), so a scope's entries
// match the pattern P o:{<escaped scope>:*}.
const redisOwnerNS = "o:"

func (r *Store) ownerKey(scope, id string) string {
	var b strings.Builder
	b.Grow(len(r.prefix) + len(scope) + len(id) + 8)
	b.WriteString(r.prefix)
	b.WriteString(redisOwnerNS)
	b.WriteByte('{')
	escapePart(&b, scope)
	b.WriteByte(':')
	escapePart(&b, id)
	b.WriteByte('}')
	return b.String()
}

// PutOwner stores o under (scope, id) until ttl runs out (see cache.Owner):
// one SET with PX, seen by every replica.
func (r *Store) PutOwner(ctx context.Context, scope, id string, o cache.Owner, ttl time.Duration) error {
	if err := cache.ValidateOwner(scope, id); err != nil {
		return fmt.Errorf("put owner: %w", err)
	}
	if ttl <= 0 {
		return fmt.Errorf("put owner: ttl %v must be positive", ttl)
	}
	if err := r.begin(ctx); err != nil {
		return fmt.Errorf("put owner: %w", err)
	}
	now := r.now()
	o.Client, o.CreatedAt, o.ExpiresAt = "", now, now.Add(ttl)
	px := time.Duration(pxMillis(ttl)) * time.Millisecond
	if err := r.client.Set(ctx, r.ownerKey(scope, id), codec.EncodeOwner(o), px).Err(); err != nil {
		return fmt.Errorf("put owner: %w", r.mapErr(err))
	}
	return nil
}

// GetOwner returns the entry under (scope, id), or an error wrapping
// cache.ErrNotFound.
func (r *Store) GetOwner(ctx context.Context, scope, id string) (cache.Owner, error) {
	if err := cache.ValidateOwner(scope, id); err != nil {
		return cache.Owner{}, fmt.Errorf("get owner: %w: %w", cache.ErrNotFound, err)
	}
	if err := r.begin(ctx); err != nil {
		return cache.Owner{}, fmt.Errorf("get owner: %w", err)
	}
	v, err := r.client.Get(ctx, r.ownerKey(scope, id)).Bytes()
	if errors.Is(err, redis.Nil) {
		return cache.Owner{}, fmt.Errorf("get owner: %w", cache.ErrNotFound)
	}
	if err != nil {
		return cache.Owner{}, fmt.Errorf("get owner: %w", r.mapErr(err))
	}
	o, err := codec.DecodeOwner(v)
	if err != nil {
		return cache.Owner{}, fmt.Errorf("get owner: %w", err)
	}
	if !r.now().Before(o.ExpiresAt) {
		return cache.Owner{}, fmt.Errorf("get owner: %w", cache.ErrNotFound)
	}
	o.Client = scope
	return o, nil
}

// purgeOwners deletes every ownership entry of scope: the keys matching
// P o:{<escaped scope>:*, on every master in Cluster mode.
func (r *Store) purgeOwners(ctx context.Context, scope string) (int, error) {
	var mu sync.Mutex
	n := 0
	err := r.scan(ctx, r.ownerPattern(scope), func(ctx context.Context, c redis.Cmdable, keys []string) error {
		cmds, err := pipelined(ctx, c, keys, func(p redis.Pipeliner, key string) *redis.IntCmd {
			return p.Unlink(ctx, key)
		})
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, cmd := range cmds {
			n += int(cmd.Val())
		}
		return nil
	})
	return n, err
}

// ownerPattern is the SCAN pattern of scope's ownership entries:
// P o:{<escaped scope>:*.
func (r *Store) ownerPattern(scope string) string { return r.nsPattern(redisOwnerNS, scope) }

// ScanOwners calls fn for each ownership entry of scope that has not
// expired by the store's clock, with its size (key and value) and expiry:
// what they take of the store counts against the client's stored-bytes
// quota, as its committed records do. The keys are found by SCAN (on
// every master in Cluster mode) and read in pipelined GETs; fn is called
// from one goroutine at a time.
func (r *Store) ScanOwners(ctx context.Context, scope string, fn func(cache.CommittedRecord) error) error {
	if err := r.begin(ctx); err != nil {
		return fmt.Errorf("scan owners %q: %w", scope, err)
	}
	now := r.now()
	var mu sync.Mutex
	var stopped error // fn's error, once it has failed
	err := r.scan(ctx, r.ownerPattern(scope), func(ctx context.Context, c redis.Cmdable, keys []string) error {
		cmds, err := pipelined(ctx, c, keys, func(p redis.Pipeliner, key string) *redis.StringCmd {
			return p.Get(ctx, key)
		})
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if stopped != nil {
			// In a cluster the masters are scanned at once: after fn's
			// first error no scan calls it again.
			return stopped
		}
		for i, cmd := range cmds {
			v, err := cmd.Bytes()
			if errors.Is(err, redis.Nil) {
				continue // expired since the scan
			}
			if err != nil {
				return err
			}
			o, err := codec.DecodeOwner(v)
			if err != nil || !now.Before(o.ExpiresAt) {
				continue
			}
			if stopped = fn(cache.CommittedRecord{Size: int64(len(keys[i]) + len(v)), ExpiresAt: o.ExpiresAt}); stopped != nil {
				return stopped
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("scan owners %q: %w", scope, r.mapErr(err))
	}
	return nil
}
