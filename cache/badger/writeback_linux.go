package badgerstore

import (
	"os"

	"golang.org/x/sys/unix"
)

// writebackSupported: runWriteback runs (see writeback).
const writebackSupported = true

// startWriteback asks the kernel to start writing f's dirty pages back,
// without waiting for it.
func startWriteback(f *os.File) error {
	return unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
}
