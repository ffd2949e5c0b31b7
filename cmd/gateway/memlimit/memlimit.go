// Package memlimit sets the Go runtime's soft memory limit (GOMEMLIMIT)
// from the memory limit of the process's cgroup, so that a gateway in a
// container or a pod with limits.memory collects garbage before the kernel
// kills it, with no configuration.
//
// It reads the cgroup itself (CgroupLimit) rather than using
// github.com/KimMachineGun/automemlimit: that library handles the same
// cases (v1, v2, nested, hybrid) but reads only the live /proc paths and
// the process environment, so neither the cgroup fixtures in testdata nor
// run's getenv could reach it.
package memlimit

import (
	"math"
	"runtime/debug"
)

// DefaultRatio is the share of the cgroup limit given to the Go runtime
// when Options.Ratio is unset: the rest is for what the runtime does not
// count — Badger's mmapped files that are dirty, thread stacks, the
// binary — and for the heap overshooting its goal during a collection.
const DefaultRatio = 0.8

// Source says where the Go memory limit in force came from.
type Source string

const (
	FromEnv    Source = "env"    // GOMEMLIMIT was set
	FromCgroup Source = "cgroup" // Ratio × the cgroup limit
	FromNone   Source = "none"   // no limit found: the runtime's default, none
)

// Options configures Apply. The zero value reads the live system.
type Options struct {
	// Root is where /proc and /sys are. If "", "/".
	Root string
	// Ratio of the cgroup limit set as the Go memory limit. If <= 0 or
	// > 1, DefaultRatio.
	Ratio float64
	// Getenv reads GOMEMLIMIT. If nil, nothing is set in the environment.
	Getenv func(string) string
	// SetLimit sets the runtime's limit and returns the previous one, as
	// debug.SetMemoryLimit (a negative argument only reads). If nil,
	// debug.SetMemoryLimit.
	SetLimit func(int64) int64
}

// Result is what Apply found and did.
type Result struct {
	// Cgroup is the cgroup's memory limit in bytes, 0 when none was found.
	Cgroup int64
	// GoLimit is the Go memory limit in force after Apply; math.MaxInt64
	// means none.
	GoLimit int64
	// Source is where GoLimit came from.
	Source Source
	// Err is why the cgroup could not be read (then Cgroup is 0): not
	// fatal, the gateway runs without a limit, as before.
	Err error
}

// Apply sets the Go memory limit to Ratio × the cgroup limit, unless
// GOMEMLIMIT is set (the runtime has applied it already) or no limit is
// found. The cgroup is read either way, for the store's budget and the
// startup log.
func Apply(o Options) Result {
	if o.Root == "" {
		o.Root = "/"
	}
	if o.Ratio <= 0 || o.Ratio > 1 {
		o.Ratio = DefaultRatio
	}
	if o.SetLimit == nil {
		o.SetLimit = debug.SetMemoryLimit
	}
	var r Result
	r.Cgroup, r.Err = CgroupLimit(o.Root)
	switch {
	case o.Getenv != nil && o.Getenv("GOMEMLIMIT") != "":
		r.Source, r.GoLimit = FromEnv, o.SetLimit(-1)
	case r.Cgroup > 0:
		r.Source, r.GoLimit = FromCgroup, int64(o.Ratio*float64(r.Cgroup))
		o.SetLimit(r.GoLimit)
	default:
		r.Source, r.GoLimit = FromNone, o.SetLimit(-1)
	}
	return r
}

// Limited reports whether a Go memory limit is in force.
func (r Result) Limited() bool { return r.GoLimit > 0 && r.GoLimit < math.MaxInt64 }
