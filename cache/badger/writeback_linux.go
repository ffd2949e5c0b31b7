package badgerstore

import (
	"os"

	"golang.org/x/sys/unix"
)

// writebackSupported: runWriteback runs (see writeback).
const writebackSupported = true

// startWriteback asks the kernel to start writing f's dirty pages back,
// without waiting for it, once the writeback the last round started has
// finished (so that rounds do not pile up on a slow disk).
func startWriteback(f *os.File) error {
	return unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE)
}
