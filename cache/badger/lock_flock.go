//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package badgerstore

import (
	"errors"
	"os"
	"syscall"
)

// dirLocked reports whether another open file holds the exclusive flock that
// Badger takes on its directory. Called only after badger.Open failed, to
// tell a second gateway on the same directory from other failures without
// reading Badger's error text.
func dirLocked(dir string) bool {
	f, err := os.Open(dir)
	if err != nil {
		return false
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if err == nil {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		return false
	}
	return errors.Is(err, syscall.EWOULDBLOCK)
}
