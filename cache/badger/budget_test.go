package badgerstore

import "testing"

// TestSizeFor holds sizing's arithmetic to the documented figures, and
// badgerOptions to sizing.
func TestSizeFor(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		budget            int64
		mem, table, index int64
	}{
		{0, 4 * mib, 1 * mib, 8 * mib},           // DefaultMemoryBudget, a 256 MiB container
		{64 * mib, 4 * mib, 1 * mib, 8 * mib},    //
		{256 * mib, 16 * mib, 4 * mib, 32 * mib}, // a 1 GiB container
		{8 * mib, 2 * mib, 512 << 10, 1 * mib},   // the floor
		{8 << 30, 64 * mib, 16 * mib, 256 * mib}, // the ceiling
	} {
		z := sizeFor(tc.budget)
		if z.memTableSize != tc.mem || z.baseTableSize != tc.table || z.indexCacheSize != tc.index ||
			z.numMemtables != 2 || z.tableSizeMultiplier != 1 || z.numCompactors != 2 {
			t.Errorf("sizeFor(%d) = %+v, want memtables %d, tables %d, index cache %d", tc.budget, z, tc.mem, tc.table, tc.index)
		}
		// The builders' pool (8 flush allocators of 1.5 × MemTableSize),
		// the memtables and the index cache fit in the budget, give or
		// take the clamps.
		if b := max(tc.budget, DefaultMemoryBudget); tc.budget >= 64*mib && tc.budget <= 1<<30 {
			if total := 8*z.memTableSize*3/2 + 2*z.memTableSize*115/100 + z.indexCacheSize; total > b*11/10 {
				t.Errorf("sizeFor(%d): %d bytes, over the budget", tc.budget, total)
			}
		}
		bo := badgerOptions(Options{Dir: "x", MemoryBudget: tc.budget})
		if bo.MemTableSize != z.memTableSize || bo.BaseTableSize != z.baseTableSize || bo.TableSizeMultiplier != 1 ||
			bo.IndexCacheSize != z.indexCacheSize || bo.NumMemtables != 2 || bo.NumCompactors != 2 {
			t.Errorf("badgerOptions(MemoryBudget %d) does not apply sizeFor: %+v", tc.budget, z)
		}
	}
}
