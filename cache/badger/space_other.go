//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package badgerstore

import "errors"

// statfsFree is not implemented here: free space is unknown, so the store
// is never full for lack of disk (store.max_bytes still applies).
func statfsFree(string) (uint64, error) {
	return 0, errors.New("statfs not supported on this platform")
}
