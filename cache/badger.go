package cache

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
)

// BadgerOptions configures OpenBadger. The zero value is not usable only
// because Dir (or InMemory) must be set.
type BadgerOptions struct {
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
	// Now is the clock for leases, CreatedAt and ExpiresAt. If nil, time.Now.
	Now func() time.Time
	// After is the timer Wait uses to wake when a lease runs out. If nil,
	// time.After.
	After func(time.Duration) <-chan time.Time
	// Logger receives Badger's own warnings and errors and the GC's. If nil,
	// they are discarded.
	Logger *slog.Logger
}

// Badger is the embedded idempotency store, one Badger database in one
// directory. It is safe for concurrent use.
type Badger struct {
	db    *badger.DB
	dir   string // "" in memory
	now   func() time.Time
	after func(time.Duration) <-chan time.Time
	log   *slog.Logger

	// ownerPrefix starts every owner token this Open hands out. An in-flight
	// record whose owner lacks it was claimed by an earlier process, which is
	// dead: Badger's directory lock admits one process at a time.
	ownerPrefix string
	ownerSeq    atomic.Uint64

	waiters broadcast

	// mu is held shared by every operation on db and exclusively by Close, so
	// Close waits for operations in progress and none starts after it.
	mu        sync.RWMutex
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
	done      chan struct{} // closed by Close: stops the GC goroutine
	gcDone    chan struct{} // closed by the GC goroutine when it returns

	statsMu sync.Mutex
	stats   Stats
}

// Sizing for a sidecar, not a database (Badger's defaults take hundreds of
// MiB). Measured on linux/amd64, Go 1.26, from /proc/self/status after
// runtime.GC and debug.FreeOSMemory, over a 10.5 MiB test-binary baseline:
//
//   - opened, idle: +2 MiB (+1 anonymous); reopened over 20,000 1 KiB and
//     200 200 KiB records: +10 MiB, almost all clean file pages of the last
//     value-log file, which Badger reads through on open;
//   - just after writing those records: +35 MiB anonymous (memtable arena,
//     pooled table-builder buffers that Badger frees one per 2 s idle; +14
//     MiB after 25 s) and up to ~70 MiB of page cache for the mmapped files,
//     which the kernel reclaims under pressure.
//
// Each value:
//
//   - MemTableSize 8 MiB, NumMemtables 2: the memtables and their flush
//     buffers are the bulk of the heap (the default is 5 × 64 MiB). Badger caps
//     one write batch at 15% of it (1.2 MiB), fine because a body above
//     ValueThreshold goes to the value log and counts only as a pointer.
//   - ValueThreshold 64 KiB: typical completions (1–50 KiB) stay in the LSM
//     tree, where compaction drops them once expired; big stream records go to
//     the value log, which the GC goroutine reclaims. With 1 MiB, compacting
//     big values took the heap to 157 MiB in the same burst.
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
//   - IndexCacheSize 8 MiB: bounds what table indexes and bloom filters may
//     hold (0 would keep them all in memory).
//   - NumCompactors 2: the fewest Badger accepts (compactor 0 serves L0).
//   - MetricsEnabled false: Stats measures the directory itself.
const (
	memTableSize       = 8 << 20
	numMemtables       = 2
	valueThreshold     = 64 << 10
	numLevelZero       = 2
	numLevelZeroStall  = 8
	indexCacheSize     = 8 << 20
	valueLogFileSize   = 16 << 20
	numCompactors      = 2
	defaultGCInterval  = 10 * time.Minute
	gcDiscardRatio     = 0.5
	statsMaxAge        = 5 * time.Second
	defaultListLimit   = 100
	maxConflictRetries = 100
	// inFlightGrace is how long an in-flight record outlives its lease in
	// Badger: its Badger TTL is lease + inFlightGrace, renewed with the lease.
	// A claimant takes over an expired lease long before that; the TTL only
	// makes sure an orphan nobody claims again disappears, while Badger never
	// drops a record whose lease is current.
	inFlightGrace = time.Minute
)

// OpenBadger opens (or creates) the store. When another process holds the
// directory the error wraps ErrLocked.
func OpenBadger(o BadgerOptions) (*Badger, error) {
	if !o.InMemory && o.Dir == "" {
		return nil, errors.New("open badger store: BadgerOptions.Dir is required unless InMemory")
	}
	s := &Badger{
		now:   o.Now,
		after: o.After,
		log:   o.Logger,
		done:  make(chan struct{}),
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.after == nil {
		s.after = time.After
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}

	bo := badger.DefaultOptions(o.Dir).
		WithSyncWrites(o.SyncWrites).
		WithMemTableSize(memTableSize).
		WithNumMemtables(numMemtables).
		WithValueThreshold(valueThreshold).
		WithNumLevelZeroTables(numLevelZero).
		WithNumLevelZeroTablesStall(numLevelZeroStall).
		WithCompression(options.None).
		WithBlockCacheSize(0).
		WithIndexCacheSize(indexCacheSize).
		WithValueLogFileSize(valueLogFileSize).
		WithNumCompactors(numCompactors).
		WithNumGoroutines(2).
		WithMetricsEnabled(false).
		WithDetectConflicts(true).
		WithLogger(nil)
	if o.Logger != nil {
		bo = bo.WithLogger(badgerLogger{o.Logger.With("component", "badger")})
	}
	if o.InMemory {
		// In memory, a value must fit below the threshold, so take the
		// largest Badger allows.
		bo = bo.WithDir("").WithValueDir("").WithInMemory(true).WithValueThreshold(1 << 20)
	} else {
		s.dir = o.Dir
	}

	db, err := badger.Open(bo)
	if err != nil {
		// Badger flattens the lock error into text, so ask the kernel instead.
		if !o.InMemory && dirLocked(o.Dir) {
			return nil, fmt.Errorf("open badger store %s: %w (%w)", o.Dir, ErrLocked, err)
		}
		return nil, fmt.Errorf("open badger store %s: %w", o.Dir, err)
	}
	s.db = db

	var boot [8]byte
	rand.Read(boot[:])
	s.ownerPrefix = hex.EncodeToString(boot[:]) + "."

	if !o.InMemory {
		interval := o.GCInterval
		if interval <= 0 {
			interval = defaultGCInterval
		}
		s.gcDone = make(chan struct{})
		go s.runGC(interval)
	}
	return s, nil
}

// Claim takes the key for the caller, or reports why it cannot, in one
// read-write transaction (retried on conflict):
//
//   - absent (or committed and expired): a new in-flight record under a new
//     owner token, leased until now+lease → Claimed;
//   - a record with another fingerprint, in flight or committed → Mismatch;
//   - committed → Done, with the full record;
//   - in flight whose lease has run out, or whose owner was a previous
//     process on this directory → taken over under a new owner → Claimed;
//   - in flight otherwise → Busy.
func (s *Badger) Claim(ctx context.Context, k Key, fingerprint string, lease time.Duration) (Claim, error) {
	if lease <= 0 {
		return Claim{}, fmt.Errorf("claim %s: lease %v must be positive", k, lease)
	}
	if err := k.Validate(); err != nil {
		return Claim{}, fmt.Errorf("claim %s: %w", k, err)
	}
	key := storageKey(k)
	var c Claim
	err := s.update(ctx, func(txn *badger.Txn) error {
		now := s.now()
		cur, err := s.load(txn, key, now)
		if err != nil {
			return err
		}
		if cur != nil {
			switch {
			case cur.Fingerprint != fingerprint:
				c = Claim{Status: Mismatch, Record: cur}
				return nil
			case cur.State == Committed:
				c = Claim{Status: Done, Record: cur}
				return nil
			case !s.claimable(cur, now):
				c = Claim{Status: Busy, Record: cur}
				return nil
			}
		}
		owner := s.ownerPrefix + strconv.FormatUint(s.ownerSeq.Add(1), 36)
		rec := &Record{
			State:       InFlight,
			Fingerprint: fingerprint,
			Owner:       owner,
			LeaseUntil:  now.Add(lease),
			CreatedAt:   now,
		}
		c = Claim{Status: Claimed, Owner: owner}
		return txn.SetEntry(inFlightEntry(key, rec, lease))
	})
	if err != nil {
		return Claim{}, fmt.Errorf("claim %s: %w", k, err)
	}
	return c, nil
}

// Renew extends the lease of the caller's in-flight record to now+lease.
// ErrNotOwner if the key is not in flight under owner. A lease that has run
// out is still renewed if nobody has taken it over.
func (s *Badger) Renew(ctx context.Context, k Key, owner string, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("renew %s: lease %v must be positive", k, lease)
	}
	if err := k.Validate(); err != nil {
		return fmt.Errorf("renew %s: %w", k, err)
	}
	key := storageKey(k)
	err := s.update(ctx, func(txn *badger.Txn) error {
		now := s.now()
		cur, err := s.owned(txn, key, owner, now)
		if err != nil {
			return err
		}
		cur.LeaseUntil = now.Add(lease)
		return txn.SetEntry(inFlightEntry(key, cur, lease))
	})
	if err != nil {
		return fmt.Errorf("renew %s: %w", k, err)
	}
	return nil
}

// Commit stores rec as the key's committed record, if the key is still in
// flight under owner (ErrNotOwner otherwise: the lease was lost and taken
// over). The stored record has State Committed, the fingerprint of the claim,
// no owner or lease, CreatedAt = now and ExpiresAt = now+ttl; Badger drops it
// after ttl. rec is not modified. Waiters are woken.
func (s *Badger) Commit(ctx context.Context, k Key, owner string, rec *Record, ttl time.Duration) error {
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
	err := s.update(ctx, func(txn *badger.Txn) error {
		now := s.now()
		cur, err := s.owned(txn, key, owner, now)
		if err != nil {
			return err
		}
		stored := *rec
		stored.State = Committed
		stored.Fingerprint = cur.Fingerprint
		stored.Owner = ""
		stored.LeaseUntil = time.Time{}
		stored.CreatedAt = now
		stored.ExpiresAt = now.Add(ttl)
		e := badger.NewEntry(key, encodeRecord(&stored)).WithMeta(byte(Committed))
		e.ExpiresAt = badgerExpiry(ttl)
		return txn.SetEntry(e)
	})
	if err != nil {
		return fmt.Errorf("commit %s: %w", k, err)
	}
	s.waiters.wake(string(key))
	return nil
}

// Release deletes the caller's in-flight record, so the client may retry,
// and wakes waiters. ErrNotOwner if the key is not in flight under owner.
func (s *Badger) Release(ctx context.Context, k Key, owner string) error {
	if err := k.Validate(); err != nil {
		return fmt.Errorf("release %s: %w", k, err)
	}
	key := storageKey(k)
	err := s.update(ctx, func(txn *badger.Txn) error {
		if _, err := s.owned(txn, key, owner, s.now()); err != nil {
			return err
		}
		return txn.Delete(key)
	})
	if err != nil {
		return fmt.Errorf("release %s: %w", k, err)
	}
	s.waiters.wake(string(key))
	return nil
}

// Get returns the key's record, in flight or committed. ErrNotFound when
// absent or expired.
func (s *Badger) Get(ctx context.Context, k Key) (*Record, error) {
	if err := k.Validate(); err != nil {
		return nil, fmt.Errorf("get %s: %w", k, err)
	}
	rec, err := s.get(ctx, storageKey(k))
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", k, err)
	}
	return rec, nil
}

func (s *Badger) get(ctx context.Context, key []byte) (*Record, error) {
	unlock, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var rec *Record
	err = s.db.View(func(txn *badger.Txn) error {
		rec, err = s.load(txn, key, s.now())
		return err
	})
	if err != nil {
		return nil, mapClosed(err)
	}
	if rec == nil {
		return nil, ErrNotFound
	}
	return rec, nil
}

// Delete forgets the key, whatever its state (admin), and wakes waiters.
// ErrNotFound when absent.
func (s *Badger) Delete(ctx context.Context, k Key) error {
	if err := k.Validate(); err != nil {
		return fmt.Errorf("delete %s: %w", k, err)
	}
	key := storageKey(k)
	err := s.update(ctx, func(txn *badger.Txn) error {
		// Not decoded: an admin must be able to delete a record this release
		// cannot read.
		if _, err := txn.Get(key); err != nil {
			if errors.Is(err, badger.ErrKeyNotFound) {
				return ErrNotFound
			}
			return err
		}
		return txn.Delete(key)
	})
	if err != nil {
		return fmt.Errorf("delete %s: %w", k, err)
	}
	s.waiters.wake(string(key))
	return nil
}

// Wait blocks until the key's in-flight record may have changed: it was
// committed, released or deleted, or its lease ran out. It returns nil at
// once if the key is not in flight (or is claimable), ctx.Err() when ctx is
// done, and ErrClosed when the store closes. A nil return is a hint, not a
// promise: the caller loops Claim → Busy → Wait → Claim.
func (s *Badger) Wait(ctx context.Context, k Key) error {
	if err := k.Validate(); err != nil {
		return fmt.Errorf("wait %s: %w", k, err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	key := storageKey(k)
	// Subscribe before reading: a change committed after the read below
	// closes this channel, so no wake-up between the caller's Claim and this
	// Wait is missed.
	e, ok := s.waiters.subscribe(string(key))
	if !ok {
		return ErrClosed
	}
	defer s.waiters.unsubscribe(string(key), e)

	rec, err := s.get(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("wait %s: %w", k, err)
	}
	now := s.now()
	if rec.State != InFlight || s.claimable(rec, now) {
		return nil
	}
	select {
	case <-e.ch:
		if s.closed.Load() {
			return ErrClosed
		}
		return nil
	case <-s.after(rec.LeaseUntil.Sub(now)):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Ping reports whether the store is open and readable.
func (s *Badger) Ping(ctx context.Context) error {
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

// Stats counts records with a key-only scan (the state is in Badger's
// per-entry user byte, so no value is read) and sums the directory's .sst
// and .vlog files. The result is cached for 5 seconds; after Close the last
// result is returned.
func (s *Badger) Stats() Stats {
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
	st := Stats{At: now}
	err = s.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.PrefetchValues = false
		opts.Prefix = recordKeyPrefix
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			st.Records++
			if it.Item().UserMeta() == byte(InFlight) {
				st.InFlight++
			}
		}
		return nil
	})
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

// List returns the metadata of up to limit records of one scope, in key
// order (endpoint, then id), skipping expired ones. If limit <= 0, 100.
func (s *Badger) List(ctx context.Context, scope string, limit int) ([]ListedKey, error) {
	if strings.IndexByte(scope, 0) >= 0 {
		return nil, fmt.Errorf("list: %w: scope contains NUL", ErrInvalidKey)
	}
	if limit <= 0 {
		limit = defaultListLimit
	}
	unlock, err := s.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("list %q: %w", scope, err)
	}
	defer unlock()
	var out []ListedKey
	now := s.now()
	err = s.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.PrefetchValues = false
		opts.Prefix = scopeKeyPrefix(scope)
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid() && len(out) < limit; it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			item := it.Item()
			k, ok := parseStorageKey(item.Key())
			if !ok {
				continue
			}
			var lk ListedKey
			err := item.Value(func(v []byte) error {
				r, size, err := decodeMeta(v)
				if err != nil {
					return err
				}
				lk = ListedKey{
					Key: k, State: r.State, Fingerprint: r.Fingerprint, Stream: r.Stream,
					Status: r.Status, Size: size, Upstream: r.Upstream,
					LeaseUntil: r.LeaseUntil, CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt,
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
			if expired(lk.State, lk.ExpiresAt, now) {
				continue
			}
			out = append(out, lk)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %q: %w", scope, mapClosed(err))
	}
	return out, nil
}

// Close stops the GC goroutine, wakes every waiter (their Wait returns
// ErrClosed), waits for operations in progress and closes the database.
// Later calls return ErrClosed. Close is idempotent.
func (s *Badger) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.waiters.close()
		close(s.done)
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.gcDone != nil {
			<-s.gcDone
		}
		if err := s.db.Close(); err != nil {
			s.closeErr = fmt.Errorf("close badger store: %w", err)
		}
	})
	return s.closeErr
}

// begin admits one operation: it fails once ctx is done or the store is
// closed, and otherwise holds Close off until unlock.
func (s *Badger) begin(ctx context.Context) (unlock func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	if s.closed.Load() {
		s.mu.RUnlock()
		return nil, ErrClosed
	}
	return s.mu.RUnlock, nil
}

// update runs fn in a read-write transaction, again on a conflict with a
// concurrent transaction on the same key. fn must set its results afresh on
// every run.
func (s *Badger) update(ctx context.Context, fn func(txn *badger.Txn) error) error {
	unlock, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	for attempt := 0; ; attempt++ {
		err := s.db.Update(fn)
		if !errors.Is(err, badger.ErrConflict) || attempt == maxConflictRetries {
			return mapClosed(err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// load reads and decodes the record under key, or returns nil when there is
// none or it has expired by the store's clock (Badger's own TTL runs on real
// time, in whole seconds).
func (s *Badger) load(txn *badger.Txn, key []byte, now time.Time) (*Record, error) {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	v, err := item.ValueCopy(nil)
	if err != nil {
		return nil, err
	}
	rec, err := decodeRecord(v)
	if err != nil {
		return nil, err
	}
	if expired(rec.State, rec.ExpiresAt, now) {
		return nil, nil
	}
	return rec, nil
}

func expired(st State, expiresAt, now time.Time) bool {
	return st == Committed && !expiresAt.IsZero() && !now.Before(expiresAt)
}

// owned returns the key's record if it is in flight under owner, else ErrNotOwner.
func (s *Badger) owned(txn *badger.Txn, key []byte, owner string, now time.Time) (*Record, error) {
	cur, err := s.load(txn, key, now)
	if err != nil {
		return nil, err
	}
	if cur == nil || cur.State != InFlight || owner == "" || cur.Owner != owner {
		return nil, ErrNotOwner
	}
	return cur, nil
}

// claimable reports whether an in-flight record may be taken over: its lease
// ran out, or its owner was a previous process on this directory.
func (s *Badger) claimable(r *Record, now time.Time) bool {
	return !now.Before(r.LeaseUntil) || !strings.HasPrefix(r.Owner, s.ownerPrefix)
}

func inFlightEntry(key []byte, r *Record, lease time.Duration) *badger.Entry {
	e := badger.NewEntry(key, encodeRecord(r)).WithMeta(byte(InFlight))
	e.ExpiresAt = badgerExpiry(lease + inFlightGrace)
	return e
}

// badgerExpiry is the Badger expiry (Unix seconds, real time, as Badger
// compares it with time.Now) for a TTL of d, rounded up so that Badger never
// drops a record before the store's own ExpiresAt does.
func badgerExpiry(d time.Duration) uint64 {
	return uint64(time.Now().Add(d + time.Second - 1).Unix())
}

func mapClosed(err error) error {
	if errors.Is(err, badger.ErrDBClosed) {
		return ErrClosed
	}
	return err
}

func (s *Badger) runGC(interval time.Duration) {
	defer close(s.gcDone)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		// Each successful run rewrites one value-log file; go on until there
		// is nothing worth rewriting.
		for !s.closed.Load() {
			err := s.db.RunValueLogGC(gcDiscardRatio)
			if err == nil {
				continue
			}
			if !errors.Is(err, badger.ErrNoRewrite) && !errors.Is(err, badger.ErrRejected) {
				s.log.Warn("badger value-log gc", slog.Any("err", err))
			}
			break
		}
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
