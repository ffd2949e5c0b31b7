package badgerstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/llmgate/llmgate/cache"
)

// A full disk is a state, not a crash.
//
// Badger memory-maps its write-ahead log (each memtable's .mem file, mapped
// at twice MemTableSize), its value-log files (mapped at twice
// ValueLogFileSize) and every table it writes, and creates them sparse: the
// filesystem gives a page its block only when the page is first written.
// When the filesystem has none left, that write faults with SIGBUS, which
// no Go code can recover (it happens on Badger's own goroutines), so the
// process dies — and after a restart on the still-full disk, the WAL replay
// and the flush that follows it fault again. So the store keeps a reserve
// on its filesystem and stays clear of it:
//
//   - below the floor (MinFreeBytes), or over MaxBytes, Space reports Full
//     and the gateway refuses new keyed requests before their claim; the
//     floor is the reserve plus room for the commits of calls already
//     running when the state began;
//   - below the reserve itself every write (commits, dead letters, deletes)
//     fails with cache.ErrFull instead of reaching Badger: once the store
//     stops writing, Badger's own work (the active WAL's unwritten pages,
//     flushing the memtables, compacting L0 and one level below, a
//     value-log GC rewrite) fits in the reserve, so nothing faults;
//   - opened below the floor, Badger is opened read-only (no new WAL, no
//     flush, no compaction; the WALs of an unclean stop are replayed into
//     memory only), so a start on a full disk serves replays, and the store
//     reopens read-write once the filesystem is above the floor again.
//
// Space returns by itself when TTLs expire and compaction or the value-log
// GC drop the records (both need the reserve), or when an operator frees
// the disk or grows the volume; a background check every SpaceInterval
// notices it, and keyed work resumes without a restart.

// reserveFor is the free space Badger's own work may still take after the
// store stops writing, for the options bo:
//
//	the active WAL's unwritten part      2 × MemTableSize
//	flushing the memtables to L0         NumMemtables × MemTableSize
//	the active value-log file's map      2 × ValueLogFileSize (a GC rewrite writes there)
//	compacting L0 into the base level    NumLevelZeroTables × MemTableSize + BaseLevelSize
//	and one compaction below it          (LevelSizeMultiplier + 1) × BaseTableSize
//
// A compaction writes its new tables before it deletes the old ones, so it
// needs room for its output. With the default memory budget (4 MiB
// memtables, 1 MiB tables, see sizing) that is 8 + 8 + 32 + 18 + 11 = 77
// MiB; the value-log map dominates, and grows with ValueLogFileSize.
//
// With ValueThreshold 256 bytes (store.go) a record's body is written to the
// active value-log file, through its mmap as the WAL is, and the WAL gets
// only a pointer: the floor's room for running calls (2 × MemTableSize)
// now counts value-log bytes, as many as the WAL took before. Below the
// reserve the store writes to neither, and the value-log GC does not start
// (valueLogGC); the value-log term covers a GC round admitted above it,
// which rewrites at most one file's live data and may open the next file.
// What no term covers is writes admitted together just above the reserve:
// each passed roomToWrite before any wrote, so N concurrent commits of B
// bytes take N × B of it (TestRealDiskFillsNoFault: 4 KiB and 96 KiB
// bodies, one writer).
func reserveFor(bo badger.Options) int64 {
	return 2*bo.MemTableSize +
		int64(bo.NumMemtables)*bo.MemTableSize +
		2*bo.ValueLogFileSize +
		int64(bo.NumLevelZeroTables)*bo.MemTableSize + bo.BaseLevelSize +
		int64(bo.LevelSizeMultiplier+1)*bo.BaseTableSize
}

// FloorFor is the default free-space floor for the options bo: the reserve
// plus two memtables' worth for the commits of calls that were running
// when the store became full (85 MiB at the default memory budget).
func floorFor(bo badger.Options) int64 { return reserveFor(bo) + 2*bo.MemTableSize }

// DefaultMinFreeBytes is the floor with the store's own options: what
// MinFreeBytes <= 0 means.
func DefaultMinFreeBytes() int64 { return floorFor(badgerOptions(Options{Dir: "."})) }

const (
	defaultSpaceInterval = time.Second
	// spaceMaxAge is how long Space reuses its last figures: the gateway
	// asks on every keyed request.
	spaceMaxAge = 250 * time.Millisecond
)

// space is the store's view of its room on disk.
type space struct {
	statfs   func(dir string) (free uint64, err error)
	floor    int64 // MinFreeBytes
	reserve  int64 // below it, writes fail with cache.ErrFull
	maxBytes int64
	interval time.Duration
	bo       badger.Options // to reopen read-write
	readOnly atomic.Bool
	// lock holds the directory's flock while Badger is open read-only or
	// stands in memory (see lockForReadOnly); nil otherwise.
	lock *os.File

	mu     sync.Mutex
	last   cache.Space
	usedAt time.Time
	used   int64

	// answer is the disk's last free-space figure (see recentRoom).
	answer atomic.Pointer[diskAnswer]
}

// diskAnswer is one statfs: the free bytes, the store's bytes written
// (live.written) and the store's clock (Unix nanoseconds) when it was
// asked.
type diskAnswer struct{ free, written, at int64 }

const (
	// spaceRecheck is how long a write may go by the disk's last answer
	// instead of asking again (statfs cost ~5 µs a keyed request at 16
	// clients, the load tool's profile): another process filling the
	// disk by spaceMargin within it would write at 6 GiB/s.
	spaceRecheck = 10 * time.Millisecond
	// spaceMargin is the room above the reserve an answer must leave for
	// writes to go by it: nearer the reserve, every write asks.
	spaceMargin = 64 << 20
	// spaceAmplify is what Badger may write to disk per byte the store
	// writes (its write-ahead log, the value log, a flush, compactions),
	// for counting the store's writes since an answer against its room.
	spaceAmplify = 8
)

// recentRoom reports whether a write may go by the disk's last answer: it
// is less than spaceRecheck old by now, it left more than spaceMargin above
// the reserve, and the store's writes since, spaceAmplify times over, fit
// in the rest. written is live.written now.
func (sp *space) recentRoom(now time.Time, written int64) bool {
	a := sp.answer.Load()
	if a == nil || a.free < 0 {
		return false
	}
	age := now.UnixNano() - a.at
	return age >= 0 && age < int64(spaceRecheck) && spaceAmplify*(written-a.written) < a.free-sp.reserve-spaceMargin
}

// ask is the disk's free space for dir now (see free), kept as its last
// answer.
func (sp *space) ask(dir string, now time.Time, written int64) int64 {
	free := sp.free(dir)
	sp.answer.Store(&diskAnswer{free: free, written: written, at: now.UnixNano()})
	return free
}

func newSpace(o Options, bo badger.Options) *space {
	sp := &space{statfs: o.Statfs, floor: o.MinFreeBytes, maxBytes: max(o.MaxBytes, 0), interval: o.SpaceInterval, bo: bo}
	if sp.statfs == nil {
		sp.statfs = statfsFree
	}
	if sp.floor <= 0 {
		sp.floor = floorFor(bo)
	}
	// An operator's lower floor lowers the reserve with it (at their risk,
	// documented); a higher one keeps the derived reserve.
	sp.reserve = min(reserveFor(bo), sp.floor*7/8)
	if sp.interval <= 0 {
		sp.interval = defaultSpaceInterval
	}
	return sp
}

// free is the filesystem's free space for dir, or -1 when unknown (statfs
// failed: the store is then never full for lack of disk). dir may not
// exist yet: its nearest existing ancestor is asked.
func (sp *space) free(dir string) int64 {
	for {
		n, err := sp.statfs(dir)
		if err == nil {
			return int64(min(n, 1<<62))
		}
		parent := filepath.Dir(dir)
		if !errors.Is(err, os.ErrNotExist) || parent == dir {
			return -1
		}
		dir = parent
	}
}

// Space reports the store's room for new records (see cache.Space). In
// memory it is never full. The figures are at most 250 ms old.
func (s *Store) Space() cache.Space {
	if s.space == nil {
		return cache.Space{At: s.now()}
	}
	s.space.mu.Lock()
	last := s.space.last
	s.space.mu.Unlock()
	if age := s.now().Sub(last.At); !last.At.IsZero() && age >= 0 && age < spaceMaxAge {
		return s.withLive(last)
	}
	return s.measureSpace()
}

// withLive is st, measured up to 250 ms ago, with the live bytes of now,
// which cost nothing to read: a store that reached its cap since is full
// at once, so that a tenant committing fast passes the cap by its calls
// already running only, not by 250 ms of new ones. The state change is
// logged by the next measureSpace.
func (s *Store) withLive(st cache.Space) cache.Space {
	st.LiveBytes = s.live.bytes()
	if st.Reason == "" || st.Reason == cache.FullOverCap {
		over := st.MaxBytes > 0 && st.LiveBytes >= st.MaxBytes
		st.Full, st.Reason = over, ""
		if over {
			st.Reason = cache.FullOverCap
		}
	}
	return st
}

// measureSpace takes new figures and logs a change of state.
func (s *Store) measureSpace() cache.Space {
	sp := s.space
	now := s.now()
	free := sp.ask(s.dir, now, s.live.written.Load())
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if age := now.Sub(sp.usedAt); sp.usedAt.IsZero() || age < 0 || age >= statsMaxAge {
		lsm, vlog := dirSizes(s.dir)
		sp.used, sp.usedAt = lsm+vlog, now
	}
	st := cache.Space{At: now, ReadOnly: sp.readOnly.Load(), FreeBytes: free, MinFreeBytes: sp.floor,
		UsedBytes: sp.used, LiveBytes: s.live.bytes(), MaxBytes: sp.maxBytes}
	switch {
	case free >= 0 && free < sp.floor:
		st.Full, st.Reason = true, cache.FullDiskLow
	case sp.maxBytes > 0 && st.LiveBytes >= sp.maxBytes:
		st.Full, st.Reason = true, cache.FullOverCap
	case st.ReadOnly:
		st.Full, st.Reason = true, cache.FullReadOnly
	}
	if st.Full != sp.last.Full || st.Reason != sp.last.Reason {
		s.logSpace(st)
	}
	sp.last = st
	return st
}

func (s *Store) logSpace(st cache.Space) {
	attrs := []any{"free_bytes", st.FreeBytes, "min_free_bytes", st.MinFreeBytes, "used_bytes", st.UsedBytes, "live_bytes", st.LiveBytes,
		"max_bytes", st.MaxBytes, "read_only", st.ReadOnly}
	if st.Full {
		s.log.Warn("store full: new keyed requests get 503 until there is room again", append(attrs, "reason", st.Reason)...)
		return
	}
	s.log.Info("store has room again: keyed requests resume", attrs...)
}

// roomToWrite is the check before every write: below the reserve, or
// read-only, the write fails with cache.ErrFull instead of reaching Badger.
// The next Space call measures afresh. Far above the reserve, a write goes
// by the disk's answer of up to spaceRecheck ago (recentRoom).
func (s *Store) roomToWrite() error {
	sp := s.space
	if sp == nil {
		return nil
	}
	if sp.readOnly.Load() {
		return fmt.Errorf("store opened read-only on a full disk: %w", cache.ErrFull)
	}
	now, written := s.now(), s.live.written.Load()
	if sp.recentRoom(now, written) {
		return nil
	}
	if free := sp.ask(s.dir, now, written); free >= 0 && free < sp.reserve {
		sp.mu.Lock()
		sp.last.At = time.Time{}
		sp.mu.Unlock()
		return fmt.Errorf("%d bytes free, below the %d-byte reserve Badger needs: %w", free, sp.reserve, cache.ErrFull)
	}
	return nil
}

// runSpace measures the store's room every interval and reopens a
// read-only store read-write once the filesystem is above the floor.
func (s *Store) runSpace() {
	defer s.bg.Done()
	s.every(s.space.interval, s.checkSpace)
}

// checkSpace is one round of runSpace.
func (s *Store) checkSpace() {
	s.maybeRescanLive()
	st := s.measureSpace()
	if st.ReadOnly && st.FreeBytes >= st.MinFreeBytes {
		s.reopenReadWrite(s.space.bo)
		s.measureSpace()
	}
}

// openDB opens Badger read-write, or read-only when the filesystem is
// below the floor (see the top of this file).
func (s *Store) openDB(bo badger.Options) (*badger.DB, error) {
	if s.space == nil {
		return badger.Open(bo)
	}
	free := s.space.free(bo.Dir)
	if free < 0 || free >= s.space.floor {
		return badger.Open(bo)
	}
	s.log.Warn("opening the store read-only: the disk is below its free-space floor",
		"free_bytes", free, "min_free_bytes", s.space.floor)
	db, err := s.openReadOnly(bo)
	if err == nil {
		s.space.readOnly.Store(true)
	}
	return db, err
}

// openReadOnly opens Badger read-only, holding the directory's lock first
// (ErrLocked if another process has it: its WALs are live, and trimming
// them would make its next writes fault). A directory with no database yet
// (no MANIFEST: a first start on a full disk) has nothing to replay, and
// Badger will not open it read-only; nor will it open one whose WAL needs
// repair beyond trimWALs. Then an empty in-memory database stands in, so that the gateway
// starts (unkeyed traffic passes, keyed requests get 503) instead of
// crash-looping, until the store reopens on disk.
func (s *Store) openReadOnly(bo badger.Options) (*badger.DB, error) {
	ok, err := s.lockForReadOnly(bo.Dir)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(bo.Dir, badger.ManifestFilename)); err == nil && ok {
		if err := trimWALs(bo.Dir); err != nil {
			s.log.Warn("trimming the store's WALs for a read-only open", slog.Any("err", err))
		}
		// Badger's read-only open takes only a shared lock; the store's
		// exclusive one guards the directory instead.
		db, err := badger.Open(bo.WithReadOnly(true).WithBypassLockGuard(s.space.lock != nil))
		if err == nil {
			return db, nil
		}
		s.log.Error("opening the store read-only; no replays until it reopens read-write", slog.Any("err", err))
	}
	return openStandIn(), nil
}

// lockForReadOnly takes the directory's exclusive flock (lockDir) and
// keeps it in s.space.lock until unlockDir. ok is false when the store
// must not touch the directory: it could not create or open it (no other
// process has a database there then), so the store stands in memory.
func (s *Store) lockForReadOnly(dir string) (ok bool, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		s.log.Warn("creating the store's directory on a full disk; standing in memory", slog.Any("err", err))
		return false, nil
	}
	f, err := lockDir(dir)
	switch {
	case errors.Is(err, ErrLocked):
		return false, fmt.Errorf("opening %s read-only below the free-space floor: %w", dir, err)
	case err != nil:
		s.log.Warn("locking the store's directory; standing in memory", slog.Any("err", err))
		return false, nil
	}
	s.space.lock = f
	return true, nil
}

// closeDB closes the database and releases the directory's lock, if the
// store holds it.
func (s *Store) closeDB() error {
	err := s.db.Close()
	s.unlockDir()
	return err
}

// unlockDir releases the lock lockForReadOnly took, if any.
func (s *Store) unlockDir() {
	if s.space != nil && s.space.lock != nil {
		s.space.lock.Close()
		s.space.lock = nil
	}
}

// openStandIn opens the empty in-memory database that stands in for one
// Badger will not open read-only.
func openStandIn() *badger.DB {
	db, err := badger.Open(badgerOptions(Options{InMemory: true}))
	if err != nil {
		// The options the in-memory store opens with (its tests prove
		// them), so this does not happen.
		panic(fmt.Sprintf("open an empty in-memory badger: %v", err))
	}
	return db
}

// reopenReadWrite swaps the read-only database for a read-write one, with
// every operation held off (s.mu). The directory's lock is released just
// before Badger takes its own. If Badger will not open read-write, the
// store goes back to read-only; if another process took the directory in
// between, to an empty stand-in. What the store knows of the database's
// contents is read again from whichever database is now open (reload).
func (s *Store) reopenReadWrite(bo badger.Options) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() || !s.space.readOnly.Load() {
		return
	}
	if err := s.db.Close(); err != nil {
		s.log.Warn("closing the read-only store", slog.Any("err", err))
	}
	s.unlockDir()
	db, err := badger.Open(bo)
	if err == nil {
		s.space.readOnly.Store(false)
		s.log.Info("store reopened read-write: the disk is above its free-space floor")
	} else {
		s.log.Error("reopening the store read-write; staying read-only", slog.Any("err", err))
		if db, err = s.openReadOnly(bo); err != nil {
			s.log.Error("reopening the store read-only; standing in memory", slog.Any("err", err))
			db = openStandIn()
		}
	}
	s.db = db
	s.reload()
}

// reload reads what the store keeps of the database's contents — the
// dead-letter id set and index (see Store.dead, letters), the live
// figure and the key filter — again from the database just opened, which
// may hold other records than the one before (a stand-in, a directory
// restored meanwhile). The caller holds s.mu exclusively.
func (s *Store) reload() {
	// The filter first: it must not miss a record of the new database
	// even if a step below fails.
	if err := s.loadFilter(); err != nil {
		s.log.Error("building the key filter after a reopen; every claim reads the store", slog.Any("err", err))
	}
	l, ids, err := s.loadLetters()
	if err != nil {
		s.log.Error("reading the dead letters after a reopen", slog.Any("err", err))
		return
	}
	s.deadMu.Lock()
	s.dead = ids
	s.deadMu.Unlock()
	s.letters.mu.Lock()
	s.letters.by, s.letters.bytes = l.by, l.bytes
	s.letters.mu.Unlock()
	if err := s.rescanLive(); err != nil {
		s.log.Error("sizing the store after a reopen", slog.Any("err", err))
	}
}

// valueLogGC runs one value-log GC round unless the store is read-only or
// below its reserve (a rewrite needs room too).
func (s *Store) valueLogGC() error {
	unlock, err := s.begin(context.Background())
	if err != nil {
		return badger.ErrRejected
	}
	defer unlock()
	if s.roomToWrite() != nil {
		return badger.ErrNoRewrite
	}
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	return s.db.RunValueLogGC(gcDiscardRatio)
}
