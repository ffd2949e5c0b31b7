package main

import (
	"log/slog"
	"runtime"

	badgerstore "github.com/llmgate/llmgate/cache/badger"
	"github.com/llmgate/llmgate/cmd/gateway/memlimit"
	"github.com/llmgate/llmgate/config"
)

// minBudget is the smallest memory budget derived from a memory limit.
const minBudget = 16 << 20

// applyMemory sets the Go runtime's memory limit from the cgroup (see
// package memlimit), then sizes what config leaves to it: the store's
// memory budget (memory.budget_bytes: a quarter of the limit) and the
// bound on request bytes in flight (limits.max_inflight_bytes: the
// larger of the budget and two of the largest bodies). It logs one line
// with what it found and chose.
func applyMemory(cfg *config.Config, getenv func(string) string, root string, log *slog.Logger) {
	r := memlimit.Apply(memlimit.Options{Root: root, Ratio: cfg.Memory.LimitRatio, Getenv: getenv})
	if cfg.Memory.BudgetBytes <= 0 {
		cfg.Memory.BudgetBytes = budgetFor(r)
	}
	if cfg.Limits.MaxInflightBytes <= 0 {
		cfg.Limits.MaxInflightBytes = max(cfg.Memory.BudgetBytes, 2*cfg.Limits.MaxBodyBytes)
	}
	attrs := []any{"cgroup_limit", r.Cgroup, "gomemlimit", r.GoLimit, "gomemlimit_from", string(r.Source),
		"gomaxprocs", runtime.GOMAXPROCS(0), "budget_bytes", cfg.Memory.BudgetBytes,
		"max_inflight_bytes", cfg.Limits.MaxInflightBytes}
	if !r.Limited() {
		attrs[3] = "none"
	}
	if r.Err != nil {
		attrs = append(attrs, "cgroup_err", r.Err)
	}
	log.Info("memory", attrs...)
}

// budgetFor is the default memory budget: a quarter of the memory limit
// (the cgroup's, else GOMEMLIMIT's), or badgerstore.DefaultMemoryBudget
// when there is none.
func budgetFor(r memlimit.Result) int64 {
	limit := r.Cgroup
	if limit == 0 && r.Source == memlimit.FromEnv && r.Limited() {
		limit = r.GoLimit
	}
	if limit == 0 {
		return badgerstore.DefaultMemoryBudget
	}
	return max(limit/4, minBudget)
}
