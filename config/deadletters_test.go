package config

import (
	"strings"
	"testing"
)

// The bytes bound on one client's dead letters: set, none (-1), or by
// default a 32nd of store.max_bytes (32 MiB with no cap).
func TestDeadLettersPerClientBytes(t *testing.T) {
	for _, tc := range []struct {
		set, storeMax, want int64
	}{
		{0, 768 << 20, 24 << 20},
		{0, 0, 32 << 20},
		{5 << 20, 768 << 20, 5 << 20},
		{-1, 768 << 20, 0},
	} {
		if got := (DeadLetters{MaxBytesPerClient: tc.set}).PerClientBytes(tc.storeMax); got != tc.want {
			t.Errorf("max_bytes_per_client %d, store.max_bytes %d: %d, want %d", tc.set, tc.storeMax, got, tc.want)
		}
	}
	c := Default()
	c.DeadLetters.MaxBytesPerClient = -2
	c.DeadLetters.MaxPerClient = -1
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "dead_letters.max_bytes_per_client") || !strings.Contains(err.Error(), "dead_letters.max_per_client") {
		t.Fatalf("negative bounds: %v", err)
	}
}
