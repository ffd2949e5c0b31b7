package badgerstore

import (
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
// writeback of up to 16 MiB, 70 ms measured with strace under the load
// tool's keyed leg, during which no commit completes. That was the keyed
// p99.9. So with Options.WritebackInterval set (store.writeback_interval),
// every interval in which the store wrote the kernel is asked to start
// writing the file back (sync_file_range with SYNC_FILE_RANGE_WRITE, which
// does not wait for it), and the rotation's msync finds little left to
// write.
//
// It is off by default because it costs CPU: writing back pages of a
// mapping the process is writing on another CPU costs far more than the
// same writeback at the rotation, when every commit waits and the other
// CPU is idle. On a 2-vCPU VM, 16 MiB written back in rounds while a
// writer ran took ~130 ms of CPU against ~20 ms for one msync at the end;
// in the load tool's keyed legs it took ~10 µs per keyed JSON request and
// 21% of keyed stream throughput, for a p99.9 of ~22 ms instead of ~50.
//
// It changes no durability: with SyncWrites off a commit returns once it
// is in the page cache either way, and the kernel writes dirty pages back
// within dirty_expire_centisecs anyway; this only starts some sooner.
type writeback struct {
	dir     string
	fid     int      // the value-log file f is, -1 for none
	f       *os.File // opened read-only: sync_file_range needs no more
	seen    int64    // live.written at the last round
	started int64    // live.written at the last writeback started
	start   func(*os.File) error
}

const (
	// writebackMaxBytes: a round after more than this was written is
	// skipped. At such a rate (20 MB/s at a 100 ms interval) the file
	// rotates within a second anyway, and the writeback contends with
	// Badger's writes to the same file: BenchmarkKeyedParallel (4 KiB
	// records, ~60 MB/s) took 55–100 µs of CPU per commit with every round
	// run instead of 38–55, and its p99.9 was no better.
	writebackMaxBytes = 2 << 20
)

// runWriteback runs a writeback round every interval until the store
// closes; Open counted it in s.bg.
func (s *Store) runWriteback(interval time.Duration) {
	wb := &writeback{dir: s.dir, fid: -1, start: startWriteback}
	defer wb.close()
	s.every(interval, func() { wb.round(s.live.written.Load()) })
}

// round starts the writeback of the newest value-log file if the store
// has written since the last start, but not more than writebackMaxBytes
// since the last round (written is live.written now): a burst's tail is
// written back by the first round after it.
func (wb *writeback) round(written int64) {
	since := written - wb.seen
	wb.seen = written
	if written == wb.started || since > writebackMaxBytes {
		return
	}
	wb.started = written
	fid, name, ok := newestVlog(wb.dir)
	if !ok {
		return
	}
	if fid != wb.fid {
		wb.close()
		f, err := os.Open(filepath.Join(wb.dir, name))
		if err != nil {
			return
		}
		wb.f, wb.fid = f, fid
	}
	// An error (a file GC removed, a filesystem without it) leaves the
	// rotation's msync to write what is dirty, as without this.
	_ = wb.start(wb.f)
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
