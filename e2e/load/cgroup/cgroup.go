// Package cgroup makes a memory cgroup for one child process — a limit,
// swap off, and the kernel's OOM-kill count — as a container runtime does
// for a container with `limits.memory`, so the load tool and the e2e tests
// can run the gateway in one and see whether it survives.
//
// The group is made inside the caller's own memory cgroup (so it nests
// under whatever limits the caller already has), on cgroup v2 (memory.max,
// memory.swap.max, memory.events) when the unified hierarchy has the
// memory controller, else on v1 (memory.limit_in_bytes,
// memory.memsw.limit_in_bytes, memory.oom_control). A process joins with
// Enter before it allocates: the load tool re-executes itself, enters,
// then execs the gateway.
package cgroup

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/llmgate/llmgate/cmd/gateway/memlimit"
)

// ErrUnavailable wraps every reason a memory cgroup cannot be made here
// (no memory controller, not writable, swap not limitable).
var ErrUnavailable = errors.New("no writable memory cgroup")

// Group is a memory cgroup made by New.
type Group struct {
	Dir string // its directory under the cgroup filesystem
	V2  bool
}

// Stats is what the kernel says about a group.
type Stats struct {
	LimitBytes int64 `json:"limit_bytes"`
	UsageBytes int64 `json:"usage_bytes"` // memory.current / memory.usage_in_bytes
	// PeakBytes is memory.peak (v2, Linux ≥ 5.19) or
	// memory.max_usage_in_bytes (v1); -1 when the kernel has neither.
	PeakBytes int64 `json:"peak_bytes"`
	OOMKills  int64 `json:"oom_kills"` // oom_kill in memory.events / memory.oom_control
	// Anon and File are the group's anonymous and file-backed pages
	// (memory.stat anon/file, v1 rss/cache).
	AnonBytes int64 `json:"anon_bytes"`
	FileBytes int64 `json:"file_bytes"`
}

// New makes a group called name inside the caller's memory cgroup with a
// limit of limitBytes and no swap. The error wraps ErrUnavailable when
// this machine cannot give one.
func New(name string, limitBytes int64) (*Group, error) {
	parent, v2, err := ownDir()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if v2 {
		// A v2 group's children get the memory controller only when it is
		// in the parent's subtree_control; harmless if it already is.
		_ = os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+memory"), 0)
	}
	g := &Group{Dir: filepath.Join(parent, name), V2: v2}
	if err := os.Mkdir(g.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	lim := strconv.FormatInt(limitBytes, 10)
	files := [][2]string{{"memory.limit_in_bytes", lim}, {"memory.memsw.limit_in_bytes", lim}}
	if v2 {
		files = [][2]string{{"memory.max", lim}, {"memory.swap.max", "0"}}
	}
	for _, f := range files {
		err := os.WriteFile(filepath.Join(g.Dir, f[0]), []byte(f[1]), 0)
		if err != nil && errors.Is(err, os.ErrNotExist) && strings.Contains(f[0], "sw") && noSwap() {
			continue // swap accounting is off, but there is no swap to limit
		}
		if err != nil {
			_ = os.Remove(g.Dir)
			return nil, fmt.Errorf("%w: %s: %v", ErrUnavailable, f[0], err)
		}
	}
	return g, nil
}

// Open is the group at dir, made elsewhere (v2 when it has memory.max).
func Open(dir string) *Group {
	_, err := os.Stat(filepath.Join(dir, "memory.max"))
	return &Group{Dir: dir, V2: err == nil}
}

// Enter moves the calling process into the group at dir (a Group's Dir).
// Memory it allocated before stays charged where it was.
func Enter(dir string) error {
	return os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0)
}

// Stats reads the group's figures.
func (g *Group) Stats() (Stats, error) {
	read := func(name string) (int64, error) {
		b, err := os.ReadFile(filepath.Join(g.Dir, name))
		if err != nil {
			return -1, err
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return -1, nil
		}
		return strconv.ParseInt(s, 10, 64)
	}
	names := [4]string{"memory.limit_in_bytes", "memory.usage_in_bytes", "memory.max_usage_in_bytes", "memory.oom_control"}
	statAnon, statFile := "rss", "cache"
	if g.V2 {
		names = [4]string{"memory.max", "memory.current", "memory.peak", "memory.events"}
		statAnon, statFile = "anon", "file"
	}
	var st Stats
	var err1, err2 error
	st.LimitBytes, err1 = read(names[0])
	st.UsageBytes, err2 = read(names[1])
	st.PeakBytes, _ = read(names[2])
	kv, err3 := readKeyed(filepath.Join(g.Dir, names[3]))
	ms, err4 := readKeyed(filepath.Join(g.Dir, "memory.stat"))
	st.OOMKills, st.AnonBytes, st.FileBytes = kv["oom_kill"], ms[statAnon], ms[statFile]
	return st, errors.Join(err1, err2, err3, err4)
}

// Remove deletes the group; its processes must have exited.
func (g *Group) Remove() error { return os.Remove(g.Dir) }

// readKeyed reads a "key value" per line file.
func readKeyed(path string) (map[string]int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m := map[string]int64{}
	for line := range bytes.Lines(b) {
		f := strings.Fields(string(line))
		if len(f) == 2 {
			if n, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				m[f[0]] = n
			}
		}
	}
	return m, nil
}

// noSwap reports whether the machine has no swap at all.
func noSwap() bool {
	b, err := os.ReadFile("/proc/swaps")
	return err == nil && len(bytes.Split(bytes.TrimSpace(b), []byte("\n"))) <= 1
}

// ownDir finds the directory of the caller's memory cgroup (see
// memlimit.Find); on v2 its group must have the memory controller.
func ownDir() (dir string, v2 bool, err error) {
	cg, ok, err := memlimit.Find("/")
	if err != nil {
		return "", false, err
	}
	if !ok {
		return "", false, errors.New("neither a v2 hierarchy nor a v1 memory hierarchy is mounted")
	}
	if cg.V2 {
		c, err := os.ReadFile(filepath.Join(cg.Dir, "cgroup.controllers"))
		if err != nil || !strings.Contains(" "+strings.TrimSpace(string(c))+" ", " memory ") {
			return "", false, fmt.Errorf("the v2 group %s has no memory controller", cg.Dir)
		}
	}
	return cg.Dir, cg.V2, nil
}
