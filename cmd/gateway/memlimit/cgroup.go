package memlimit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// unlimitedFrom is where a cgroup v1 limit means "none": v1 writes the
// largest page-aligned int64 (9223372036854771712 with 4 KiB pages) when
// no limit is set. 4 EiB is as good as unlimited on any page size.
const unlimitedFrom = 1 << 62

// CgroupLimit is the memory limit of the calling process's cgroup, read
// under root ("/" on a live system; a fake tree in tests): the smallest
// limit set on its cgroup or any ancestor visible in the mount, in bytes,
// or 0 when none is set or the process is in no cgroup:
//
//   - cgroup v1 (and hybrid hosts, where the memory controller is on v1):
//     memory.limit_in_bytes, and memory.stat's hierarchical_memory_limit,
//     which includes ancestors the mount does not show; the "unlimited"
//     value counts as none;
//   - cgroup v2: memory.max, "max" being none.
func CgroupLimit(root string) (int64, error) {
	cg, ok, err := Find(root)
	if err != nil || !ok {
		return 0, err
	}
	if cg.V2 {
		return walk(cg, readV2)
	}
	return walk(cg, readV1)
}

// Cgroup is the calling process's memory cgroup, as Find sees it.
type Cgroup struct {
	// Dir is its directory; Top, the mount point of its hierarchy, the
	// highest directory this process can see.
	Dir, Top string
	V2       bool
}

// Find finds the calling process's memory cgroup under root, from
// /proc/self/cgroup and /proc/self/mountinfo: on the v1 memory hierarchy
// when the memory controller is on v1 (hybrid hosts too), else on the v2
// unified hierarchy. ok is false when the process is in none.
func Find(root string) (cg Cgroup, ok bool, err error) {
	data, err := os.ReadFile(filepath.Join(root, "proc/self/cgroup"))
	if errors.Is(err, fs.ErrNotExist) {
		return Cgroup{}, false, nil // not Linux, or no cgroups
	}
	if err != nil {
		return Cgroup{}, false, err
	}
	mi, err := os.ReadFile(filepath.Join(root, "proc/self/mountinfo"))
	if err != nil {
		return Cgroup{}, false, err
	}
	mounts := parseMountInfo(mi)
	v1, v2, hasV1, hasV2 := parseCgroup(data)
	if hasV1 {
		if m, ok := findMount(mounts, isV1Memory); ok {
			return at(root, m, v1, false), true, nil
		}
	}
	if hasV2 {
		if m, ok := findMount(mounts, func(m mount) bool { return m.fsType == "cgroup2" }); ok {
			return at(root, m, v2, true), true, nil
		}
	}
	return Cgroup{}, false, nil
}

// at is the cgroup at cgPath (as /proc/self/cgroup names it) in mount m.
// Inside a cgroup namespace the mount's root is the process's own cgroup,
// so it is the mount point; a path outside the mount's root (a namespace
// entered after the mount) is taken to be the mount point too.
func at(root string, m mount, cgPath string, v2 bool) Cgroup {
	top := filepath.Join(root, m.point)
	dir := top
	if rel, err := filepath.Rel(m.root, path.Clean(cgPath)); err == nil && !strings.HasPrefix(rel, "..") {
		dir = filepath.Join(top, rel)
	}
	return Cgroup{Dir: dir, Top: top, V2: v2}
}

// parseCgroup reads /proc/self/cgroup ("id:controllers:path" lines): the
// path of the v1 hierarchy holding the memory controller, and of the v2
// unified hierarchy ("0::path").
func parseCgroup(data []byte) (v1, v2 string, hasV1, hasV2 bool) {
	for line := range strings.Lines(string(data)) {
		id, rest, ok1 := strings.Cut(strings.TrimSpace(line), ":")
		ctrls, p, ok2 := strings.Cut(rest, ":")
		switch {
		case !ok1 || !ok2:
		case id == "0" && ctrls == "":
			v2, hasV2 = p, true
		case slices.Contains(strings.Split(ctrls, ","), "memory"):
			v1, hasV1 = p, true
		}
	}
	return v1, v2, hasV1, hasV2
}

// mount is a line of /proc/self/mountinfo, the fields used here.
type mount struct {
	root, point, fsType string
	superOpts           []string
}

// parseMountInfo reads /proc/self/mountinfo: "id parent maj:min root point
// options [optional...] - fstype source superoptions". Malformed lines are
// skipped.
func parseMountInfo(data []byte) []mount {
	var out []mount
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			continue
		}
		out = append(out, mount{root: unescape(f[3]), point: unescape(f[4]), fsType: g[0], superOpts: strings.Split(g[2], ",")})
	}
	return out
}

// unescape undoes mountinfo's octal escapes of space, tab, newline and
// backslash (\040, \011, \012, \134).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

func isV1Memory(m mount) bool {
	return m.fsType == "cgroup" && slices.Contains(m.superOpts, "memory")
}

func findMount(ms []mount, match func(mount) bool) (mount, bool) {
	for _, m := range ms {
		if match(m) {
			return m, true
		}
	}
	return mount{}, false
}

// walk reads the limit of cg and of each ancestor up to its Top, and
// returns the smallest (0 = none).
func walk(cg Cgroup, read func(dir string) (int64, error)) (int64, error) {
	dir, top := cg.Dir, cg.Top
	var least int64
	for {
		n, err := read(dir)
		if err != nil {
			return 0, err
		}
		if n > 0 && (least == 0 || n < least) {
			least = n
		}
		if dir == top || !strings.HasPrefix(dir, top) {
			return least, nil
		}
		dir = filepath.Dir(dir)
	}
}

// readV1 is a v1 memory cgroup's limit, 0 for none or no file.
func readV1(dir string) (int64, error) {
	least, err := readNumber(filepath.Join(dir, "memory.limit_in_bytes"))
	if err != nil {
		return 0, err
	}
	stat, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	for line := range strings.Lines(string(stat)) {
		if v, ok := strings.CutPrefix(line, "hierarchical_memory_limit "); ok {
			n, err := parseLimit(v)
			if err != nil {
				return 0, fmt.Errorf("%s: hierarchical_memory_limit: %w", filepath.Join(dir, "memory.stat"), err)
			}
			if n > 0 && (least == 0 || n < least) {
				least = n
			}
		}
	}
	return least, nil
}

// readV2 is a v2 cgroup's memory.max, 0 for "max" or no file.
func readV2(dir string) (int64, error) {
	return readNumber(filepath.Join(dir, "memory.max"))
}

// readNumber reads a file holding one limit; 0 when absent or unlimited.
func readNumber(file string) (int64, error) {
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n, err := parseLimit(string(b))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", file, err)
	}
	return n, nil
}

// parseLimit parses a limit file's content: v2's "max" and v1's
// unlimited value are 0.
func parseLimit(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "max" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, err
	}
	if n >= unlimitedFrom {
		return 0, nil
	}
	return int64(n), nil
}
