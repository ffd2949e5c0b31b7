package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/internal/codec"
)

// maxDeadLetters bounds how many dead letters a listing reads; a queue
// that long needs an operator, and the alert says so long before.
const maxDeadLetters = 100_000

// PutDeadLetter records d (its ID is set from its key), merging with an
// earlier record of the same key, atomically (WATCH/MULTI on the one key,
// retried on conflict). It expires after ttl, which must be positive.
// Then it indexes the letter under its client and deletes the client's
// oldest letters the new one puts over Options.DeadLetters (their ids in
// d.Dropped). A Redis at maxmemory refuses the letter (cache.ErrFull).
func (r *Store) PutDeadLetter(ctx context.Context, k cache.Key, d *cache.DeadLetter, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("put dead letter %s: ttl %v must be positive", k, ttl)
	}
	d.ID = cache.DeadLetterID(k)
	d.Client, d.Endpoint, d.Key = k.Scope, k.Endpoint, k.ID
	key := r.deadLetterKey(d.ID)
	if err := r.begin(ctx); err != nil {
		return fmt.Errorf("put dead letter %s: %w", k, err)
	}
	var rec cache.DeadLetter
	var size int64
	txn := func(tx *redis.Tx) error {
		prev, err := r.loadDeadLetter(ctx, tx, key)
		if err != nil && !errors.Is(err, cache.ErrNotFound) {
			return err
		}
		rec = *d
		cache.MergeDeadLetter(&rec, prev)
		rec.ExpiresAt = r.now().Add(ttl)
		v, err := codec.EncodeDeadLetter(&rec)
		if err != nil {
			return err
		}
		size = cache.DeadLetterSize(len(key), len(v))
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, key, v, time.Duration(pxMillis(ttl))*time.Millisecond)
			return nil
		})
		return err
	}
	for attempt := 0; ; attempt++ {
		err := r.client.Watch(ctx, txn, key)
		if err == nil {
			break
		}
		if !errors.Is(err, redis.TxFailedErr) || attempt == maxConflictRetries {
			return fmt.Errorf("put dead letter %s: %w", k, r.mapErr(err))
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("put dead letter %s: %w", k, err)
		}
	}
	dropped, err := r.indexLetter(ctx, &rec, size, ttl)
	if err != nil {
		// Stored, and expiring by its TTL: the bound is kept again at
		// the client's next letter.
		r.log.Warn("dead letter stored but not indexed under its client", slog.String("id", rec.ID), slog.Any("err", err))
	}
	rec.Dropped = dropped
	*d = rec
	return nil
}

// loadDeadLetter reads and decodes the dead letter at key: ErrNotFound when
// absent or expired by the store's clock.
func (r *Store) loadDeadLetter(ctx context.Context, c redis.Cmdable, key string) (*cache.DeadLetter, error) {
	v, err := c.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, cache.ErrNotFound
	}
	if err != nil {
		return nil, r.mapErr(err)
	}
	d, err := codec.DecodeDeadLetter(v)
	if err != nil {
		return nil, err
	}
	if !d.ExpiresAt.IsZero() && !r.now().Before(d.ExpiresAt) {
		return nil, cache.ErrNotFound
	}
	d.Stored = cache.DeadLetterSize(len(key), len(v))
	return d, nil
}

// GetDeadLetter returns the dead letter with id, body included.
// ErrNotFound when there is none.
func (r *Store) GetDeadLetter(ctx context.Context, id string) (*cache.DeadLetter, error) {
	if err := r.begin(ctx); err != nil {
		return nil, err
	}
	key := r.deadLetterKey(id)
	return r.loadDeadLetter(ctx, r.client, key)
}

// DeleteDeadLetter removes a dead letter; ErrNotFound if there is none.
// Unlike Badger's, it deletes one that the store's clock says has expired
// but Redis still holds. The letter is taken with GETDEL, one round trip
// as DEL was, so that a letter found is also removed from its client's
// index.
func (r *Store) DeleteDeadLetter(ctx context.Context, id string) error {
	if err := r.begin(ctx); err != nil {
		return err
	}
	v, err := r.client.GetDel(ctx, r.deadLetterKey(id)).Bytes()
	if errors.Is(err, redis.Nil) {
		return cache.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("delete dead letter %s: %w", id, r.mapErr(err))
	}
	if d, err := codec.DecodeDeadLetter(v); err == nil {
		if err := r.unindexLetter(ctx, d.Client, id); err != nil {
			r.log.Warn("dead letter deleted but left in its client's index", slog.String("id", id), slog.Any("err", err))
		}
	}
	return nil
}

// ListDeadLetters returns the dead letters matching f, newest first (by
// last failure), without bodies, reading at most 100,000. The keys are
// found by SCAN (on every master in Cluster mode) and read in pipelined
// batches.
func (r *Store) ListDeadLetters(ctx context.Context, f cache.DeadLetterFilter) ([]cache.DeadLetter, error) {
	if err := r.begin(ctx); err != nil {
		return nil, err
	}
	var mu sync.Mutex
	var out []cache.DeadLetter
	read := 0
	now := r.now()
	err := r.scan(ctx, globEscape(r.prefix)+redisDeadLetterNS+"*", func(ctx context.Context, c redis.Cmdable, keys []string) error {
		mu.Lock()
		full := read >= maxDeadLetters
		read += len(keys)
		mu.Unlock()
		if full {
			return nil
		}
		cmds, err := pipelined(ctx, c, keys, func(p redis.Pipeliner, key string) *redis.StringCmd {
			return p.Get(ctx, key)
		})
		if err != nil {
			return err
		}
		var got []cache.DeadLetter
		for _, cmd := range cmds {
			v, err := cmd.Bytes()
			if errors.Is(err, redis.Nil) {
				continue
			}
			if err != nil {
				return err
			}
			d, err := codec.DecodeDeadLetter(v)
			if err != nil {
				r.log.Warn("skipping unreadable dead letter", slog.String("key", cmd.Args()[1].(string)), slog.Any("err", err))
				continue
			}
			if !d.ExpiresAt.IsZero() && !now.Before(d.ExpiresAt) {
				continue
			}
			if f.Match(d) {
				d.Stored = cache.DeadLetterSize(len(cmd.Args()[1].(string)), len(v))
				d.Body = nil
				got = append(got, *d)
			}
		}
		mu.Lock()
		out = append(out, got...)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", r.mapErr(err))
	}
	cache.SortDeadLetters(out)
	return out, nil
}
