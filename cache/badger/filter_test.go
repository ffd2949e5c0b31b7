package badgerstore

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
)

func filterKey(i int) cache.Key {
	return cache.Key{Scope: "acme", Endpoint: chatEP, ID: fmt.Sprint("k-", i)}
}

func commitNew(t testing.TB, s *Store, k cache.Key) {
	t.Helper()
	c, err := s.Claim(ctx, k, "fp", lease)
	if err != nil || c.Status != cache.Claimed {
		t.Fatalf("Claim %s: %v %v", k, c.Status, err)
	}
	if err := s.Commit(ctx, k, c.Owner, storetest.JSONRecord(), ttl); err != nil {
		t.Fatalf("Commit %s: %v", k, err)
	}
}

// TestClaimNewKeyReadsNothing: a Claim or Get of a key never committed
// does not read Badger; one of a committed key does, and finds it.
func TestClaimNewKeyReadsNothing(t *testing.T) {
	for name, o := range map[string]Options{"disk": {Dir: t.TempDir()}, "memory": {InMemory: true}} {
		t.Run(name, func(t *testing.T) {
			clock := storetest.NewClock()
			o.Now, o.After = clock.Now, clock.After
			s, err := Open(o)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			commitNew(t, s, key1)
			if got := s.reads.Load(); got != 0 {
				t.Fatalf("Claim of a new key read Badger %d times", got)
			}
			if _, err := s.Get(ctx, filterKey(1)); !errors.Is(err, cache.ErrNotFound) {
				t.Fatalf("Get of a new key: %v, want ErrNotFound", err)
			}
			if got := s.reads.Load(); got != 0 {
				t.Fatalf("Get of a new key read Badger %d times", got)
			}
			mustClaim(t, s, key1, "fp", cache.Done)
			if _, err := s.Get(ctx, key1); err != nil {
				t.Fatalf("Get of a committed key: %v", err)
			}
			if got := s.reads.Load(); got != 2 {
				t.Fatalf("Claim and Get of a committed key read Badger %d times, want 2", got)
			}
		})
	}
}

// TestFilterAfterReopen: every key committed before a restart is Done
// after it (the filter is built from Badger's keys at Open), a deleted
// one is claimable, and new keys mostly read nothing.
func TestFilterAfterReopen(t *testing.T) {
	dir := t.TempDir()
	clock := storetest.NewClock()
	const n = 2000
	s := openStore(t, dir, clock)
	for i := range n {
		commitNew(t, s, filterKey(i))
	}
	if err := s.Delete(ctx, filterKey(0)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir, clock)
	mustClaim(t, s, filterKey(0), "fp", cache.Claimed)
	for i := 1; i < n; i++ {
		mustClaim(t, s, filterKey(i), "fp", cache.Done)
	}
	before := s.reads.Load()
	for i := n; i < 2*n; i++ {
		mustClaim(t, s, filterKey(i), "fp", cache.Claimed)
	}
	if fp := s.reads.Load() - before; fp > n/20 {
		t.Errorf("%d of %d new keys read Badger, want about 1%%", fp, n)
	}
}

// TestFilterRebuildWhileCommitting: while the filter is rebuilt again and
// again, every key is found the moment its Commit has returned, and every
// key committed earlier still is.
func TestFilterRebuildWhileCommitting(t *testing.T) {
	s := openStore(t, t.TempDir(), storetest.NewClock())
	const writers, perWriter = 4, 300
	var committed atomic.Int64 // keys 0..committed-1 of writer 0 are in
	var stop atomic.Bool
	rebuilds := 0
	rebuilt := make(chan error, 1)
	go func() {
		var err error
		for !stop.Load() && err == nil {
			err = s.rebuildFilter()
			rebuilds++
		}
		rebuilt <- err
	}()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			if err := commitAndCheck(s, w, perWriter, &committed); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	stop.Store(true)
	if err := <-rebuilt; err != nil {
		t.Fatalf("rebuildFilter: %v", err)
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if rebuilds < 2 {
		t.Errorf("%d rebuilds while committing, want several", rebuilds)
	}
	for w := range writers {
		for i := range perWriter {
			mustClaim(t, s, filterKey(w*perWriter+i), "fp", cache.Done)
		}
	}
	t.Logf("%d rebuilds during %d commits", rebuilds, writers*perWriter)
}

// commitAndCheck commits writer w's keys, getting each one back at once
// and one committed earlier by writer 0 at random.
func commitAndCheck(s *Store, w, n int, committed *atomic.Int64) error {
	for i := range n {
		k := filterKey(w*n + i)
		c, err := s.Claim(ctx, k, "fp", lease)
		if err != nil || c.Status != cache.Claimed {
			return fmt.Errorf("claim %s: %v %v", k, c.Status, err)
		}
		if err := s.Commit(ctx, k, c.Owner, storetest.JSONRecord(), ttl); err != nil {
			return err
		}
		if _, err := s.Get(ctx, k); err != nil {
			return fmt.Errorf("get %s just committed: %w", k, err)
		}
		if w == 0 {
			committed.Store(int64(i + 1))
		}
		if m := committed.Load(); m > 0 {
			old := filterKey(rand.IntN(int(m)))
			if c, err := s.Claim(ctx, old, "fp", lease); err != nil || c.Status != cache.Done {
				return fmt.Errorf("claim %s committed earlier: %v %v", old, c.Status, err)
			}
		}
	}
	return nil
}

// TestFilterGrows: once a filter holds the keys it was sized for, Commit
// asks for a rebuild, which sizes the next one for the records in Badger
// and keeps every one of them.
func TestFilterGrows(t *testing.T) {
	s := openStore(t, t.TempDir(), storetest.NewClock())
	// Full after 10 keys, and big enough not to be all ones.
	small := &bloom{bits: make([]atomic.Uint64, 64*blockWords), blocks: 64, rebuildAt: 10}
	s.filter.cur.Store(small)
	for i := range 10 {
		commitNew(t, s, filterKey(i))
	}
	select {
	case <-s.filter.rebuilt:
	case <-time.After(10 * time.Second):
		t.Fatal("no rebuild within 10s of the filter filling up")
	}
	b := s.filter.cur.Load()
	if b == small || b.rebuildAt != filterMinKeys || b.added.Load() != 10 {
		t.Fatalf("after the rebuild: rebuild at %d with %d keys, want a new filter for %d with 10",
			b.rebuildAt, b.added.Load(), filterMinKeys)
	}
	for i := range 10 {
		mustClaim(t, s, filterKey(i), "fp", cache.Done)
	}
}

// TestStandInReopenRecords: a store standing in memory for its directory
// (a first start on a full disk) has an empty filter; when it reopens
// read-write on a directory that has records (restored while it stood
// in), the filter is built again and they are Done.
func TestStandInReopenRecords(t *testing.T) {
	s := standInThenRestore(t, func(src *Store) {
		if err := commitKey(t, src, "restored"); err != nil {
			t.Fatal(err)
		}
	})
	mustClaim(t, s, cache.Key{Scope: "acme", Endpoint: chatEP, ID: "restored"}, "fp-restored", cache.Done)
}

// TestBloomFalsePositives: no added hash is missed, and about 1% of the
// others are reported, at the capacity the filter was sized for.
func TestBloomFalsePositives(t *testing.T) {
	b := newBloom(filterMinKeys / 2)
	r := rand.New(rand.NewPCG(1, 2))
	added := make([]uint64, filterMinKeys)
	for i := range added {
		added[i] = r.Uint64()
		b.add(added[i])
	}
	for _, h := range added {
		if !b.has(h) {
			t.Fatalf("false negative for %#x", h)
		}
	}
	const trials = 200_000
	fp := 0
	for range trials {
		if b.has(r.Uint64()) {
			fp++
		}
	}
	rate := float64(fp) / trials
	if rate > 0.02 {
		t.Errorf("false-positive rate %.2f%%, want about 1%%", 100*rate)
	}
	t.Logf("%d keys in %d bytes: false-positive rate %.2f%%", len(added), len(b.bits)*8, 100*rate)
}

// TestBloomSize: the filter is sized for twice the keys, within its floor
// and its cap.
func TestBloomSize(t *testing.T) {
	for _, tc := range []struct{ keys, bytes int64 }{
		{0, filterMinKeys * filterBitsPerKey / 8},
		{100 << 10, 2 * (100 << 10) * filterBitsPerKey / 8},
		{100 << 20, filterMaxBytes},
	} {
		b := newBloom(tc.keys)
		if got := int64(len(b.bits) * 8); got != tc.bytes {
			t.Errorf("newBloom(%d): %d bytes, want %d", tc.keys, got, tc.bytes)
		}
		if b.rebuildAt <= tc.keys {
			t.Errorf("newBloom(%d): rebuilt at %d keys", tc.keys, b.rebuildAt)
		}
	}
}

// BenchmarkClaimNew is a Claim of a key never committed, then its
// Release: the Badger read the key filter saves, without the write.
func BenchmarkClaimNew(b *testing.B) {
	s, err := Open(Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for i := range 10_000 {
		commitNew(b, s, filterKey(-1-i))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := filterKey(i)
		i++
		c, err := s.Claim(ctx, k, "fp", lease)
		if err != nil || c.Status != cache.Claimed {
			b.Fatal(c.Status, err)
		}
		if err := s.Release(ctx, k, c.Owner); err != nil {
			b.Fatal(err)
		}
	}
}
