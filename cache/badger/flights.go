package badgerstore

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmgate/llmgate/cache"
)

// flights is the Badger store's table of in-flight records, kept in memory
// only. An in-flight record need not survive the process: Badger's
// directory lock admits one process at a time, so a record left by a dead
// process would be claimable at once anyway. Keeping them here saves a disk
// write per Claim, Renew and Release, and makes Commit the only write of a
// keyed request.
//
// The table is split into shards, each a mutex and a map. A shard's mutex
// is also the lock of its keys in Badger: Claim holds it across the read of
// the committed record and the insert here, Commit across the write to
// Badger and the removal here, so that a key is never seen absent in both
// places while it changes from one to the other. Dead letters use the same
// locks for their read-modify-write.
type flights struct {
	seed   maphash.Seed
	shards [flightShards]flightShard
	n      atomic.Int64 // records in the table, for Stats
}

// flightShards bounds how often two keys share a lock; Commit holds one
// across a Badger write (tens of microseconds).
const flightShards = 64

type flightShard struct {
	mu sync.Mutex
	m  map[string]*cache.Record // by storage key
	_  [48]byte                 // one shard per 64-byte cache line
}

func newFlights() *flights {
	f := &flights{seed: maphash.MakeSeed()}
	for i := range f.shards {
		f.shards[i].m = make(map[string]*cache.Record)
	}
	return f
}

// lock locks key's shard and returns it; the caller unlocks sh.mu.
func (f *flights) lock(key []byte) *flightShard {
	sh := &f.shards[maphash.Bytes(f.seed, key)%flightShards]
	sh.mu.Lock()
	return sh
}

// put and del keep the count; the caller holds sh.mu.
func (f *flights) put(sh *flightShard, key []byte, r *cache.Record) {
	if _, ok := sh.m[string(key)]; !ok {
		f.n.Add(1)
	}
	sh.m[string(key)] = r
}

func (f *flights) del(sh *flightShard, key []byte) bool {
	if _, ok := sh.m[string(key)]; !ok {
		return false
	}
	delete(sh.m, string(key))
	f.n.Add(-1)
	return true
}

// sweep removes the records whose lease ran out more than grace before now
// — orphans of a request that neither committed nor released (a Release
// that failed, a panic) — and returns their keys, whose waiters the caller
// wakes. Until then a lapsed lease can still be renewed by its owner or
// taken over by a claimant.
func (f *flights) sweep(now time.Time, grace time.Duration) []string {
	var gone []string
	for i := range f.shards {
		sh := &f.shards[i]
		sh.mu.Lock()
		for k, r := range sh.m {
			if !now.Before(r.LeaseUntil.Add(grace)) {
				delete(sh.m, k)
				f.n.Add(-1)
				gone = append(gone, k)
			}
		}
		sh.mu.Unlock()
	}
	return gone
}
