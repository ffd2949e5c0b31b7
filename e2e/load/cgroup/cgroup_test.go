package cgroup

import (
	"os"
	"path/filepath"
	"testing"
)

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStats reads a v1 and a v2 group from fixture files, as the kernel
// writes them: the OOM-kill count from memory.oom_control / memory.events,
// anonymous and file pages from memory.stat under each version's names.
func TestStats(t *testing.T) {
	v1 := t.TempDir()
	writeFiles(t, v1, map[string]string{
		"memory.limit_in_bytes":     "268435456\n",
		"memory.usage_in_bytes":     "104857600\n",
		"memory.max_usage_in_bytes": "268431360\n",
		"memory.oom_control":        "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
		"memory.stat":               "cache 41943040\nrss 62914560\nrss_huge 0\n",
	})
	v2 := t.TempDir()
	writeFiles(t, v2, map[string]string{
		"memory.max":     "max\n",
		"memory.current": "52428800\n",
		"memory.peak":    "73400320\n",
		"memory.events":  "low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\noom_group_kill 0\n",
		"memory.stat":    "anon 31457280\nfile 20971520\nkernel 1048576\n",
	})
	for _, tc := range []struct {
		dir  string
		v2   bool
		want Stats
	}{
		{v1, false, Stats{LimitBytes: 256 << 20, UsageBytes: 100 << 20, PeakBytes: 268431360, OOMKills: 2, AnonBytes: 60 << 20, FileBytes: 40 << 20}},
		{v2, true, Stats{LimitBytes: -1, UsageBytes: 50 << 20, PeakBytes: 70 << 20, OOMKills: 1, AnonBytes: 30 << 20, FileBytes: 20 << 20}},
	} {
		g := Open(tc.dir)
		if g.V2 != tc.v2 {
			t.Errorf("%s: V2 = %v, want %v", tc.dir, g.V2, tc.v2)
		}
		got, err := g.Stats()
		if err != nil {
			t.Errorf("%s: %v", tc.dir, err)
		}
		if got != tc.want {
			t.Errorf("v2=%v: Stats = %+v, want %+v", tc.v2, got, tc.want)
		}
	}
}
