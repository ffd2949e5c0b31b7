package badgerstore

import (
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
// written through its map counts as data before it is written back.
func dataEnd(f *os.File) (int64, error) {
	return unix.Seek(int(f.Fd()), 0, unix.SEEK_HOLE)
}
