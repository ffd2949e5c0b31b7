//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package badgerstore

// dirLocked cannot probe the lock here; Open then reports Badger's own
// error, which says the directory is locked.
func dirLocked(string) bool { return false }
