//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package badgerstore

import "golang.org/x/sys/unix"

// statfsFree is the space an unprivileged process may still use on the
// filesystem holding dir (f_bavail: root's reserved blocks excluded).
func statfsFree(dir string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return uint64(st.Bavail) * uint64(st.Bsize), nil
}
