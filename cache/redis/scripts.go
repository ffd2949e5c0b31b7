package redisstore

import (
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// The record hash (KEYS[1] of every script below) has these fields:
//
//	state   "1" in flight, "2" committed (the values of State)
//	fp      the fingerprint of the claim
//	owner   in flight: the owner token; committed: the token that committed it
//	lease   in flight: lease until, store clock, "<unix seconds>.<9-digit nanoseconds>"
//	exp     committed: ExpiresAt, store clock, same format
//	commit  committed: the nonce of the Commit call that wrote it
//	size    committed: the record's StoredSize, for ScanCommitted
//	data    the record as codec.EncodeRecord writes it: the same bytes
//	        Badger stores, and what Go decodes; the other fields are copies
//	        of what the scripts must compare
//
// Times are compared exactly, as (seconds, nanoseconds): a Unix time in
// nanoseconds does not fit a Lua number (a double) exactly.
//
// Every script here touches KEYS[1] only; PUBLISH names a channel, not a
// key. (indexLetterScript, in letters.go, touches a client's two index
// keys, of one hash tag.)
// Scripts run with EVALSHA, falling back to EVAL (go-redis's Script.Run).

const luaBefore = `
local function before(a, b)
  local as, an = string.match(a, '^(%d+)%.(%d+)$')
  local bs, bn = string.match(b, '^(%d+)%.(%d+)$')
  as, an, bs, bn = tonumber(as), tonumber(an), tonumber(bs), tonumber(bn)
  return as < bs or (as == bs and an < bn)
end
`

// claimScript: ARGV fingerprint, now, owner (fresh, random), lease until,
// data (the new in-flight record), PX (lease + grace, ms).
// Returns {0} claimed, {1, data} busy, {2, data} done, {3, data} mismatch.
//
// A committed record whose exp has passed by the store's clock counts as
// absent (Redis's own PX runs on real time). An in-flight record whose owner
// is this very call's token is a go-redis retry of a call whose reply was
// lost: it is ours, so {0}.
//
// The #!lua shebang (Redis 7) makes Redis refuse the script with an OOM
// error while it is over maxmemory: without it, a script whose first write
// is DEL (which Redis allows when out of memory) may go on writing, so a
// full Redis took new claims. Commits of calls already running keep the
// old rule and still land.
var claimScript = redis.NewScript("#!lua\n" + luaBefore + `
local cur = redis.call('HMGET', KEYS[1], 'state', 'fp', 'owner', 'lease', 'exp', 'data')
local st = cur[1]
if st == '2' and cur[5] and not before(ARGV[2], cur[5]) then
  st = false
end
if st == '1' or st == '2' then
  if st == '1' and cur[3] == ARGV[3] then return {0} end
  if cur[2] ~= ARGV[1] then return {3, cur[6]} end
  if st == '2' then return {2, cur[6]} end
  if before(ARGV[2], cur[4]) then return {1, cur[6]} end
elseif st then
  return redis.error_reply('llmgate: record in unknown state ' .. st)
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'state', '1', 'fp', ARGV[1], 'owner', ARGV[3], 'lease', ARGV[4], 'data', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return {0}
`)

// renewScript: ARGV owner, lease until, data (the record with the new
// lease), PX. Returns 1, or 0 when not in flight under owner.
var renewScript = redis.NewScript(`
local cur = redis.call('HMGET', KEYS[1], 'state', 'owner')
if cur[1] ~= '1' or cur[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'lease', ARGV[2], 'data', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
`)

// commitScript: ARGV owner, fingerprint (the one data was encoded with),
// data (the committed record), exp, PX (ttl), wake channel, nonce (fresh,
// random), size (the record's StoredSize). Returns 1, or 0 when not in flight under owner with that
// fingerprint. A committed record carrying this call's nonce is a go-redis
// retry of this call: 1 again, without a second PUBLISH; it sets the
// expiry again (a write), so that a WAIT after the retry, on the retry's
// connection, waits for the replicas to have the record (WAIT counts the
// writes of its own connection only). A second Commit call (another nonce)
// gets 0, as with Badger.
var commitScript = redis.NewScript(`
local cur = redis.call('HMGET', KEYS[1], 'state', 'owner', 'fp', 'commit')
if cur[1] == '2' and cur[2] == ARGV[1] and cur[4] == ARGV[7] then
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return 1
end
if cur[1] ~= '1' or cur[2] ~= ARGV[1] or cur[3] ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'state', '2', 'fp', ARGV[2], 'owner', ARGV[1], 'exp', ARGV[4], 'commit', ARGV[7], 'size', ARGV[8], 'data', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('PUBLISH', ARGV[6], 'commit')
return 1
`)

// releaseScript: ARGV owner, wake channel. Deletes the record and returns 1,
// or 0 when not in flight under owner.
var releaseScript = redis.NewScript(`
local cur = redis.call('HMGET', KEYS[1], 'state', 'owner')
if cur[1] ~= '1' or cur[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], 'release')
return 1
`)

// deleteScript: ARGV wake channel. Deletes the record whatever its state
// (it is not decoded, so an admin can delete one this release cannot read)
// and returns 1, or 0 when absent.
var deleteScript = redis.NewScript(`
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
redis.call('PUBLISH', ARGV[1], 'delete')
return 1
`)

// breakerScript: KEYS[1] the breakers hash; ARGV upstream, "1" (force open)
// or "0" (clear), channel. Sets or clears the override and publishes
// ARGV[2]..ARGV[1] in one step, so no replica sees one without the other.
var breakerScript = redis.NewScript(`
if ARGV[2] == '1' then
  redis.call('HSET', KEYS[1], ARGV[1], 'open')
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', ARGV[3], ARGV[2] .. ARGV[1])
return 1
`)

// luaTime formats t for the scripts' exact comparisons. The store clock is
// after 1970, so both parts are non-negative.
func luaTime(t time.Time) string {
	return fmt.Sprintf("%d.%09d", t.Unix(), t.Nanosecond())
}

// pxMillis is d in whole milliseconds, rounded up so that Redis never drops
// a record before the store's own clock says it expired; at least 1.
func pxMillis(d time.Duration) int64 {
	return max(int64((d+time.Millisecond-1)/time.Millisecond), 1)
}
