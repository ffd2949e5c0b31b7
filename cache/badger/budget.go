package badgerstore

import "github.com/dgraph-io/badger/v4"

// DefaultMemoryBudget is Options.MemoryBudget when it is unset: the store's
// share of a 256 MiB container (see sizing).
const DefaultMemoryBudget = 64 << 20

// sizing is the part of Badger's options that its Go heap depends on, all
// derived from one memory budget B (Options.MemoryBudget). What holds the
// heap after a burst of writes (a heap profile of BenchmarkBurst4K) is the
// table builders' allocators, ~85%, and the memtable arenas, ~13%:
//
//   - memtables: NumMemtables (2) arenas of MemTableSize + 15% (a write
//     batch's headroom), each allocated whole. MemTableSize M = B/16, so
//     ~B/6 for both.
//   - table builders: a builder starts with an allocator of 2 ×
//     BaseTableSize and doubles it while its table grows; a flush writes a
//     whole memtable (M) into one L0 table, a compaction writes tables of
//     BaseTableSize T at every level (TableSizeMultiplier 1; Badger's
//     default doubles T per level below the base, so builders would grow
//     with the data). Badger pools up to 8 used allocators, at their
//     grown size, and frees one per 2 s idle. With T = M/4 a flush's
//     allocator ends at 2T + 4T = 1.5M and a compaction's at 2T = M/2, so
//     the pool holds at most 8 × 1.5M = 0.75B.
//   - IndexCacheSize = B/8: table indexes and bloom filters.
//   - NumCompactors 2, the fewest Badger accepts (compactor 0 serves L0).
//
// Total ≈ B/6 + 3B/4 + B/8 ≈ B. For the default 64 MiB (a 256 MiB
// container): 4 MiB memtables, 1 MiB tables, 8 MiB of index cache. The
// clamps keep tiny budgets workable and stop big ones from making tables
// so large that flushes stall writes.
//
// Measured with BenchmarkBurst4K (60,000 records of 4 KiB from 16
// writers, 2 shared cores; medians of 2–6 runs) against the fixed sizing
// before it (8 MiB memtables, 2 MiB tables doubling per level): heap after
// the burst 112 → 64 MiB, peak heap 305 → 180 MiB, CPU per record +14%
// (315 → 358 µs). Under GOMEMLIMIT=100MiB the old sizing could not fit
// (peak 129 MiB, 743 µs and 204 records/s, the GC running flat out) and
// this one could (102 MiB, 427 µs, 840 records/s). TableSizeMultiplier 2
// instead of 1 cost the same CPU for a peak of 220 MiB instead of 180.
type sizing struct {
	memTableSize        int64
	numMemtables        int
	baseTableSize       int64
	tableSizeMultiplier int
	indexCacheSize      int64
	numCompactors       int
}

// sizeFor sizes Badger for a memory budget; budget <= 0 is
// DefaultMemoryBudget.
func sizeFor(budget int64) sizing {
	if budget <= 0 {
		budget = DefaultMemoryBudget
	}
	mem := clamp(budget/16, 2<<20, 64<<20)
	return sizing{
		memTableSize:        mem,
		numMemtables:        2,
		baseTableSize:       clamp(mem/4, 512<<10, 16<<20),
		tableSizeMultiplier: 1,
		indexCacheSize:      clamp(budget/8, 1<<20, 256<<20),
		numCompactors:       2,
	}
}

func (z sizing) apply(bo badger.Options) badger.Options {
	bo = bo.WithMemTableSize(z.memTableSize).
		WithNumMemtables(z.numMemtables).
		WithBaseTableSize(z.baseTableSize).
		WithIndexCacheSize(z.indexCacheSize).
		WithNumCompactors(z.numCompactors)
	bo.TableSizeMultiplier = z.tableSizeMultiplier // no With method
	return bo
}

func clamp(v, lo, hi int64) int64 { return max(lo, min(v, hi)) }
