// Package badgerstore is the embedded idempotency store of package cache:
// one Badger database in one directory, owned by one gateway process.
// Committed records and dead letters are in Badger, in-flight records in
// memory (see flights), so a keyed request writes once, at Commit. It
// passes cache/storetest. Its import path is .../cache/badger; the package
// is named badgerstore so that it does not shadow Badger's own package.
package badgerstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/internal/codec"
	"github.com/llmgate/llmgate/cache/internal/waiters"
)

// Options configures Open. The zero value is not usable only because Dir
// (or InMemory) must be set.
type Options struct {
	// Dir holds the database. Required unless InMemory. Only one process may
	// open it at a time.
	Dir string
	// InMemory keeps everything in memory, for tests and benchmarks. Dir is
	// ignored. Records are limited to 1 MiB encoded.
	InMemory bool
	// SyncWrites fsyncs each commit, for power-loss safety. Default false: a
	// process crash loses nothing either way, because Badger has written the
	// commit to its write-ahead log (an mmap of the file) before returning.
	SyncWrites bool
	// GCInterval is the period of value-log garbage collection. If <= 0, 10m.
	GCInterval time.Duration
	// WritebackInterval is how often the finished part of the value-log
	// file being written is given to the kernel to write back (see
	// writeback). If <= 0, never; the gateway's store.writeback_interval
	// defaults to 100ms.
	WritebackInterval time.Duration
	// Now is the clock for leases, CreatedAt and ExpiresAt. If nil, time.Now.
	Now func() time.Time
	// After is the timer Wait uses to wake when a lease runs out. If nil,
	// time.After.
	After func(time.Duration) <-chan time.Time
	// MemoryBudget is the Go heap Badger's memtables, table builders and
	// index cache are sized to (see sizing). If <= 0,
	// DefaultMemoryBudget (64 MiB).
	MemoryBudget int64
	// Logger receives Badger's own warnings and errors and the GC's. If nil,
	// they are discarded.
	Logger *slog.Logger

	// MaxBytes caps what the store's live entries take (see live.go): at
	// it, Space reports Full and the gateway refuses new keyed requests,
	// and a dead letter that would pass it is refused. A purge or an
	// expiry gives the cap back within a SpaceInterval; the files shrink
	// later, as runGC reclaims them. If <= 0, there is no cap.
	MaxBytes int64
	// MinFreeBytes is the free-space floor of the filesystem holding Dir
	// (see space.go): below it, Space reports Full, and Open opens Badger
	// read-only. If <= 0, it is derived from Badger's options
	// (DefaultMinFreeBytes: 85 MiB at the default memory budget).
	MinFreeBytes int64
	// Statfs reports the free bytes of the filesystem holding a directory.
	// If nil, statfs(2).
	Statfs func(dir string) (uint64, error)
	// SpaceInterval is how often the store measures its room and, when
	// read-only, tries to reopen read-write. If <= 0, 1s.
	SpaceInterval time.Duration
	// DeadLetters bounds each client's dead letters (see
	// cache.DeadLetterBound). The zero value bounds nothing.
	DeadLetters cache.DeadLetterBound
}

// Store is the embedded idempotency store, one Badger database in one
// directory. It is safe for concurrent use.
type Store struct {
	db    *badger.DB
	dir   string // "" in memory
	now   func() time.Time
	after func(time.Duration) <-chan time.Time
	log   *slog.Logger

	// ownerPrefix starts every owner token this Open hands out, so tokens
	// are unique across restarts too.
	ownerPrefix string
	ownerSeq    atomic.Uint64

	// flights holds the in-flight records (in memory only) and the per-key
	// locks; Badger holds committed records and dead letters.
	flights *flights
	// commits writes concurrent Commits in one transaction (group.go).
	commits commitGroup
	// filter says which keys may be committed, so that a new key's Claim
	// reads nothing (filter.go).
	filter *keyFilter
	// dead holds the id of every dead letter in Badger, with its Badger
	// expiry (Unix seconds, 0 = none), so that resolving the dead letter of
	// a key that has none — every successful keyed request does — reads
	// nothing. It is exact because one process owns the directory: filled
	// at Open, added to before a write and removed from after a delete
	// under the key's lock, and pruned of expired ids by the sweep. It may
	// name a dead letter that is gone, never miss one that is there.
	deadMu sync.Mutex
	dead   map[string]uint64
	// letters indexes the dead letters by client, for bound.
	letters *letters
	bound   cache.DeadLetterBound
	// live is what the live entries take, which MaxBytes caps (live.go).
	live live

	waiters waiters.Broadcast

	// budgetMu serialises the budget counters' read-modify-writes.
	budgetMu sync.Mutex

	// mu is held shared by every operation on db and exclusively by Close, so
	// Close waits for operations in progress and none starts after it.
	mu sync.RWMutex
	// runlock is mu.RUnlock as begin returns it, made once: a method value
	// made per operation is an allocation per operation.
	runlock   func()
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
	done      chan struct{} // closed by Close: stops the background goroutines
	bg        sync.WaitGroup

	statsMu sync.Mutex
	stats   cache.Stats
	// reads counts loadCommitted's Badger reads (tests).
	reads atomic.Int64

	// space is the store's room on disk (space.go); nil in memory.
	space *space
	// reclaimKick asks runGC to reclaim now, flattening first (a purge
	// deleted much); reclaimed is sent to, if anyone listens, after each
	// round, holding one (tests).
	reclaimKick chan struct{}
	reclaimed   chan struct{}
	// gcMu is held shared by every write and exclusively by a value-log
	// GC round: Badger's GC reads the memtable's highest version
	// (DB.MaxVersion) unsynchronized with its writer goroutine (v4.9.6,
	// memTable.Put), a data race while writes go on. Writes wait for the
	// round (one value-log file rewritten, ~50 ms for 16 MiB); reads do
	// not.
	gcMu sync.RWMutex
}

// Sizing for a sidecar, not a database (Badger's defaults take hundreds of
// MiB). Measured on linux/amd64, Go 1.26, from /proc/self/status after
// runtime.GC and debug.FreeOSMemory, over a 10.5 MiB test-binary baseline:
//
//   - opened, idle: +2 MiB (+1 anonymous); reopened over 20,000 1 KiB and
//     200 200 KiB records: +10 MiB, almost all clean file pages of the last
//     value-log file, which Badger reads through on open;
//   - just after writing those records (when claims were written too):
//     +35 MiB anonymous (memtable arena, pooled table-builder buffers that
//     Badger frees one per 2 s idle; +14 MiB after 25 s) and up to ~70 MiB of
//     page cache for the mmapped files, which the kernel reclaims under
//     pressure.
//
// Only committed records and dead letters are written (in-flight records
// live in memory, see flights), so a keyed request costs one write and the
// memtables fill, flush and compact half as often as when claims were
// written too. After 30,000 keyed requests of 1 KiB through the gateway the
// Go heap holds ~41 MB (was ~48): ~29 MB of table-builder buffers from
// flushes and compactions, which Badger pools (up to 8, each at least twice
// its table's size) and frees one per 2 s idle, and ~10 MB of memtable
// arena. Smaller tables shrink the pool but cost compaction CPU: with
// BaseTableSize 1 MiB and MemTableSize 4 MiB a 60,000-record burst under
// random keys left ~56 MiB of heap instead of ~105 and took ~50% more CPU,
// so the values below stay.
//
// Each value:
//
//   - MemTableSize, NumMemtables, BaseTableSize, TableSizeMultiplier,
//     IndexCacheSize, NumCompactors: sized from Options.MemoryBudget, see
//     sizing (budget.go). Badger caps one write batch at 15% of
//     MemTableSize (600 KiB at the default budget), fine because a body
//     above ValueThreshold goes to the value log and counts only as a
//     pointer.
//   - ValueThreshold 256 bytes: a record's body goes to the value log and
//     the LSM tree holds only its key and a pointer. Records are written
//     compressed where that pays (cache/internal/codec, version 2), so a
//     1 KiB completion or a 20-event stream is stored in 400–900 bytes; at
//     1 KiB they fell back into the tree, and keyed JSON cost more CPU per
//     request than before compression. With 64 KiB (4 KiB
//     completions inside the tree), every flush and compaction copied the
//     bodies: at 16 clients of new keys, keyed p99 was 7.6× unkeyed (Commit
//     and Claim queued behind Badger's watermark while flushes ran) and
//     peak anonymous RSS 266 MiB (table builders sized by the values). With
//     1 KiB: keyed p99 1.26× unkeyed, peak anonymous RSS 31 MiB,
//     Claim+Commit p99 11–29 ms instead of 91–218 ms in
//     BenchmarkKeyedParallel. The cost: expired bodies are reclaimed by
//     value-log GC (runGC, every GCInterval, rewriting files that are half
//     garbage) rather than by compaction, so the data dir runs larger
//     between GC runs; store.max_bytes and the free-space floor count the
//     value log.
//   - ValueLogFileSize 16 MiB: Badger reads the last value-log file through on
//     open, so its size is resident after a restart (64 MiB files: +43 MiB
//     instead of +10); smaller files also make GC rewrites cheaper. It caps
//     one record at 16 MiB, far above any completion.
//   - NumLevelZeroTables 2, stall at 8: flush L0 early, so few tables are
//     open and their indexes in memory.
//   - BlockCacheSize 0 with Compression None: without compression or
//     encryption Badger reads blocks straight from the mmap and needs no
//     cache; the page cache does the job. Compression is off because records
//     are short-lived and CPU on the request path is worth more than disk.
//   - MetricsEnabled false: Stats measures the directory itself.
const (
	valueThreshold     = 1 << 8
	numLevelZero       = 2
	numLevelZeroStall  = 8
	valueLogFileSize   = 16 << 20
	defaultGCInterval  = 10 * time.Minute
	gcDiscardRatio     = 0.5
	statsMaxAge        = 5 * time.Second
	maxConflictRetries = 100
	// inFlightGrace is how long an in-flight record outlives its lease in
	// memory before the sweep drops it. A claimant takes over an expired
	// lease long before that, and until then its owner may still renew it;
	// the sweep only makes sure an orphan nobody claims again disappears.
	inFlightGrace = time.Minute
)

// ErrLocked: the store's directory is held by another process.
var ErrLocked = errors.New("another gateway process is using this directory")

// Open opens (or creates) the store. When another process holds the
// directory the error wraps ErrLocked.
func Open(o Options) (*Store, error) {
	if !o.InMemory && o.Dir == "" {
		return nil, errors.New("open badger store: Options.Dir is required unless InMemory")
	}
	s := &Store{
		now:   o.Now,
		after: o.After,
		log:   o.Logger,
		done:  make(chan struct{}),

		reclaimKick: make(chan struct{}, 1),
		reclaimed:   make(chan struct{}, 1),
	}
	s.runlock = s.mu.RUnlock
	if s.now == nil {
		s.now = time.Now
	}
	if s.after == nil {
		s.after = time.After
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}

	bo := badgerOptions(o)
	if !o.InMemory {
		s.dir = o.Dir
		s.space = newSpace(o, bo)
	}

	db, err := s.openDB(bo)
	if err != nil {
		// Badger flattens the lock error into text, so ask the kernel instead.
		if !o.InMemory && !errors.Is(err, ErrLocked) && dirLocked(o.Dir) {
			return nil, fmt.Errorf("open badger store %s: %w (%w)", o.Dir, ErrLocked, err)
		}
		return nil, fmt.Errorf("open badger store %s: %w", o.Dir, err)
	}
	s.db = db
	s.flights = newFlights()
	s.commits.flush = s.writeGroup
	s.filter = newKeyFilter()
	s.bound = o.DeadLetters
	if err := s.loadContents(); err != nil {
		s.closeDB()
		return nil, fmt.Errorf("open badger store %s: %w", o.Dir, err)
	}

	var boot [8]byte
	rand.Read(boot[:])
	s.ownerPrefix = hex.EncodeToString(boot[:]) + "."

	s.bg.Add(2)
	go s.runSweep(inFlightGrace)
	go s.runFilter()
	if !o.InMemory {
		interval := o.GCInterval
		if interval <= 0 {
			interval = defaultGCInterval
		}
		s.bg.Add(1)
		go s.runGC(interval)
		s.bg.Add(1)
		go s.runSpace()
		if writebackSupported && o.WritebackInterval > 0 {
			s.bg.Add(1)
			go s.runWriteback(o.WritebackInterval)
		}
	}
	return s, nil
}

// loadContents reads what the store keeps of the database's contents at
// Open: the dead letters' index, the live figure and the key filter (see
// reload for a database opened later).
func (s *Store) loadContents() error {
	var err error
	if s.letters, s.dead, err = s.loadLetters(); err != nil {
		return err
	}
	if err := s.rescanLive(); err != nil {
		return fmt.Errorf("sizing: %w", err)
	}
	if err := s.loadFilter(); err != nil {
		return fmt.Errorf("key filter: %w", err)
	}
	return nil
}

// lockKey holds the store open and key's flight shard until unlockKey.
func (s *Store) lockKey(ctx context.Context, key []byte) (*flightShard, error) {
	if _, err := s.begin(ctx); err != nil {
		return nil, err
	}
	return s.flights.lock(key), nil
}

// unlockKey undoes lockKey. (A method, not a closure lockKey returns: one
// allocation fewer per keyed operation.)
func (s *Store) unlockKey(sh *flightShard) {
	sh.mu.Unlock()
	s.mu.RUnlock()
}

// badgerOptions sizes Badger for a sidecar (see the constants above and
// sizing).
func badgerOptions(o Options) badger.Options {
	bo := sizeFor(o.MemoryBudget).apply(badger.DefaultOptions(o.Dir)).
		WithSyncWrites(o.SyncWrites).
		WithValueThreshold(valueThreshold).
		WithNumLevelZeroTables(numLevelZero).
		WithNumLevelZeroTablesStall(numLevelZeroStall).
		WithCompression(options.None).
		WithBlockCacheSize(0).
		WithValueLogFileSize(valueLogFileSize).
		WithNumGoroutines(2).
		WithMetricsEnabled(false).
		WithDetectConflicts(true).
		// Close compacts level 0 into the tree: the deletes a purge left
		// in the memtables meet the entries they delete there, and the
		// value-log bytes those held count as discardable, which is what
		// the value-log GC rewrites (reclaim.go). It makes a shutdown a
		// level-0 compaction longer (two 4 MiB tables at most).
		WithCompactL0OnClose(true).
		WithLogger(nil)
	if o.Logger != nil {
		bo = bo.WithLogger(badgerLogger{o.Logger.With("component", "badger")})
	}
	if o.InMemory {
		// In memory, a value must fit below the threshold, so take the
		// largest Badger allows; a write batch (15% of a memtable) must
		// hold it, so memtables are at least 8 MiB.
		bo = bo.WithDir("").WithValueDir("").WithInMemory(true).WithValueThreshold(1 << 20).
			WithMemTableSize(max(bo.MemTableSize, 8<<20))
	}
	return bo
}

// Claim takes the key for the caller, or reports why it cannot. In-flight
// records live in memory (see flights), committed ones in Badger, which is
// not read when the key filter says the key was never committed; the key's
// lock is held across both lookups and the insert, so the outcome is atomic:
//
//   - absent (or committed and expired): a new in-flight record under a new
//     owner token, leased until now+lease → Claimed;
//   - a record with another fingerprint, in flight or committed → Mismatch;
//   - committed → Done, with the full record;
//   - in flight whose lease has run out → taken over under a new owner →
//     Claimed;
//   - in flight otherwise → Busy.
func (s *Store) Claim(ctx context.Context, k cache.Key, fingerprint string, lease time.Duration) (cache.Claim, error) {
	if lease <= 0 {
		return cache.Claim{}, fmt.Errorf("claim %s: lease %v must be positive", k, lease)
	}
	if err := k.Validate(); err != nil {
		return cache.Claim{}, fmt.Errorf("claim %s: %w", k, err)
	}
	unlock, err := s.begin(ctx)
	if err != nil {
		return cache.Claim{}, fmt.Errorf("claim %s: %w", k, err)
	}
	defer unlock()
	key := storageKey(k)
	sh := s.flights.lock(key)
	defer sh.mu.Unlock()
	now := s.now()
	if cur := sh.m[string(key)]; cur != nil {
		switch {
		case cur.Fingerprint != fingerprint:
			return cache.Claim{Status: cache.Mismatch, Record: new(*cur)}, nil
		case now.Before(cur.LeaseUntil):
			return cache.Claim{Status: cache.Busy, Record: new(*cur)}, nil
		}
		// The lease ran out: take it over below.
	} else if s.filter.mayHave(key) {
		cur, err := s.loadCommitted(key, now)
		if err != nil {
			return cache.Claim{}, fmt.Errorf("claim %s: %w", k, err)
		}
		switch {
		case cur == nil:
		case cur.Fingerprint != fingerprint:
			return cache.Claim{Status: cache.Mismatch, Record: cur}, nil
		default:
			return cache.Claim{Status: cache.Done, Record: cur}, nil
		}
	}
	owner := s.ownerPrefix + strconv.FormatUint(s.ownerSeq.Add(1), 36)
	s.flights.put(sh, key, &cache.Record{
		State:       cache.InFlight,
		Fingerprint: fingerprint,
		Owner:       owner,
		LeaseUntil:  now.Add(lease),
		CreatedAt:   now,
	})
	return cache.Claim{Status: cache.Claimed, Owner: owner}, nil
}

// Renew extends the lease of the caller's in-flight record to now+lease.
// ErrNotOwner if the key is not in flight under owner. A lease that has run
// out is still renewed if nobody has taken it over.
func (s *Store) Renew(ctx context.Context, k cache.Key, owner string, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("renew %s: lease %v must be positive", k, lease)
	}
	if err := k.Validate(); err != nil {
		return fmt.Errorf("renew %s: %w", k, err)
	}
	key := storageKey(k)
	sh, err := s.lockKey(ctx, key)
	if err != nil {
		return fmt.Errorf("renew %s: %w", k, err)
	}
	defer s.unlockKey(sh)
	cur := owned(sh, key, owner)
	if cur == nil {
		return fmt.Errorf("renew %s: %w", k, cache.ErrNotOwner)
	}
	cur.LeaseUntil = s.now().Add(lease)
	return nil
}

// Commit stores rec as the key's committed record, if the key is still in
// flight under owner (ErrNotOwner otherwise: the lease was lost and taken
// over). The stored record has State Committed, the fingerprint of the claim,
// no owner or lease, CreatedAt = now and ExpiresAt = now+ttl; Badger drops it
// after ttl. rec is not modified. Waiters are woken.
//
// It is the one Badger write of a keyed request, and it has returned only
// once Badger has the record in its write-ahead log: a process crash after
// Commit loses nothing. Commits that overlap share one transaction
// (commitGroup); each still returns only once its own record is written.
func (s *Store) Commit(ctx context.Context, k cache.Key, owner string, rec *cache.Record, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("commit %s: ttl %v must be positive", k, ttl)
	}
	if rec == nil {
		return fmt.Errorf("commit %s: nil record", k)
	}
	if err := k.Validate(); err != nil {
		return fmt.Errorf("commit %s: %w", k, err)
	}
	key := storageKey(k)
	err := func() error {
		sh, err := s.lockKey(ctx, key)
		if err != nil {
			return err
		}
		defer s.unlockKey(sh)
		cur := owned(sh, key, owner)
		if cur == nil {
			return cache.ErrNotOwner
		}
		now := s.now()
		stored := *rec
		stored.State = cache.Committed
		stored.Fingerprint = cur.Fingerprint
		stored.Owner = ""
		stored.LeaseUntil = time.Time{}
		stored.CreatedAt = now
		stored.ExpiresAt = now.Add(ttl)
		e := badger.NewEntry(key, codec.EncodeRecord(&stored)).WithMeta(byte(cache.Committed))
		e.ExpiresAt = badgerExpiry(ttl)
		// Before the write, so that no check finds it written but not
		// in the filter; a write that fails leaves a false positive.
		s.filter.noteCommit(key)
		if err := s.commits.write(e); err != nil {
			// Still in flight: the owner may Release.
			return err
		}
		s.live.wrote(len(e.Key), len(e.Value))
		s.flights.del(sh, key)
		return nil
	}()
	if err != nil {
		return fmt.Errorf("commit %s: %w", k, err)
	}
	s.waiters.Wake(string(key))
	return nil
}

// Release deletes the caller's in-flight record, so the client may retry,
// and wakes waiters. ErrNotOwner if the key is not in flight under owner.
func (s *Store) Release(ctx context.Context, k cache.Key, owner string) error {
	if err := k.Validate(); err != nil {
		return fmt.Errorf("release %s: %w", k, err)
	}
	unlock, err := s.begin(ctx)
	if err != nil {
		return fmt.Errorf("release %s: %w", k, err)
	}
	defer unlock()
	key := storageKey(k)
	sh := s.flights.lock(key)
	if owned(sh, key, owner) == nil {
		sh.mu.Unlock()
		return fmt.Errorf("release %s: %w", k, cache.ErrNotOwner)
	}
	s.flights.del(sh, key)
	sh.mu.Unlock()
	s.waiters.Wake(string(key))
	return nil
}

// Get returns the key's record, in flight or committed. ErrNotFound when
// absent or expired.
func (s *Store) Get(ctx context.Context, k cache.Key) (*cache.Record, error) {
	if err := k.Validate(); err != nil {
		return nil, fmt.Errorf("get %s: %w", k, err)
	}
	unlock, err := s.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", k, err)
	}
	defer unlock()
	key := storageKey(k)
	rec, maybe := s.inFlight(key)
	if rec != nil {
		return rec, nil
	}
	// Commit writes Badger (and adds to the filter) before it forgets the
	// in-flight record, so a key missed above is in Badger by now, and in
	// the filter, if it was committed.
	if maybe {
		if rec, err = s.loadCommitted(key, s.now()); err != nil {
			return nil, fmt.Errorf("get %s: %w", k, err)
		}
	}
	if rec == nil {
		return nil, fmt.Errorf("get %s: %w", k, cache.ErrNotFound)
	}
	return rec, nil
}

// inFlight returns a copy of key's in-flight record, or nil and whether
// the key filter says it may be committed, both under the key's lock.
func (s *Store) inFlight(key []byte) (rec *cache.Record, maybeCommitted bool) {
	sh := s.flights.lock(key)
	defer sh.mu.Unlock()
	if cur := sh.m[string(key)]; cur != nil {
		return new(*cur), true
	}
	return nil, s.filter.mayHave(key)
}

// Delete forgets the key, whatever its state (admin), and wakes waiters.
// ErrNotFound when absent.
func (s *Store) Delete(ctx context.Context, k cache.Key) error {
	if err := k.Validate(); err != nil {
		return fmt.Errorf("delete %s: %w", k, err)
	}
	key := storageKey(k)
	err := func() error {
		sh, err := s.lockKey(ctx, key)
		if err != nil {
			return err
		}
		defer s.unlockKey(sh)
		found := s.flights.del(sh, key)
		err = s.update(func(txn *badger.Txn) error {
			// Not decoded: an admin must be able to delete a record this
			// release cannot read.
			if _, err := txn.Get(key); err != nil {
				if errors.Is(err, badger.ErrKeyNotFound) {
					return nil
				}
				return err
			}
			found = true
			return txn.Delete(key)
		})
		if err == nil && !found {
			return cache.ErrNotFound
		}
		return err
	}()
	if err != nil {
		return fmt.Errorf("delete %s: %w", k, err)
	}
	s.waiters.Wake(string(key))
	return nil
}

// Wait blocks until the key's in-flight record may have changed: it was
// committed, released or deleted, or its lease ran out. It returns nil at
// once if the key is not in flight (or is claimable), ctx.Err() when ctx is
// done, and ErrClosed when the store closes. A nil return is a hint, not a
// promise: the caller loops Claim → Busy → Wait → Claim.
func (s *Store) Wait(ctx context.Context, k cache.Key) error {
	if err := k.Validate(); err != nil {
		return fmt.Errorf("wait %s: %w", k, err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	key := storageKey(k)
	// Subscribe before reading: a change made after the read below closes
	// this channel, so no wake-up between the caller's Claim and this Wait
	// is missed.
	e, ok := s.waiters.Subscribe(string(key))
	if !ok {
		return cache.ErrClosed
	}
	defer s.waiters.Unsubscribe(string(key), e)

	unlock, err := s.begin(ctx)
	if err != nil {
		return fmt.Errorf("wait %s: %w", k, err)
	}
	rec, _ := s.inFlight(key)
	unlock()
	now := s.now()
	if rec == nil || !now.Before(rec.LeaseUntil) {
		return nil
	}
	select {
	case <-e.Done():
		if s.closed.Load() {
			return cache.ErrClosed
		}
		return nil
	case <-s.after(rec.LeaseUntil.Sub(now)):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Ping reports whether the store is open and readable.
func (s *Store) Ping(ctx context.Context) error {
	unlock, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	err = s.db.View(func(txn *badger.Txn) error {
		_, err := txn.Get(pingKey)
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("ping badger store: %w", mapClosed(err))
	}
	return nil
}

// pingKey is outside the record namespace and never written.
var pingKey = []byte{'p', 0}

// Stats counts the committed records with a key-only scan (only committed
// records are written to Badger, so no value is read), adds the in-flight
// ones held in memory, and sums the directory's .sst and .vlog files. The
// result is cached for 5 seconds; after Close the last result is returned.
func (s *Store) Stats() cache.Stats {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	now := s.now()
	if age := now.Sub(s.stats.At); !s.stats.At.IsZero() && age >= 0 && age < statsMaxAge {
		return s.stats
	}
	unlock, err := s.begin(context.Background())
	if err != nil {
		return s.stats
	}
	defer unlock()
	inFlight := s.flights.n.Load()
	st := cache.Stats{At: now, Records: inFlight, InFlight: inFlight}
	err = s.eachKey(recordKeyPrefix, func(*badger.Item) { st.Records++ })
	if err != nil {
		s.log.Warn("cache stats", slog.Any("err", err))
		return s.stats
	}
	if s.dir != "" {
		st.LSMBytes, st.VLogBytes = dirSizes(s.dir)
	}
	s.stats = st
	return st
}

func dirSizes(dir string) (lsm, vlog int64) {
	// Errors (a file removed by compaction mid-walk) only make the figure
	// approximate, which it is anyway.
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		ext := filepath.Ext(path)
		if ext != ".sst" && ext != ".vlog" {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if ext == ".sst" {
			lsm += info.Size()
		} else {
			vlog += info.Size()
		}
		return nil
	})
	return lsm, vlog
}

// Close stops the background goroutines, wakes every waiter (their Wait
// returns ErrClosed), waits for operations in progress and closes the
// database. Later calls return ErrClosed. Close is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.waiters.Close()
		close(s.done)
		// The background goroutines stop before the lock is taken: the
		// space check takes it to reopen the database read-write.
		s.bg.Wait()
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := s.closeDB(); err != nil {
			s.closeErr = fmt.Errorf("close badger store: %w", err)
		}
	})
	return s.closeErr
}

// begin admits one operation: it fails once ctx is done or the store is
// closed, and otherwise holds Close off until unlock.
func (s *Store) begin(ctx context.Context) (unlock func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	if s.closed.Load() {
		s.mu.RUnlock()
		return nil, cache.ErrClosed
	}
	return s.runlock, nil
}

// update runs fn in a read-write transaction, again on a conflict with a
// concurrent transaction on the same key (the key locks leave none among
// this store's own writes; the retry is a safety net). fn must set its
// results afresh on every run. The caller holds begin's admission.
func (s *Store) update(fn func(txn *badger.Txn) error) error {
	if err := s.roomToWrite(); err != nil {
		return err
	}
	s.gcMu.RLock()
	defer s.gcMu.RUnlock()
	for attempt := 0; ; attempt++ {
		err := s.db.Update(fn)
		if !errors.Is(err, badger.ErrConflict) || attempt == maxConflictRetries {
			return mapClosed(err)
		}
	}
}

// loadCommitted reads and decodes the committed record under key, in a
// read-only transaction. It returns nil when there is none or when it has
// expired by the store's clock (Badger's own TTL runs on real time, in
// whole seconds).
func (s *Store) loadCommitted(key []byte, now time.Time) (*cache.Record, error) {
	s.reads.Add(1)
	var rec *cache.Record
	err := s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(key)
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		v, err := item.ValueCopy(nil)
		if err != nil {
			return err
		}
		r, err := codec.DecodeRecord(v)
		if err != nil {
			return err
		}
		if r.State == cache.Committed && (r.ExpiresAt.IsZero() || now.Before(r.ExpiresAt)) {
			rec = r
		}
		return nil
	})
	return rec, mapClosed(err)
}

// owned returns key's in-flight record if owner holds it, else nil. The
// caller holds sh.mu.
func owned(sh *flightShard, key []byte, owner string) *cache.Record {
	cur := sh.m[string(key)]
	if cur == nil || owner == "" || cur.Owner != owner {
		return nil
	}
	return cur
}

// badgerExpiry is the Badger expiry (Unix seconds, real time, as Badger
// compares it with time.Now) for a TTL of d, rounded up so that Badger never
// drops a record before the store's own ExpiresAt does.
func badgerExpiry(d time.Duration) uint64 {
	return uint64(time.Now().Add(d + time.Second - 1).Unix())
}

func mapClosed(err error) error {
	if errors.Is(err, badger.ErrDBClosed) {
		return cache.ErrClosed
	}
	return err
}

// runSweep drops orphaned in-flight records (see flights.sweep) and wakes
// their waiters, and forgets expired dead-letter ids, every interval.
func (s *Store) runSweep(interval time.Duration) {
	defer s.bg.Done()
	s.every(interval, func() {
		s.sweep()
		s.forgetExpiredDeadLetters()
	})
}

// every runs fn every interval until the store closes. The caller, which
// Open counted in s.bg, marks it done once its own cleanup has run.
func (s *Store) every(interval time.Duration, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		fn()
	}
}

func (s *Store) sweep() {
	for _, key := range s.flights.sweep(s.now(), inFlightGrace) {
		s.waiters.Wake(key)
	}
}

// badgerLogger routes Badger's warnings and errors to slog and drops the rest.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) Errorf(f string, a ...any) {
	b.l.Error(strings.TrimSpace(fmt.Sprintf(f, a...)))
}

func (b badgerLogger) Warningf(f string, a ...any) {
	b.l.Warn(strings.TrimSpace(fmt.Sprintf(f, a...)))
}

func (badgerLogger) Infof(string, ...any)  {}
func (badgerLogger) Debugf(string, ...any) {}

// InProcess reports that the store's operations run in this process and
// cannot be interrupted: a context is looked at only as one begins
// (idempotency.InProcessStore), so no op timeout is set on them.
func (s *Store) InProcess() bool { return true }
