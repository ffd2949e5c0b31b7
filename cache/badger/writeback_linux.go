package badgerstore

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// writebackSupported: runWriteback runs (see writeback).
const writebackSupported = true

// startWriteback asks the kernel to start writing f's dirty pages in
// [off, off+n) back, without waiting for it.
func startWriteback(f *os.File, off, n int64) error {
	return unix.SyncFileRange(int(f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
}

// dataEnd is where f's data ends: its first hole. A page Badger has
// written through its map counts as data before it is written back. A
// file without a hole has no end to tell: one Badger has rotated (and
// truncated to its data), or one on a filesystem that reports none, whose
// end would be past what Badger has written; the rotation's msync writes
// such a file back, as without writeback.
func dataEnd(f *os.File) (int64, error) {
	hole, err := unix.Seek(int(f.Fd()), 0, unix.SEEK_HOLE)
	if err != nil {
		return 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if hole >= fi.Size() {
		return 0, errNoHole
	}
	return hole, nil
}

var errNoHole = errors.New("no hole: the file's data end is unknown")
