package redisstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmgate/llmgate/cache"
)

// Each client's dead letters are indexed, so that PutDeadLetter keeps the
// client within Options.DeadLetters (cache.DeadLetterBound) reading its
// letters only:
//
//	P dl:{<client>}    sorted set: dead-letter id, scored by LastAt (Unix ms)
//	P dlb:{<client>}   hash: dead-letter id → its size (cache.DeadLetterSize)
//
// Both carry the client's hash tag, so one script updates both (in
// Cluster mode too); the letters themselves (P d:{id}) are on other slots
// and deleted by the caller after the script chose them. Entries whose
// letter has expired (scored before now − ttl) are pruned by the next put;
// both keys live as long as the client's newest letter.
const (
	redisLetterIndexNS = "dl:"
	redisLetterSizesNS = "dlb:"
)

func (r *Store) letterIndexKeys(client string) (index, sizes string) {
	var b strings.Builder
	b.WriteByte('{')
	escapePart(&b, client)
	b.WriteByte('}')
	tag := b.String()
	return r.prefix + redisLetterIndexNS + tag, r.prefix + redisLetterSizesNS + tag
}

// indexLetterScript: KEYS index, sizes; ARGV id, score (LastAt ms), size,
// max count, max bytes (0: no bound), prune before (ms), PX (ms).
// Adds the letter, prunes expired entries, and removes the client's oldest
// entries (never the new one) until the client is within the bound.
// Returns the ids removed, whose letters the caller deletes. The #!lua
// shebang makes a Redis over maxmemory refuse it (see claimScript).
var indexLetterScript = redis.NewScript(`#!lua
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[6])
for _, e in ipairs(expired) do
  redis.call('ZREM', KEYS[1], e)
  redis.call('HDEL', KEYS[2], e)
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
local maxc, maxb = tonumber(ARGV[4]), tonumber(ARGV[5])
local count = redis.call('ZCARD', KEYS[1])
local total = 0
for _, v in ipairs(redis.call('HVALS', KEYS[2])) do total = total + tonumber(v) end
local dropped = {}
while count > 1 and ((maxc > 0 and count > maxc) or (maxb > 0 and total > maxb)) do
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 1)
  local id = oldest[1]
  if id == ARGV[1] then id = oldest[2] end
  total = total - tonumber(redis.call('HGET', KEYS[2], id) or '0')
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  count = count - 1
  dropped[#dropped + 1] = id
end
redis.call('PEXPIRE', KEYS[1], ARGV[7])
redis.call('PEXPIRE', KEYS[2], ARGV[7])
return dropped
`)

// indexLetter indexes letter d (size bytes) and deletes the client's
// oldest letters it puts over the bound, returning their ids.
func (r *Store) indexLetter(ctx context.Context, d *cache.DeadLetter, size int64, ttl time.Duration) ([]string, error) {
	index, sizes := r.letterIndexKeys(d.Client)
	b := r.bound
	prune := r.now().Add(-ttl).UnixMilli()
	res, err := indexLetterScript.Run(ctx, r.client, []string{index, sizes}, d.ID, d.LastAt.UnixMilli(), size,
		b.MaxCount, b.MaxBytes, prune, pxMillis(ttl)).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("index dead letter: %w", r.mapErr(err))
	}
	if len(res) == 0 {
		return nil, nil
	}
	keys := make([]string, len(res))
	for i, id := range res {
		keys[i] = r.deadLetterKey(id)
	}
	if _, err := pipelined(ctx, r.client, keys, func(p redis.Pipeliner, key string) *redis.IntCmd { return p.Del(ctx, key) }); err != nil {
		return res, fmt.Errorf("delete the dead letters over the bound: %w", r.mapErr(err))
	}
	return res, nil
}

// unindexLetter removes letter id from client's index.
func (r *Store) unindexLetter(ctx context.Context, client, id string) error {
	index, sizes := r.letterIndexKeys(client)
	_, err := r.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, index, id)
		p.HDel(ctx, sizes, id)
		return nil
	})
	return r.mapErr(err)
}

// dropLetterIndex deletes client's index (PurgeScope).
func (r *Store) dropLetterIndex(ctx context.Context, client string) error {
	index, sizes := r.letterIndexKeys(client)
	return r.mapErr(r.client.Unlink(ctx, index, sizes).Err())
}
