package badgerstore

import (
	"context"
	"errors"
	"hash/maphash"
	"log/slog"
	"math/bits"
	"sync/atomic"

	"github.com/dgraph-io/badger/v4"

	"github.com/llmgate/llmgate/cache"
)

// The key filter spares a keyed request's Claim (and a Get) the Badger
// read of its committed record when the key was never committed, which
// is almost every keyed request: a read-only transaction costs 6–13 µs of
// CPU at 16 clients (its read timestamp waits on Badger's watermark, and
// its begin and end are channel sends to the watermark's goroutine).
//
// It is a Bloom filter of the storage keys of the records in Badger: "no"
// is certain, "maybe" costs the read. A committed key must never be
// reported absent (a second, different answer would overwrite it), so it
// holds, at every moment, every record key Badger could return:
//
//   - Commit, the one writer of record keys (see keys.go: no purge,
//     restore or import writes one), adds its key under the key's shard lock before
//     its write (noteCommit), and Claim and Get ask under that lock, so a
//     check after a Commit's write sees its add;
//   - whenever s.db becomes a database with other contents — Open,
//     reopenReadWrite, the stand-in after a failed cycle — loadFilter
//     builds the filter from a key-only scan of it, with every operation
//     held off (s.mu); cycle's successful reopen of the same directory
//     keeps the same records, and the filter;
//   - a growing filter is rebuilt while commits go on (rebuildFilter,
//     which proves that none is missed).
//
// In memory (Options.InMemory) it is the same: the database starts empty
// and only Commit adds records to it.
//
// Deletes, purges and expiries leave their keys in the filter (false
// positives, a read each) until the next build drops them.
//
// Memory: 10 bits (1.25 bytes) per key of capacity, sized for twice the
// records found when built and at least 64Ki keys (80 KiB), at most 8 MiB
// (6.7M keys, past which the false-positive rate rises from ~1%); during
// a rebuild the old and the new filter are both held.
type keyFilter struct {
	seed maphash.Seed
	// cur answers the checks; nil (a build failed) answers "maybe" to all.
	cur atomic.Pointer[bloom]
	// next is the filter being rebuilt, which Commit adds to as well.
	next atomic.Pointer[bloom]
	// kick asks runFilter to rebuild; rebuilt is sent to, if anyone
	// listens, after each rebuild, holding one (tests).
	kick    chan struct{}
	rebuilt chan struct{}
}

const (
	filterBitsPerKey = 10
	filterProbes     = 7 // bits set per key, near-optimal for 10 bits
	filterMinKeys    = 64 << 10
	filterMaxBytes   = 8 << 20
	// A block is one 64-byte cache line: a key's probes all fall in one,
	// so a check costs one cache miss, not seven.
	blockWords = 8
	blockBits  = blockWords * 64
)

func newKeyFilter() *keyFilter {
	return &keyFilter{seed: maphash.MakeSeed(), kick: make(chan struct{}, 1), rebuilt: make(chan struct{}, 1)}
}

func (f *keyFilter) hash(key []byte) uint64 { return maphash.Bytes(f.seed, key) }

// mayHave reports whether key may be committed: false is certain. The
// caller holds key's shard lock.
func (f *keyFilter) mayHave(key []byte) bool {
	b := f.cur.Load()
	return b == nil || b.has(f.hash(key))
}

// noteCommit adds key to the filter (and to the one being rebuilt), before
// Commit writes it; the caller holds key's shard lock. Once the filter
// holds more keys than it was sized for, a rebuild is asked for.
func (f *keyFilter) noteCommit(key []byte) {
	h := f.hash(key)
	if next := f.next.Load(); next != nil {
		next.add(h)
	}
	if b := f.cur.Load(); b != nil && b.add(h) >= b.rebuildAt {
		select {
		case f.kick <- struct{}{}:
		default: // asked already
		}
	}
}

// bloom is a blocked Bloom filter over 64-bit key hashes. Its bits are
// atomic because adds and checks run under different shard locks.
type bloom struct {
	bits   []atomic.Uint64 // blocks of blockWords words
	blocks uint64
	// added counts the keys added; at rebuildAt the filter is rebuilt:
	// its capacity, or, when that is capped, twice the keys it was built
	// with, so that a capped filter is not rebuilt on every commit.
	added     atomic.Int64
	rebuildAt int64
}

// newBloom sizes a filter for twice keys (see keyFilter).
func newBloom(keys int64) *bloom {
	capacity := max(2*keys, filterMinKeys)
	blocks := (capacity*filterBitsPerKey + blockBits - 1) / blockBits
	blocks = min(blocks, filterMaxBytes/(blockWords*8))
	capacity = min(capacity, blocks*blockBits/filterBitsPerKey)
	return &bloom{bits: make([]atomic.Uint64, blocks*blockWords), blocks: uint64(blocks),
		rebuildAt: max(capacity, 2*keys+1)}
}

// probes calls fn with the word and bit of each of h's probes, until fn
// returns false: the block from h's high bits (h × blocks / 2⁶⁴), the bits
// in it from 9-bit slices of h remixed (so that they do not repeat the
// block's bits).
func (b *bloom) probes(h uint64, fn func(w *atomic.Uint64, bit uint64) bool) bool {
	block, _ := bits.Mul64(h, b.blocks)
	words := b.bits[block*blockWords : (block+1)*blockWords]
	g := mix64(h)
	for range filterProbes {
		i := g % blockBits
		if !fn(&words[i/64], 1<<(i%64)) {
			return false
		}
		g /= blockBits
	}
	return true
}

// add adds h and returns the keys added so far.
func (b *bloom) add(h uint64) int64 {
	b.probes(h, func(w *atomic.Uint64, bit uint64) bool { w.Or(bit); return true })
	return b.added.Add(1)
}

func (b *bloom) has(h uint64) bool {
	return b.probes(h, func(w *atomic.Uint64, bit uint64) bool { return w.Load()&bit != 0 })
}

// mix64 is SplitMix64's finalizer: every output bit depends on every
// input bit.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// loadFilter builds the filter from s.db. The caller holds every
// operation off (Open, or s.mu held exclusively), so no Commit runs. If
// the scan fails the filter is off: every check reads Badger.
func (s *Store) loadFilter() error {
	s.filter.next.Store(nil)
	b, err := s.scanFilter()
	s.filter.cur.Store(b) // nil on error
	return err
}

// scanFilter returns a filter sized for the record keys in Badger and
// filled with them (two key-only scans: no value is read).
func (s *Store) scanFilter() (*bloom, error) {
	b, err := s.sizeFilter()
	if err != nil {
		return nil, err
	}
	if err := s.fillFilter(b); err != nil {
		return nil, err
	}
	return b, nil
}

// sizeFilter counts the record keys and returns an empty filter for them.
func (s *Store) sizeFilter() (*bloom, error) {
	var n int64
	if err := s.eachKey(recordKeyPrefix, func(*badger.Item) { n++ }); err != nil {
		return nil, err
	}
	return newBloom(n), nil
}

func (s *Store) fillFilter(b *bloom) error {
	return s.eachKey(recordKeyPrefix, func(item *badger.Item) { b.add(s.filter.hash(item.Key())) })
}

// runFilter rebuilds the filter when noteCommit asks; Open counted it in
// s.bg.
func (s *Store) runFilter() {
	defer s.bg.Done()
	for {
		select {
		case <-s.done:
			return
		case <-s.filter.kick:
		}
		if err := s.rebuildFilter(); err != nil && !errors.Is(err, cache.ErrClosed) {
			s.log.Warn("rebuilding the key filter; the old one stays", slog.Any("err", err))
		}
		select {
		case s.filter.rebuilt <- struct{}{}:
		default:
		}
	}
}

// rebuildFilter replaces the filter with one sized for the records in
// Badger now, while commits go on, without a moment at which a committed
// key is missing from the filter that answers:
//
//  1. With every shard lock held, next is installed. A Commit adds to the
//     filters and writes under its shard lock, so none is between its add
//     and its write now: each Commit either wrote before this step, or
//     adds to next after it.
//  2. The key scan into next begins after step 1, so its snapshot holds
//     every record written before step 1 (a Badger read's timestamp waits
//     for every transaction that committed before it began). With the
//     adds Commits make after step 1, next holds every record key
//     written since, too.
//  3. With every shard lock held again, next replaces cur. Until then cur
//     answers, and Commit adds to it as before; no Commit is between its
//     two adds now, so none added to the old filter only.
//
// A record deleted or expired before the scan is not in next: Badger no
// longer returns it, so the read it saves would have found nothing. The
// caller holds no shard lock; s.mu is held shared throughout, so s.db is
// not swapped (loadFilter) meanwhile.
//
// Each lockAll waits for the Commits in progress (tens of µs, or a
// value-log GC round's ~50 ms, which holds writes), and the claims of the
// shards it has taken wait with it: twice per rebuild, which comes after
// at least as many commits as there were records at the last one.
func (s *Store) rebuildFilter() error {
	unlock, err := s.begin(context.Background())
	if err != nil {
		return err
	}
	defer unlock()
	next, err := s.sizeFilter()
	if err != nil {
		return mapClosed(err)
	}
	s.flights.lockAll()
	s.filter.next.Store(next)
	s.flights.unlockAll()

	err = s.fillFilter(next)

	s.flights.lockAll()
	if err == nil {
		s.filter.cur.Store(next)
	}
	s.filter.next.Store(nil)
	s.flights.unlockAll()
	return mapClosed(err)
}

// lockAll and unlockAll lock and unlock every shard, in order.
func (f *flights) lockAll() {
	for i := range f.shards {
		f.shards[i].mu.Lock()
	}
}

func (f *flights) unlockAll() {
	for i := range f.shards {
		f.shards[i].mu.Unlock()
	}
}
