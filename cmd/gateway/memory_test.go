package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"math"
	"runtime/debug"
	"testing"

	badgerstore "github.com/llmgate/llmgate/cache/badger"
	"github.com/llmgate/llmgate/config"
)

// TestApplyMemory: in a 256 MiB cgroup (a fixture), with nothing
// configured, the Go limit is 0.8 × 256 MiB, the store's budget 64 MiB and
// the in-flight bound 64 MiB (2 × the 32 MiB body limit); the startup line
// says so. Configured values are kept.
func TestApplyMemory(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	const mib = 1 << 20
	for _, tc := range []struct {
		name, root           string
		budget, inflight     int64
		wantBudget, wantInfl int64
		wantFrom             string
	}{
		{"256 MiB cgroup", "memlimit/testdata/v2-limited", 0, 0, 64 * mib, 64 * mib, "cgroup"},
		{"configured values kept", "memlimit/testdata/v2-limited", 100 * mib, 40 * mib, 100 * mib, 40 * mib, "cgroup"},
		{"no limit", "memlimit/testdata/v2-max", 0, 0, badgerstore.DefaultMemoryBudget, 64 * mib, "none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetMemoryLimit(math.MaxInt64)
			cfg := config.Default()
			cfg.Memory.BudgetBytes, cfg.Limits.MaxInflightBytes = tc.budget, tc.inflight
			var logs bytes.Buffer
			applyMemory(&cfg, func(string) string { return "" }, tc.root, slog.New(slog.NewJSONHandler(&logs, nil)))
			if cfg.Memory.BudgetBytes != tc.wantBudget || cfg.Limits.MaxInflightBytes != tc.wantInfl {
				t.Errorf("budget %d, inflight %d; want %d, %d", cfg.Memory.BudgetBytes, cfg.Limits.MaxInflightBytes, tc.wantBudget, tc.wantInfl)
			}
			var line struct {
				Msg        string `json:"msg"`
				From       string `json:"gomemlimit_from"`
				GoMaxProcs int    `json:"gomaxprocs"`
				Cgroup     int64  `json:"cgroup_limit"`
			}
			if err := json.Unmarshal(logs.Bytes(), &line); err != nil {
				t.Fatalf("log %q: %v", logs.String(), err)
			}
			if line.Msg != "memory" || line.From != tc.wantFrom || line.GoMaxProcs < 1 {
				t.Errorf("log line %s", logs.String())
			}
			if tc.wantFrom == "cgroup" {
				if got := debug.SetMemoryLimit(-1); got != 256*mib*4/5 {
					t.Errorf("Go memory limit %d, want 0.8 × 256 MiB", got)
				}
			}
		})
	}
}
