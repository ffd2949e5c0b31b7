package memlimit

import (
	"math"
	"path/filepath"
	"testing"
)

const mib = 1 << 20

// TestCgroupLimit reads each fake cgroup tree in testdata as the live
// system would be read.
func TestCgroupLimit(t *testing.T) {
	for _, tc := range []struct {
		name string
		want int64
	}{
		{"v1-unlimited", 0},       // 9223372036854771712 everywhere
		{"v1-limited", 256 * mib}, // in a cgroup namespace: the mount's root is the container
		{"v1-nested", 256 * mib},  // own cgroup unlimited, parent 256 MiB, grandparent 1 GiB
		{"v1-hierarchical", 512 * mib},
		{"v2-max", 0},
		{"v2-limited", 256 * mib},
		{"v2-nested", 256 * mib}, // own "max", parent 256 MiB, grandparent 1 GiB
		{"hybrid", 512 * mib},    // memory on v1, nothing on the unified hierarchy
		{"no-cgroup", 0},         // no /proc/self/cgroup
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CgroupLimit(filepath.Join("testdata", tc.name))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("CgroupLimit = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestCgroupLimitMalformed(t *testing.T) {
	if got, err := CgroupLimit("testdata/malformed"); err == nil {
		t.Fatalf("CgroupLimit = %d, nil; want an error for memory.max \"lots\"", got)
	}
}

// fakeRuntime stands in for debug.SetMemoryLimit.
type fakeRuntime struct{ limit int64 }

func (f *fakeRuntime) set(n int64) int64 {
	prev := f.limit
	if n >= 0 {
		f.limit = n
	}
	return prev
}

func TestApply(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "GOMEMLIMIT" {
				return v
			}
			return ""
		}
	}
	for _, tc := range []struct {
		name, root, gomemlimit string
		ratio                  float64
		wantCgroup, wantLimit  int64
		wantSource             Source
	}{
		{"cgroup, default ratio", "testdata/v2-limited", "", 0, 256 * mib, 256 * mib * 4 / 5, FromCgroup},
		{"cgroup, ratio 0.5", "testdata/v1-nested", "", 0.5, 256 * mib, 128 * mib, FromCgroup},
		{"GOMEMLIMIT wins", "testdata/v2-limited", "100MiB", 0, 256 * mib, 100 * mib, FromEnv},
		{"no limit", "testdata/v2-max", "", 0, 0, math.MaxInt64, FromNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := &fakeRuntime{limit: math.MaxInt64}
			if tc.gomemlimit != "" {
				rt.limit = 100 * mib // what the runtime parsed from the environment
			}
			r := Apply(Options{Root: tc.root, Ratio: tc.ratio, Getenv: env(tc.gomemlimit), SetLimit: rt.set})
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			if r.Cgroup != tc.wantCgroup || r.GoLimit != tc.wantLimit || r.Source != tc.wantSource {
				t.Fatalf("Apply = %+v, want cgroup %d, limit %d from %s", r, tc.wantCgroup, tc.wantLimit, tc.wantSource)
			}
			if rt.limit != tc.wantLimit {
				t.Fatalf("runtime limit %d, want %d", rt.limit, tc.wantLimit)
			}
		})
	}
}

func FuzzParseMountInfo(f *testing.F) {
	f.Add([]byte("34 30 0:31 / /sys/fs/cgroup/memory rw shared:14 - cgroup cgroup rw,memory\n"))
	f.Add([]byte("1 2 3 /a\\040b /c - cgroup2 none rw\n - \n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, m := range parseMountInfo(data) {
			if m.fsType == "" {
				t.Fatalf("mount with no type from %q", data)
			}
		}
	})
}

// TestAt: a cgroup path joins its mount at the mount's root, which is not
// "/" inside a cgroup namespace or a bind mount.
func TestAt(t *testing.T) {
	for _, tc := range []struct {
		m    mount
		path string
		want string
	}{
		{mount{point: "/sys/fs/cgroup/memory", root: "/"}, "/process_api/abc", "/sys/fs/cgroup/memory/process_api/abc"},
		{mount{point: "/sys/fs/cgroup", root: "/kubepods/pod1"}, "/kubepods/pod1/ctr", "/sys/fs/cgroup/ctr"},
		{mount{point: "/sys/fs/cgroup", root: "/"}, "/", "/sys/fs/cgroup"},
	} {
		if got := at("", tc.m, tc.path, false).Dir; got != tc.want {
			t.Errorf("at(%v, %q) = %q, want %q", tc.m, tc.path, got, tc.want)
		}
	}
}
