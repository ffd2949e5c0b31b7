package badgerstore

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// writeback keeps the value-log file being written from holding much
// unwritten data, for the sake of every commit's latency. When that file
// reaches ValueLogFileSize, Badger's one writer goroutine rotates it, and
// rotating truncates it, which Badger's mmap library does only after an
// msync of the whole file (ristretto z.MmapFile.Truncate): a synchronous
// writeback of up to 16 MiB, 45–70 ms on this VM, during which no commit
// completes. That made the keyed p99.9. So every Options.WritebackInterval
// (store.writeback_interval, default 100ms) in which the store wrote, the
// kernel is asked to start writing back the part of the file Badger has
// finished (sync_file_range with SYNC_FILE_RANGE_WRITE, not waited for),
// once that is writebackChunk or more. The rotation's msync then finds
// the last folio (finishedBefore) plus the larger of a chunk and what the
// store wrote in one interval left to write (at ~5 MB/s of records, about
// 1.5 MiB of 16), though it still waits for a writeback under way and
// pays the filesystem's journal commit.
//
// Only finished pages: the file's last folio, which holds the page Badger
// is copying into, is left out (finishedBefore). The first design wrote
// the whole file back every round, the page being written included, and
// skipped rounds after more than 2 MiB; on a 2-vCPU VM it was measured
// then at ~10 µs of CPU per keyed JSON request. In the load tool on
// 2026-12-06 (four alternating runs each of off, that design and a later
// one that left a fixed 64 KiB out, 100 ms) neither showed a CPU cost
// beyond the runs' noise, while both took keyed streams' p99.9 from ~61
// ms to 21–23 ms. Flat out (BenchmarkKeyedParallel, ~100 MB/s of 4 KiB
// records) a 20 ms interval halves p99.9 but costs ~12 µs of CPU per
// commit and takes p99 from ~2 to ~5 ms; at 100 ms a file fills between
// two rounds and nothing changes.
//
// It changes no durability: with SyncWrites off a commit returns once it
// is in the page cache either way, and the kernel writes dirty pages back
// within dirty_expire_centisecs anyway; this only starts some sooner.
type writeback struct {
	dir  string
	fid  int      // the value-log file f is, -1 for none
	f    *os.File // opened read-only: sync_file_range needs no more
	seen int64    // live.written at the last round
	// end is where f's data ended at the last round, and from where the
	// writeback started last ends: f's bytes before from are written back
	// or being written.
	end, from int64
	// start starts the writeback of f's n bytes from off; dataEnd is where
	// f's data ends (its first hole: Badger creates the file sparse at
	// twice ValueLogFileSize and writes it from the start).
	start   func(f *os.File, off, n int64) error
	dataEnd func(f *os.File) (int64, error)
}

const (
	// writebackChunk: a round starts a writeback only once this much more
	// of the file is finished since the last one started, so the kernel
	// writes the file in a few large extents, as the rotation's msync
	// would, rather than in many small ones.
	writebackChunk = 1 << 20
	// writebackMinMargin and writebackMaxMargin bound what is left out
	// before the file's data end (finishedBefore). The floor is cheap
	// insurance against a data end reported inside the last folio (no
	// write-fault path of ext4, XFS or Btrfs makes one): it helps only
	// where that end is within 64 KiB of the folio's start. The cap is
	// the largest folio the page cache makes of a file on x86-64 with 4
	// KiB pages (PMD order); where pages are 16 or 64 KiB (arm64) folios
	// can be larger, and part of the writer's folio may then be written
	// back early: a cost, not a fault.
	writebackMinMargin = 64 << 10
	writebackMaxMargin = 2 << 20
	pageSize           = 4 << 10
)

// runWriteback runs a writeback round every interval until the store
// closes, on a filesystem whose SEEK_HOLE is known to be cheap (see
// writebackFS); Open counted it in s.bg.
func (s *Store) runWriteback(interval time.Duration) {
	defer s.bg.Done()
	if fs, ok := writebackFS(s.dir); !ok {
		s.log.Info("value-log writeback off: SEEK_HOLE is not known to be cheap on this filesystem",
			slog.String("fs_type", fs))
		return
	}
	wb := newWriteback(s.dir)
	defer wb.close()
	s.every(interval, func() { wb.round(s.live.written.Load()) })
}

func newWriteback(dir string) *writeback {
	return &writeback{dir: dir, fid: -1, start: startWriteback, dataEnd: dataEnd}
}

// round starts the writeback of the newest value-log file's finished part
// (finishedBefore), once writebackChunk or more of it is finished since
// the last round that started one; written is live.written now. A round
// with nothing written since the last costs nothing. The range always starts at the file's start: pages already
// written back cost the kernel only a lookup, and a page left out once
// is taken the next time.
func (wb *writeback) round(written int64) {
	if written == wb.seen {
		return
	}
	wb.seen = written
	end, ok := wb.newestEnd()
	if !ok {
		return
	}
	upto := finishedBefore(end)
	if upto-wb.from < writebackChunk {
		return
	}
	// An error (a file GC removed, a filesystem without it) leaves the
	// rotation's msync to write what is dirty, as without this.
	if wb.start(wb.f, 0, upto) == nil {
		wb.from = upto
	}
}

// finishedBefore is where the finished part of a value-log file whose
// data ends at end ends: before the file's last folio. Badger writes the
// file in order from its start, so the page it is copying into is in the
// folio a write fault last made data (a fault reserves its whole folio,
// and SEEK_HOLE on ext4, XFS and Btrfs counts no read-ahead folio past it
// as data): the last one. Every byte before that folio is written and
// will not be written again. The page cache's folios are naturally
// aligned, so the last one is no larger than the largest power of two
// that divides end; the margin taken is that power of two, within
// writebackMinMargin and writebackMaxMargin: 64 KiB at most rounds.
//
// Writing back a page Badger still writes is never a fault, only a cost:
// the page is written twice and faults again (the first design, which
// wrote back the whole file every round, was measured at ~10 µs of CPU
// per keyed JSON request that way), and where pages are kept stable under
// writeback (Btrfs) Badger's write waits for the disk. One case the rule
// does not cover: XFS with an extent-size hint allocates unwritten extents
// rounded up to it, and SEEK_HOLE then counts zeroed read-ahead folios
// past the writer as data.
//
// Measured on 6.18/ext4: a standalone program writing 1,500-byte entries
// in order through a shared map found the writer inside the last
// power-of-two-aligned block of the data end at each of ~11,000 writes,
// the end at most 16 KiB ahead (TestFinishedBeforeHoldsTheWriter checks
// the same on the machine it runs on). In the load tool's keyed JSON leg
// (three alternating runs of four rounds) the rotation's msync took a
// median of 18.4 ms over 13 rotations with a fixed 2 MiB margin, and 3.7
// ms over 6 with this rule: it has ~1.5 MiB left to write instead of ~3.
func finishedBefore(end int64) int64 {
	margin := int64(writebackMaxMargin)
	if low := end & -end; low > 0 {
		margin = min(max(low, writebackMinMargin), writebackMaxMargin)
	}
	return (end - margin) &^ (pageSize - 1)
}

// newestEnd is where the data of the value-log file Badger writes ends,
// following a rotation to the next file: the directory is read again when
// the file it had did not grow or has no data end to tell (Badger
// truncated it at its rotation), and a file of the same name that is not
// the one it had open (a directory restored) is opened anew.
func (wb *writeback) newestEnd() (int64, bool) {
	var end int64
	err := errNoFile
	if wb.f != nil {
		if end, err = wb.dataEnd(wb.f); err == nil && end != wb.end {
			wb.end = end
			return end, true
		}
	}
	fid, name, ok := newestVlog(wb.dir)
	if !ok {
		return 0, false
	}
	path := filepath.Join(wb.dir, name)
	if fid == wb.fid && wb.same(path) {
		return end, err == nil // still the newest, and as it was
	}
	wb.close()
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	wb.f, wb.fid, wb.from = f, fid, 0
	if wb.end, err = wb.dataEnd(f); err != nil {
		return 0, false
	}
	return wb.end, true
}

// errNoFile: the writeback has no value-log file open.
var errNoFile = errors.New("no value-log file open")

// same reports whether path is the file wb has open.
func (wb *writeback) same(path string) bool {
	if wb.f == nil {
		return false
	}
	open, err1 := wb.f.Stat()
	named, err2 := os.Stat(path)
	return err1 == nil && err2 == nil && os.SameFile(open, named)
}

func (wb *writeback) close() {
	if wb.f != nil {
		wb.f.Close()
		wb.f, wb.fid = nil, -1
	}
}

// newestVlog is the highest-numbered value-log file in dir (Badger names
// them %06d.vlog): the one Badger writes to.
func newestVlog(dir string) (fid int, name string, ok bool) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, "", false
	}
	fid = -1
	for _, e := range entries {
		n, found := strings.CutSuffix(e.Name(), ".vlog")
		if !found {
			continue
		}
		if id, err := strconv.Atoi(n); err == nil && id > fid {
			fid, name = id, e.Name()
		}
	}
	return fid, name, fid >= 0
}
