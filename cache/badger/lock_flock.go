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

// lockDir takes the exclusive flock Badger takes on its directory, without
// waiting: ErrLocked when another open file holds it. The store holds it
// while it has Badger open read-only (with Badger's own guard bypassed, as
// a read-only open takes only a shared lock) or stands in for it in memory,
// so that no second process opens the directory meanwhile.
func lockDir(dir string) (*os.File, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if err == nil {
		return f, nil
	}
	f.Close()
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return nil, ErrLocked
	}
	return nil, err
}
