package badgerstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Deleted and expired entries free the cap at once (live.go) but their
// disk only when Badger rewrites the files that hold them: compaction
// drops their keys from the LSM tree, and learns which value-log bytes
// they held (its discard statistics), and the value-log GC then rewrites
// the files that are at least half garbage. Compaction runs only on
// tables, which a memtable becomes only once it is full, so a store that
// is full — whose writes are refused — never reclaims its own disk (a
// purge's deletes sit in the memtable with the keys they delete). So
// runGC, after a purge, while the store is full and when the files are
// far larger than what is live:
//
//  1. cycles Badger (cycle: Close, which flushes the memtables, and Open
//     again), holding the store's operations off meanwhile — they wait,
//     none fails — for the tens of milliseconds it takes;
//  2. flattens the LSM tree (Flatten), which stops Badger's compactions
//     while it runs but not its writes: other tenants' commits go on;
//  3. runs the value-log GC until it finds nothing to rewrite. The active
//     value-log file is never rewritten: up to ValueLogFileSize (16 MiB)
//     of deleted values stays on disk until it fills.
//
// Not DropPrefix: it fails every write while it runs. Each step needs
// room on disk and is skipped below the reserve (roomToWrite).

// runGC reclaims every interval, and at once when kicked (afterPurge).
func (s *Store) runGC(interval time.Duration) {
	defer s.bg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		kicked := false
		select {
		case <-s.done:
			return
		case <-t.C:
		case <-s.reclaimKick:
			kicked = true
		}
		s.reclaim(kicked || s.wasteful())
		select {
		case s.reclaimed <- struct{}{}:
		default:
		}
	}
}

// wasteful reports whether the store should be flattened before its GC:
// it is full, or its files are more than twice its live entries and four
// value-log files (an idle, empty store's files are ~41 MiB: the active
// value-log file is mapped at twice its 16 MiB, the WAL at twice its
// 4 MiB memtable), so that an idle store is not cycled every interval.
func (s *Store) wasteful() bool {
	st := s.Space()
	return st.Full || st.UsedBytes > 2*st.LiveBytes+4*valueLogFileSize
}

// afterPurge gives a purge's space back: the live entries are counted
// again and Space measures afresh, so the cap is free at once, and runGC
// is asked to reclaim the disk.
func (s *Store) afterPurge() {
	if s.space == nil {
		return
	}
	if err := s.rescanLive(); err != nil {
		s.log.Warn("sizing the store after a purge", slog.Any("err", err))
	}
	s.space.mu.Lock()
	s.space.last.At = time.Time{}
	s.space.usedAt = time.Time{}
	s.space.mu.Unlock()
	select {
	case s.reclaimKick <- struct{}{}:
	default:
	}
}

// reclaim flattens the LSM tree (if flatten) and runs the value-log GC
// until it has nothing to rewrite.
func (s *Store) reclaim(flatten bool) {
	start := time.Now()
	var paused time.Duration
	if flatten {
		if err := s.cycle(); err != nil {
			s.log.Warn("badger cycle", slog.Any("err", err))
		}
		paused = time.Since(start)
		if err := s.flatten(); err != nil {
			s.log.Warn("badger flatten", slog.Any("err", err))
		}
	}
	rewrote := 0
	for !s.closed.Load() {
		err := s.valueLogGC()
		if err == nil {
			rewrote++
			continue
		}
		if !errors.Is(err, badger.ErrNoRewrite) && !errors.Is(err, badger.ErrRejected) {
			s.log.Warn("badger value-log gc", slog.Any("err", err))
		}
		break
	}
	if flatten || rewrote > 0 {
		s.log.Info("store reclaimed disk", slog.Bool("flattened", flatten), slog.Int("vlog_files_rewritten", rewrote),
			slog.Duration("paused", paused), slog.Duration("took", time.Since(start)))
	}
}

// flatten compacts the LSM tree into one level, unless the store is
// read-only or below its reserve.
func (s *Store) flatten() error {
	unlock, err := s.begin(context.Background())
	if err != nil {
		return nil
	}
	defer unlock()
	if s.space.readOnly.Load() || s.roomToWrite() != nil {
		return nil
	}
	return s.db.Flatten(1)
}

// cycle closes and reopens Badger with every operation held off (s.mu),
// so that its memtables are flushed to tables that Flatten compacts. If
// Badger will not open again, the store goes read-only, as after a failed
// reopenReadWrite, until the space check reopens it.
func (s *Store) cycle() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() || s.space.readOnly.Load() || s.roomToWrite() != nil {
		return nil
	}
	if err := s.db.Close(); err != nil {
		s.log.Warn("closing the store to flush it", slog.Any("err", err))
	}
	db, err := badger.Open(s.space.bo)
	if err == nil {
		// The same directory, so the same records: the key filter
		// (filter.go) holds them already.
		s.db = db
		return nil
	}
	if db, rerr := s.openReadOnly(s.space.bo); rerr == nil {
		s.space.readOnly.Store(true)
		s.db = db
	} else {
		s.db = openStandIn()
	}
	s.reload()
	return fmt.Errorf("reopening the store read-write after flushing it: %w", err)
}
