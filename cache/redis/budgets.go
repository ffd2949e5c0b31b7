package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmgate/llmgate/cache"
)

// redisBudgetNS starts the key of a budget counter, one hash per client
// and counter (a budget in one window):
//
//	P b:{<scope>}:<counter>   hash: s (spent), h (held), r:<id> per live reservation
//
// The hash tag is the client's scope alone, so every counter of a client
// is in one Cluster slot and one script reserves on all of them at once.
// A reservation field's value is "<amount>:<expires ms>"; once expired it
// is purged lazily (only when a reservation would not fit otherwise), its
// amount leaving h, and a tombstone "x:<until ms>" is left in its place
// so that its settlement, if it ever comes, still charges, exactly once.
// PEXPIRE drops the hash after its window (BudgetLine.Until, on the
// store's clock: the time left until then).
const redisBudgetNS = "b:"

func (r *Store) budgetKey(scope, counter string) string {
	var b strings.Builder
	b.Grow(len(r.prefix) + len(scope) + len(counter) + 8)
	b.WriteString(r.prefix)
	b.WriteString(redisBudgetNS)
	b.WriteByte('{')
	escapePart(&b, scope)
	b.WriteString("}:")
	escapePart(&b, counter)
	return b.String()
}

// luaBudgetRelease takes amt (a string of digits) off h: HINCRBY
// refuses "-0", and a script that errors keeps what it wrote before it,
// so a reservation of 0 is skipped rather than sent. charge adds amt to
// s, saturating at 2^63-1 as cache.AddCapped does: HINCRBY refuses to
// overflow, which would stop the script part way. (In doubles, a sum
// within 512 of 2^63 rounds to it: those saturate too.)
const luaBudgetRelease = `
local function release(k, amt)
  if tonumber(amt) ~= 0 then redis.call('HINCRBY', k, 'h', '-' .. amt) end
end
local function charge(k, amt)
  if tonumber(redis.call('HGET', k, 's') or '0') + tonumber(amt) >= 9223372036854775807 then
    redis.call('HSET', k, 's', '9223372036854775807')
  else
    redis.call('HINCRBY', k, 's', amt)
  end
end
`

// Integers travel as strings and are added with HINCRBY (64-bit, exact);
// only the comparison with the limit is done in Lua numbers (doubles),
// exact up to 2^53 — 9·10^9 currency units in micro-units.
const luaBudgetPurge = luaBudgetRelease + `
local function purge(k, now, keep)
  local all = redis.call('HGETALL', k)
  for j = 1, #all, 2 do
    local f, v = all[j], all[j + 1]
    if string.sub(f, 1, 2) == 'r:' then
      local amt, exp = string.match(v, '^(%d+):(%d+)$')
      if amt and tonumber(exp) <= now then
        release(k, amt)
        redis.call('HSET', k, f, 'x:' .. keep)
      else
        local tomb = string.match(v, '^x:(%d+)$')
        if tomb and tonumber(tomb) <= now then redis.call('HDEL', k, f) end
      end
    end
  end
end
local function fits(k, lim, amt)
  local v = redis.call('HMGET', k, 's', 'h')
  return tonumber(v[1] or '0') + tonumber(v[2] or '0') + tonumber(amt) <= tonumber(lim)
end
`

// reserveBudgetScript: KEYS the counters; ARGV id, now ms, reservation
// expires ms, tombstone until ms, then per key: limit, amount, PX ms. Returns 0 when reserved (or already held by id: a resent script),
// else the 1-based index of the first counter it does not fit.
var reserveBudgetScript = redis.NewScript("#!lua\n" + luaBudgetPurge + `
local id, now, exp, keep = 'r:' .. ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
for i = 1, #KEYS do
  if redis.call('HEXISTS', KEYS[i], id) == 1 then return 0 end
  local lim, amt = ARGV[5 + 3 * (i - 1)], ARGV[6 + 3 * (i - 1)]
  if not fits(KEYS[i], lim, amt) then
    purge(KEYS[i], now, keep)
    if not fits(KEYS[i], lim, amt) then return i end
  end
end
for i = 1, #KEYS do
  local amt, at = ARGV[6 + 3 * (i - 1)], ARGV[7 + 3 * (i - 1)]
  redis.call('HINCRBY', KEYS[i], 'h', amt)
  redis.call('HSET', KEYS[i], id, amt .. ':' .. exp)
  redis.call('PEXPIRE', KEYS[i], at)
end
return 0
`)

// settleBudgetScript: KEYS the counters; ARGV id, then per key: amount
// charged, PX ms. A live reservation leaves h; a tombstone (it
// expired) is dropped; either way the amount is charged. A counter with
// neither was settled already (a resent script): nothing changes.
var settleBudgetScript = redis.NewScript(luaBudgetRelease + `
local id = 'r:' .. ARGV[1]
for i = 1, #KEYS do
  local v = redis.call('HGET', KEYS[i], id)
  local amt, at = ARGV[2 + 2 * (i - 1)], ARGV[3 + 2 * (i - 1)]
  if v then
    local held = string.match(v, '^(%d+):')
    if held then release(KEYS[i], held) end
    redis.call('HDEL', KEYS[i], id)
    charge(KEYS[i], amt)
    redis.call('PEXPIRE', KEYS[i], at)
  end
end
return 0
`)

// ReserveBudget takes h on every counter it names, or on none, in one
// script (see reserveBudgetScript): refused is the 1-based index of the
// first line whose limit it would pass, 0 when taken. Atomic across
// replicas.
func (r *Store) ReserveBudget(ctx context.Context, scope string, h cache.BudgetHold) (refused int, err error) {
	if err := cache.ValidateBudget(scope, h.ID, h.Lines); err != nil {
		return 0, fmt.Errorf("reserve budget: %w", err)
	}
	if err := r.begin(ctx); err != nil {
		return 0, fmt.Errorf("reserve budget: %w", err)
	}
	now := r.now()
	keys := make([]string, len(h.Lines))
	args := []any{h.ID, now.UnixMilli(), now.Add(h.TTL).UnixMilli(), now.Add(2 * h.TTL).UnixMilli()}
	for i, l := range h.Lines {
		keys[i] = r.budgetKey(scope, l.Counter)
		args = append(args, strconv.FormatInt(l.Limit, 10), strconv.FormatInt(l.Amount, 10), pxUntil(now, l.Until))
	}
	n, err := reserveBudgetScript.Run(ctx, r.client, keys, args...).Int()
	if err != nil {
		return 0, fmt.Errorf("reserve budget: %w", r.mapErr(err))
	}
	return n, nil
}

// SettleBudget replaces the reservation id by what its run was charged
// (see settleBudgetScript), in one script.
func (r *Store) SettleBudget(ctx context.Context, scope, id string, lines []cache.BudgetLine) error {
	if err := cache.ValidateBudget(scope, id, lines); err != nil {
		return fmt.Errorf("settle budget: %w", err)
	}
	if err := r.begin(ctx); err != nil {
		return fmt.Errorf("settle budget: %w", err)
	}
	keys := make([]string, len(lines))
	args := []any{id}
	now := r.now()
	for i, l := range lines {
		keys[i] = r.budgetKey(scope, l.Counter)
		args = append(args, strconv.FormatInt(l.Amount, 10), pxUntil(now, l.Until))
	}
	if err := settleBudgetScript.Run(ctx, r.client, keys, args...).Err(); err != nil {
		return fmt.Errorf("settle budget: %w", r.mapErr(err))
	}
	return nil
}

// ReadBudgets reads counters of scope; one never written reads as zero.
// Held may still include reservations that expired and were not purged
// yet (purging is a write, done when a reservation needs the room).
func (r *Store) ReadBudgets(ctx context.Context, scope string, counters []string) ([]cache.BudgetCount, error) {
	if err := r.begin(ctx); err != nil {
		return nil, fmt.Errorf("read budgets: %w", err)
	}
	cmds := make([]*redis.SliceCmd, len(counters))
	_, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range counters {
			cmds[i] = p.HMGet(ctx, r.budgetKey(scope, c), "s", "h")
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read budgets: %w", r.mapErr(err))
	}
	out := make([]cache.BudgetCount, len(counters))
	for i, cmd := range cmds {
		v := cmd.Val()
		out[i].Spent, out[i].Held = hashInt(v, 0), hashInt(v, 1)
	}
	return out, nil
}

// pxUntil is the PX of a key that lives until until, now being the
// store's clock: at least 1 ms.
func pxUntil(now, until time.Time) int64 {
	return max(until.Sub(now).Milliseconds(), 1)
}

// hashInt is the integer in an HMGET reply's field i, 0 when absent.
func hashInt(v []any, i int) int64 {
	if i >= len(v) {
		return 0
	}
	s, _ := v[i].(string)
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}
