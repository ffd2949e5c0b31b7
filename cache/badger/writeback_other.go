//go:build !linux

package badgerstore

import (
	"errors"
	"os"
)

// writebackSupported: without sync_file_range, runWriteback does not run
// and the value log's rotation writes back all it holds (see writeback).
const writebackSupported = false

func writebackFS(string) (string, bool) { return "unknown", false }

func startWriteback(*os.File, int64, int64) error {
	return errors.New("sync_file_range not supported on this platform")
}

func dataEnd(*os.File) (int64, error) {
	return 0, errors.New("sync_file_range not supported on this platform")
}
