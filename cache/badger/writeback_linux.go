package badgerstore

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// writebackSupported: runWriteback runs (see writeback).
const writebackSupported = true

// writebackFS reports whether dir is on a filesystem where SEEK_HOLE is
// cheap and sync_file_range starts a writeback without waiting for it:
// ext2/3/4, XFS, Btrfs, and overlayfs (which asks the filesystem under
// it; a container's root). Elsewhere the round does not run: on ZFS, for
// one, SEEK_HOLE writes back every dirty page of a mapped file first, the
// page Badger is writing included; on tmpfs nothing is written back.
func writebackFS(dir string) (string, bool) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "unknown", false
	}
	fs := fmt.Sprintf("0x%x", uint64(st.Type))
	switch uint64(st.Type) {
	case unix.EXT4_SUPER_MAGIC, unix.XFS_SUPER_MAGIC, unix.BTRFS_SUPER_MAGIC, unix.OVERLAYFS_SUPER_MAGIC:
		return fs, true
	}
	return fs, false
}

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
