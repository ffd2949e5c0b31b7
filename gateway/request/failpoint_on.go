//go:build failpoints

package request

import (
	"os"
	"strings"
	"syscall"
)

// armed holds the failpoints named in LLMGATE_FAILPOINTS (comma-separated).
// Only test builds (-tags failpoints) contain this file, in the spirit of
// etcd's gofail: crash tests reach an exact moment deterministically.
var armed = func() map[string]bool {
	m := map[string]bool{}
	for _, n := range strings.Split(os.Getenv("LLMGATE_FAILPOINTS"), ",") {
		if n = strings.TrimSpace(n); n != "" {
			m[n] = true
		}
	}
	return m
}()

// failpoint kills the process with SIGKILL — no deferred function, no
// flush, no graceful anything — when name is armed.
func failpoint(name string) {
	if armed[name] {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}
