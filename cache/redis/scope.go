package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/internal/codec"
)

// scopePattern is the SCAN pattern of every record of scope:
// P r:{<scope>:*. The scope is escaped (escapePart), so the pattern
// matches its keys only: another scope cannot contain the ':' that ends
// this one, nor a glob metacharacter.
func (r *Store) scopePattern(scope string) string { return r.nsPattern(redisRecordNS, scope) }

// nsPattern is the SCAN pattern of scope's keys in namespace ns:
// P ns{<escaped scope>:*.
func (r *Store) nsPattern(ns, scope string) string {
	var b strings.Builder
	b.WriteString(globEscape(r.prefix))
	b.WriteString(ns)
	b.WriteByte('{')
	escapePart(&b, scope)
	b.WriteString(":*")
	return b.String()
}

// identOf is the ident of a record key (see recordKey): its wake channel's
// suffix.
func (r *Store) identOf(key string) string {
	return strings.TrimSuffix(strings.TrimPrefix(key, r.prefix+redisRecordNS+"{"), "}")
}

// ScanCommitted calls fn for each record committed under scope that has
// not expired by the store's clock, with its StoredSize and expiry. The
// keys are found by SCAN over the scope's pattern (on every master in
// Cluster mode) and read in pipelined batches of HMGET state, exp and
// size, which Commit writes; a record committed by a release that did not
// write size is read whole and decoded. fn is called from one goroutine
// at a time. Like every SCAN it visits the whole keyspace, whatever the
// pattern.
func (r *Store) ScanCommitted(ctx context.Context, scope string, fn func(cache.CommittedRecord) error) error {
	if err := r.begin(ctx); err != nil {
		return fmt.Errorf("scan committed %q: %w", scope, err)
	}
	now := r.now()
	var mu sync.Mutex
	var stopped error // fn's error, once it has failed
	err := r.scan(ctx, r.scopePattern(scope), func(ctx context.Context, c redis.Cmdable, keys []string) error {
		cmds, err := pipelined(ctx, c, keys, func(p redis.Pipeliner, key string) *redis.SliceCmd {
			return p.HMGet(ctx, key, "state", "exp", "size")
		})
		if err != nil {
			return err
		}
		for i, cmd := range cmds {
			vals, err := cmd.Result()
			if err != nil {
				return err
			}
			if s, _ := vals[0].(string); s != "2" {
				continue // in flight, or gone since the scan
			}
			exp, _ := vals[1].(string)
			at, err := parseLuaTime(exp)
			if err != nil {
				r.log.Warn("scan committed: skipping a record with an unreadable expiry", slog.String("key", keys[i]), slog.Any("err", err))
				continue
			}
			if !now.Before(at) {
				continue
			}
			var size int64
			if s, ok := vals[2].(string); ok {
				size, err = strconv.ParseInt(s, 10, 64)
			} else {
				size, err = r.storedSize(ctx, c, keys[i])
			}
			if errors.Is(err, cache.ErrNotFound) {
				continue
			}
			if err != nil {
				r.log.Warn("scan committed: skipping an unreadable record", slog.String("key", keys[i]), slog.Any("err", err))
				continue
			}
			// In a cluster the masters are scanned at once: after fn's first
			// error no scan calls it again, as its contract says.
			mu.Lock()
			if stopped == nil {
				stopped = fn(cache.CommittedRecord{Size: size, ExpiresAt: at})
			}
			err = stopped
			mu.Unlock()
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("scan committed %q: %w", scope, r.mapErr(err))
	}
	return nil
}

// storedSize reads and decodes the record at key for its StoredSize.
func (r *Store) storedSize(ctx context.Context, c redis.Cmdable, key string) (int64, error) {
	data, err := c.HGet(ctx, key, "data").Bytes()
	if errors.Is(err, redis.Nil) {
		return 0, cache.ErrNotFound
	}
	if err != nil {
		return 0, err
	}
	rec, err := codec.DecodeRecord(data)
	if err != nil {
		return 0, err
	}
	return rec.StoredSize(), nil
}

// parseLuaTime reads luaTime's "<unix seconds>.<9-digit nanoseconds>".
func parseLuaTime(s string) (time.Time, error) {
	sec, nsec, ok := strings.Cut(s, ".")
	if !ok {
		return time.Time{}, fmt.Errorf("time %q is not <seconds>.<nanoseconds>", s)
	}
	a, err1 := strconv.ParseInt(sec, 10, 64)
	b, err2 := strconv.ParseInt(nsec, 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return time.Time{}, fmt.Errorf("time %q: %w", s, err)
	}
	return time.Unix(a, b).UTC(), nil
}

// PurgeScope deletes every record and dead letter of scope (see the
// contract in package cache): the records by SCAN over the scope's pattern
// and UNLINK in pipelined batches, each deleted key's waiters woken on
// every replica (PUBLISH, as Delete does); then the dead letters, whose
// keys do not name their client, by SCAN over all of them, read and
// matched on their client. An owner whose in-flight record was deleted
// gets ErrNotOwner from its Commit.
func (r *Store) PurgeScope(ctx context.Context, scope string) (cache.Purged, error) {
	var p cache.Purged
	if err := r.begin(ctx); err != nil {
		return p, fmt.Errorf("purge %q: %w", scope, err)
	}
	defer r.bumpPurgeMark(ctx, scope)
	var mu sync.Mutex
	err := r.scan(ctx, r.scopePattern(scope), func(ctx context.Context, c redis.Cmdable, keys []string) error {
		cmds, err := pipelined(ctx, c, keys, func(p redis.Pipeliner, key string) *redis.IntCmd {
			return p.Unlink(ctx, key)
		})
		if err != nil {
			return err
		}
		var gone []string
		for i, cmd := range cmds {
			if cmd.Val() == 1 {
				gone = append(gone, r.identOf(keys[i]))
			}
		}
		mu.Lock()
		p.Records += len(gone)
		mu.Unlock()
		if _, err := pipelined(ctx, c, gone, func(p redis.Pipeliner, ident string) *redis.IntCmd {
			return p.Publish(ctx, r.wakeChannel(ident), "delete")
		}); err != nil {
			return err
		}
		for _, ident := range gone {
			r.waiters.Wake(ident)
		}
		return nil
	})
	if err != nil {
		return p, fmt.Errorf("purge %q: records: %w", scope, r.mapErr(err))
	}
	err = r.scan(ctx, globEscape(r.prefix)+redisDeadLetterNS+"*", func(ctx context.Context, c redis.Cmdable, keys []string) error {
		cmds, err := pipelined(ctx, c, keys, func(p redis.Pipeliner, key string) *redis.StringCmd {
			return p.Get(ctx, key)
		})
		if err != nil {
			return err
		}
		var theirs []string
		for i, cmd := range cmds {
			v, err := cmd.Bytes()
			if err != nil {
				continue // gone since the scan
			}
			if d, err := codec.DecodeDeadLetter(v); err == nil && d.Client == scope {
				theirs = append(theirs, keys[i])
			}
		}
		dels, err := pipelined(ctx, c, theirs, func(p redis.Pipeliner, key string) *redis.IntCmd {
			return p.Unlink(ctx, key)
		})
		if err != nil {
			return err
		}
		n := 0
		for _, cmd := range dels {
			n += int(cmd.Val())
		}
		mu.Lock()
		p.DeadLetters += n
		mu.Unlock()
		return nil
	})
	if err != nil {
		return p, fmt.Errorf("purge %q: dead letters: %w", scope, r.mapErr(err))
	}
	if err := r.dropLetterIndex(ctx, scope); err != nil {
		return p, fmt.Errorf("purge %q: dead-letter index: %w", scope, err)
	}
	if p.Owners, err = r.purgeOwners(ctx, scope); err != nil {
		return p, fmt.Errorf("purge %q: owners: %w", scope, r.mapErr(err))
	}
	return p, nil
}

// redisPurgeMarkNS keys a counter per client that PurgeScope bumps, so
// that every replica can tell cheaply that a purge happened (PurgeMark)
// and count the client's stored bytes again:
//
//	P pm:{<scope>}   integer
const redisPurgeMarkNS = "pm:"

func (r *Store) purgeMarkKey(scope string) string { return r.taggedKey(redisPurgeMarkNS, scope) }

// bumpPurgeMark counts a purge of scope, done or cut short (some records
// may be gone either way), even once ctx has ended. The mark lives
// purgeMarkTTL past its last purge: one that expired reads 0, which a
// replica that saw another value takes for a purge (one count more).
func (r *Store) bumpPurgeMark(ctx context.Context, scope string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), purgeMarkTimeout)
	defer cancel()
	key := r.purgeMarkKey(scope)
	r.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Incr(ctx, key)
		p.PExpire(ctx, key, purgeMarkTTL)
		return nil
	})
}

const (
	// purgeMarkTimeout bounds bumping the purge mark after a purge.
	purgeMarkTimeout = 5 * time.Second
	purgeMarkTTL     = 30 * 24 * time.Hour
)

// PurgeMark is how many purges of scope the store has counted (0 for
// none): a replica's storage limits read it to learn of a purge another
// replica made (limits.Limiter.CheckStorage).
func (r *Store) PurgeMark(ctx context.Context, scope string) (int64, error) {
	if err := r.begin(ctx); err != nil {
		return 0, fmt.Errorf("purge mark %q: %w", scope, err)
	}
	n, err := r.client.Get(ctx, r.purgeMarkKey(scope)).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("purge mark %q: %w", scope, r.mapErr(err))
	}
	return n, nil
}
