package badgerstore

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
)

// fakeDisk is an injected statfs: its free space is whatever the test says.
type fakeDisk struct{ free atomic.Int64 }

func (d *fakeDisk) statfs(string) (uint64, error) { return uint64(d.free.Load()), nil }

const testFloor = 100 << 20

func openSpaceStore(t *testing.T, dir string, clock *storetest.Clock, disk *fakeDisk, maxBytes int64) *Store {
	t.Helper()
	s, err := Open(Options{Dir: dir, Now: clock.Now, After: clock.After, Statfs: disk.statfs,
		MinFreeBytes: testFloor, MaxBytes: maxBytes, SpaceInterval: time.Hour})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func commitKey(t *testing.T, s *Store, id string) error {
	t.Helper()
	k := cache.Key{Scope: "acme", Endpoint: chatEP, ID: id}
	c := mustClaim(t, s, k, "fp-"+id, cache.Claimed)
	err := s.Commit(ctx, k, c.Owner, storetest.JSONRecord(), ttl)
	if err != nil {
		if rerr := s.Release(ctx, k, c.Owner); rerr != nil {
			t.Fatalf("Release after a failed commit: %v", rerr)
		}
	}
	return err
}

func TestFloorFromOptions(t *testing.T) {
	bo := badgerOptions(Options{Dir: "."})
	// The arithmetic of reserveFor's comment, with the store's options: if
	// the options change, the README's capacity planning changes too.
	if got, want := reserveFor(bo), int64(77<<20); got != want {
		t.Errorf("reserve = %d MiB, want %d MiB", got>>20, want>>20)
	}
	if got, want := DefaultMinFreeBytes(), int64(85<<20); got != want {
		t.Errorf("floor = %d MiB, want %d MiB", got>>20, want>>20)
	}
	sp := newSpace(Options{MinFreeBytes: 16 << 20}, bo)
	if sp.floor != 16<<20 || sp.reserve != 14<<20 {
		t.Errorf("an operator's lower floor: floor %d reserve %d, want the reserve below it", sp.floor, sp.reserve)
	}
}

// TestSpaceStates walks the store through its states with an injected
// statfs and clock: room, disk below the floor, below the reserve (writes
// refused), room again; and over its size cap.
func TestSpaceStates(t *testing.T) {
	clock := storetest.NewClock()
	disk := &fakeDisk{}
	disk.free.Store(1 << 30)
	s := openSpaceStore(t, t.TempDir(), clock, disk, 0)
	if sp := s.Space(); sp.Full || sp.FreeBytes != 1<<30 || sp.MinFreeBytes != testFloor {
		t.Fatalf("with room: %+v", sp)
	}
	if err := commitKey(t, s, "a"); err != nil {
		t.Fatal(err)
	}

	disk.free.Store(testFloor - 1)
	if sp := s.Space(); sp.Full {
		t.Fatalf("figures younger than %v were measured again: %+v", spaceMaxAge, sp)
	}
	clock.Advance(spaceMaxAge)
	if sp := s.Space(); !sp.Full || sp.Reason != cache.FullDiskLow {
		t.Fatalf("below the floor: %+v", sp)
	}
	// Between the floor and the reserve, calls already running still commit.
	if err := commitKey(t, s, "b"); err != nil {
		t.Fatalf("commit above the reserve: %v", err)
	}
	disk.free.Store(s.space.reserve - 1)
	err := commitKey(t, s, "c")
	if !errors.Is(err, cache.ErrFull) {
		t.Fatalf("commit below the reserve: %v, want ErrFull", err)
	}
	var f interface{ StoreFull() bool }
	if !errors.As(err, &f) || !f.StoreFull() {
		t.Fatalf("ErrFull does not report StoreFull: %v", err)
	}
	if _, err := s.Get(ctx, cache.Key{Scope: "acme", Endpoint: chatEP, ID: "a"}); err != nil {
		t.Fatalf("a replay while full: %v", err)
	}

	disk.free.Store(1 << 30)
	clock.Advance(spaceMaxAge)
	if sp := s.Space(); sp.Full {
		t.Fatalf("room again: %+v", sp)
	}
	if err := commitKey(t, s, "c"); err != nil {
		t.Fatalf("commit with room again: %v", err)
	}
}

func TestSpaceOverCap(t *testing.T) {
	clock := storetest.NewClock()
	disk := &fakeDisk{}
	disk.free.Store(1 << 30)
	s := openSpaceStore(t, t.TempDir(), clock, disk, 1)
	// The cap counts live entries, not files (the active value-log file
	// is mapped at twice its size from the start): an empty store has
	// room under a 1-byte cap, and is over it after one commit.
	if sp := s.Space(); sp.Full || sp.UsedBytes < 1 || sp.LiveBytes != 0 {
		t.Fatalf("empty: %+v", sp)
	}
	if err := commitKey(t, s, "a"); err != nil {
		t.Fatalf("commit: %v", err)
	}
	sp := s.Space()
	if !sp.Full || sp.Reason != cache.FullOverCap || sp.LiveBytes < 1 || sp.MaxBytes != 1 {
		t.Fatalf("over the cap: %+v", sp)
	}
	// The cap refuses new work at the gateway; a running call still commits.
	if err := commitKey(t, s, "b"); err != nil {
		t.Fatalf("commit over the cap: %v", err)
	}
}

// TestStartFullReadOnly: a store opened below its floor opens Badger
// read-only, from a directory copied while a store had it open (an unclean
// stop: committed records only in the memtable WAL), serves the records,
// refuses writes with ErrFull, and reopens read-write when there is room.
func TestStartFullReadOnly(t *testing.T) {
	clock := storetest.NewClock()
	disk := &fakeDisk{}
	disk.free.Store(1 << 30)
	src := openSpaceStore(t, t.TempDir(), clock, disk, 0)
	for i := range 20 {
		if err := commitKey(t, src, fmt.Sprint("k", i)); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	copyDir(t, src.dir, dir)
	if m, _ := filepath.Glob(filepath.Join(dir, "*.mem")); len(m) == 0 {
		t.Fatal("no memtable WAL in the copy: not an unclean image")
	}

	disk.free.Store(testFloor / 2)
	s := openSpaceStore(t, dir, clock, disk, 0)
	if sp := s.Space(); !sp.ReadOnly || !sp.Full || sp.Reason != cache.FullDiskLow {
		t.Fatalf("opened below the floor: %+v", sp)
	}
	for i := range 20 {
		if _, err := s.Get(ctx, cache.Key{Scope: "acme", Endpoint: chatEP, ID: fmt.Sprint("k", i)}); err != nil {
			t.Fatalf("replay from the read-only store: %v", err)
		}
	}
	if err := commitKey(t, s, "new"); !errors.Is(err, cache.ErrFull) {
		t.Fatalf("commit to the read-only store: %v, want ErrFull", err)
	}

	// Above the reserve but below the floor: still read-only.
	disk.free.Store(testFloor - 1)
	clock.Advance(spaceMaxAge)
	s.checkSpace()
	if !s.Space().ReadOnly {
		t.Fatal("reopened read-write below the floor")
	}
	disk.free.Store(1 << 30)
	clock.Advance(spaceMaxAge)
	s.checkSpace()
	if sp := s.Space(); sp.ReadOnly || sp.Full {
		t.Fatalf("room again: %+v", sp)
	}
	if err := commitKey(t, s, "new"); err != nil {
		t.Fatalf("commit after reopening read-write: %v", err)
	}
	if _, err := s.Get(ctx, cache.Key{Scope: "acme", Endpoint: chatEP, ID: "k7"}); err != nil {
		t.Fatalf("a record of the WAL after reopening: %v", err)
	}
}

// TestStartFullEmptyDir: a first start on a full disk (no database yet)
// opens, with nothing to replay, and creates the database on disk once
// there is room.
func TestStartFullEmptyDir(t *testing.T) {
	clock := storetest.NewClock()
	disk := &fakeDisk{}
	disk.free.Store(1 << 20)
	dir := filepath.Join(t.TempDir(), "data")
	s := openSpaceStore(t, dir, clock, disk, 0)
	if sp := s.Space(); !sp.ReadOnly || !sp.Full {
		t.Fatalf("first start below the floor: %+v", sp)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if err := commitKey(t, s, "a"); !errors.Is(err, cache.ErrFull) {
		t.Fatalf("commit: %v, want ErrFull", err)
	}
	disk.free.Store(1 << 30)
	clock.Advance(spaceMaxAge)
	s.checkSpace()
	if err := commitKey(t, s, "a"); err != nil {
		t.Fatalf("commit after opening on disk: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, badger.ManifestFilename)); err != nil {
		t.Fatalf("no database on disk after the reopen: %v", err)
	}
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	entries, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == "LOCK" || e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRealDiskFillsNoFault fills a real tmpfs with commits, the store's own
// statfs and default floor: writes stop at the reserve with ErrFull, and
// Badger's flushes and compactions meanwhile, its close (which flushes the
// memtable) and a reopen all fit in what is left — the process does not
// die of SIGBUS, and every committed record is there after the reopen.
// Needs root (mount); skipped without it unless LLMGATE_REQUIRE_MOUNT=1.
func TestRealDiskFillsNoFault(t *testing.T) {
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=160m", "tmpfs", dir).CombinedOutput()
	if err != nil {
		msg := fmt.Sprintf("cannot mount a tmpfs (needs root): %v %s", err, strings.TrimSpace(string(out)))
		if os.Getenv("LLMGATE_REQUIRE_MOUNT") == "1" {
			t.Fatalf("%s; LLMGATE_REQUIRE_MOUNT=1", msg)
		}
		t.Skipf("%s; LLMGATE_REQUIRE_MOUNT=1 makes this a failure", msg)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })

	clock := storetest.NewClock()
	s, err := Open(Options{Dir: dir, Now: clock.Now, After: clock.After, SpaceInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	rec := storetest.JSONRecord()
	rec.Body = make([]byte, 4<<10)
	big := storetest.JSONRecord()
	big.Body = make([]byte, 96<<10) // above ValueThreshold: the value log
	n := 0
	for ; n < 100000; n++ {
		k := cache.Key{Scope: "acme", Endpoint: chatEP, ID: fmt.Sprint("k", n)}
		c := mustClaim(t, s, k, "fp", cache.Claimed)
		r := rec
		if n%50 == 0 {
			r = big
		}
		if err := s.Commit(ctx, k, c.Owner, r, ttl); err != nil {
			if !errors.Is(err, cache.ErrFull) {
				t.Fatalf("commit %d: %v, want ErrFull", n, err)
			}
			break
		}
	}
	if n == 100000 {
		t.Fatal("the disk never filled")
	}
	t.Logf("%d records committed before the reserve", n)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s2 := openStore(t, dir, clock)
	for _, i := range []int{0, n / 2, n - 1} {
		if _, err := s2.Get(ctx, cache.Key{Scope: "acme", Endpoint: chatEP, ID: fmt.Sprint("k", i)}); err != nil {
			t.Fatalf("record %d after the reopen: %v", i, err)
		}
	}
}

// BenchmarkRoomToWrite is the check every write now pays: one statfs.
func BenchmarkRoomToWrite(b *testing.B) {
	s, err := Open(Options{Dir: b.TempDir(), SpaceInterval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ReportAllocs()
	for b.Loop() {
		if err := s.roomToWrite(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSpace is what the gateway asks on every keyed request (cached
// figures, measured again every 250 ms).
func BenchmarkSpace(b *testing.B) {
	s, err := Open(Options{Dir: b.TempDir(), SpaceInterval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ReportAllocs()
	for b.Loop() {
		_ = s.Space()
	}
}

// memSizes is the size of each memtable WAL in dir.
func memSizes(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.mem"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no memtable WAL in %s: %v", dir, err)
	}
	sizes := map[string]int64{}
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		sizes[filepath.Base(p)] = fi.Size()
	}
	return sizes
}

// TestOpenReadOnlyLiveDir: a second store opening a live store's directory
// while the disk is below the floor fails with ErrLocked and leaves the
// live store's WALs alone (trimming them would make its next writes fault
// with SIGBUS). The same holds against a live store that is read-only
// itself.
func TestOpenReadOnlyLiveDir(t *testing.T) {
	clock := storetest.NewClock()
	roomy, full := &fakeDisk{}, &fakeDisk{}
	roomy.free.Store(1 << 30)
	full.free.Store(1 << 20)
	for _, live := range []*fakeDisk{roomy, full} {
		dir := t.TempDir()
		if live == full {
			// An unclean image, so that the read-only store has WALs too.
			seed := openSpaceStore(t, t.TempDir(), clock, roomy, 0)
			if err := commitKey(t, seed, "a"); err != nil {
				t.Fatal(err)
			}
			copyDir(t, seed.dir, dir)
		}
		a := openSpaceStore(t, dir, clock, live, 0)
		if live == roomy {
			if err := commitKey(t, a, "a"); err != nil {
				t.Fatal(err)
			}
		}
		before := memSizes(t, dir)
		b, err := Open(Options{Dir: dir, Now: clock.Now, After: clock.After, Statfs: full.statfs,
			MinFreeBytes: testFloor, SpaceInterval: time.Hour})
		if err == nil {
			b.Close()
		}
		if after := memSizes(t, dir); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("live store read-only=%v: a second Open changed its WALs: %v, were %v (its next write would SIGBUS)",
				live == full, after, before)
		}
		if !errors.Is(err, ErrLocked) {
			t.Errorf("live store read-only=%v: second Open below the floor: %v, want ErrLocked", live == full, err)
		}
	}
}

// TestStandInHoldsDir: a store standing in memory for a directory (a first
// start on a full disk) holds the directory, so a second store fails with
// ErrLocked whatever its disk says, until the first closes.
func TestStandInHoldsDir(t *testing.T) {
	clock := storetest.NewClock()
	roomy, full := &fakeDisk{}, &fakeDisk{}
	roomy.free.Store(1 << 30)
	full.free.Store(1 << 20)
	dir := filepath.Join(t.TempDir(), "data")
	a := openSpaceStore(t, dir, clock, full, 0)
	for _, disk := range []*fakeDisk{full, roomy} {
		b, err := Open(Options{Dir: dir, Statfs: disk.statfs, MinFreeBytes: testFloor, SpaceInterval: time.Hour})
		if err == nil {
			b.Close()
		}
		if !errors.Is(err, ErrLocked) {
			t.Errorf("second Open (free %d) while a store stands in memory: %v, want ErrLocked", disk.free.Load(), err)
		}
	}
	a.Close()
	b := openSpaceStore(t, dir, clock, roomy, 0)
	if err := commitKey(t, b, "a"); err != nil {
		t.Fatalf("commit after the stand-in closed: %v", err)
	}
}

// TestPurgeBelowReserve: PurgeScope's deletes are writes too: below the
// reserve they fail with ErrFull instead of reaching Badger, and they go
// through once there is room.
func TestPurgeBelowReserve(t *testing.T) {
	clock := storetest.NewClock()
	disk := &fakeDisk{}
	disk.free.Store(1 << 30)
	s := openSpaceStore(t, t.TempDir(), clock, disk, 0)
	if err := commitKey(t, s, "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.PutOwner(ctx, "acme", "file-1", cache.Owner{Upstream: "p", Kind: "file"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	disk.free.Store(1 << 20)
	clock.Advance(spaceRecheck) // the last answer, far above the reserve, stood until now
	if err := s.PutOwner(ctx, "acme", "file-2", cache.Owner{Upstream: "p", Kind: "file"}, time.Hour); !errors.Is(err, cache.ErrFull) {
		t.Errorf("PutOwner below the reserve: %v, want ErrFull", err)
	}
	if p, err := s.PurgeScope(ctx, "acme"); !errors.Is(err, cache.ErrFull) {
		t.Errorf("PurgeScope below the reserve wrote to Badger: purged %+v, err %v", p, err)
	}
	disk.free.Store(1 << 30)
	p, err := s.PurgeScope(ctx, "acme")
	if err != nil || p.Records != 1 || p.Owners != 1 {
		t.Fatalf("PurgeScope with room again: %+v, %v", p, err)
	}
}

// TestStandInReopenDeadLetters: a store standing in memory for its
// directory (a first start on a full disk) knows no dead letters; when it
// reopens read-write on a directory that has some (here restored from
// another store while it stood in), they are known again and can be
// resolved.
func TestStandInReopenDeadLetters(t *testing.T) {
	k := cache.Key{Scope: "acme", Endpoint: chatEP, ID: "dead"}
	s := standInThenRestore(t, func(src *Store) {
		if err := src.PutDeadLetter(ctx, k, &cache.DeadLetter{Class: "timeout"}, time.Hour); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := s.GetDeadLetter(ctx, cache.DeadLetterID(k)); err != nil {
		t.Fatalf("GetDeadLetter after the reopen: %v", err)
	}
	if err := s.DeleteDeadLetter(ctx, cache.DeadLetterID(k)); err != nil {
		t.Fatalf("DeleteDeadLetter of a dead letter on disk after the reopen: %v", err)
	}
}

// countingDisk is a fakeDisk that counts the times it is asked.
type countingDisk struct {
	fakeDisk
	asked atomic.Int64
}

func (d *countingDisk) statfs(dir string) (uint64, error) {
	d.asked.Add(1)
	return d.fakeDisk.statfs(dir)
}

// TestWritesAskTheDiskWhenItMatters: far above the reserve, writes go by
// the disk's answer for spaceRecheck, or until the store has written an
// amplified share of the room; near the reserve every write asks, and a
// write below it fails.
func TestWritesAskTheDiskWhenItMatters(t *testing.T) {
	clock := storetest.NewClock()
	disk := &countingDisk{}
	disk.free.Store(1 << 30)
	s, err := Open(Options{Dir: t.TempDir(), Now: clock.Now, After: clock.After, Statfs: disk.statfs,
		MinFreeBytes: testFloor, SpaceInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	commits := func(prefix string, n int) int64 {
		t.Helper()
		before := disk.asked.Load()
		for i := range n {
			if err := commitKey(t, s, fmt.Sprint(prefix, i)); err != nil {
				t.Fatalf("commit %s%d: %v", prefix, i, err)
			}
		}
		return disk.asked.Load() - before
	}
	commits("warm", 1)
	if n := commits("far", 50); n != 0 {
		t.Errorf("50 commits far above the reserve within %v asked the disk %d times, want 0", spaceRecheck, n)
	}
	clock.Advance(spaceRecheck)
	if n := commits("later", 50); n != 1 {
		t.Errorf("50 commits after %v asked %d times, want 1", spaceRecheck, n)
	}
	// Writes since the answer count against the room: with 1 KiB of room
	// over the margin, the first commit uses it up and the next asks.
	disk.free.Store(s.space.reserve + spaceMargin + 1<<10)
	clock.Advance(spaceRecheck)
	if n := commits("spent", 3); n != 3 {
		t.Errorf("3 commits with 1 KiB over the margin asked %d times, want 3", n)
	}
	disk.free.Store(s.space.reserve + spaceMargin/2)
	clock.Advance(spaceRecheck)
	if n := commits("near", 10); n != 10 {
		t.Errorf("10 commits within the margin asked %d times, want 10", n)
	}
	disk.free.Store(s.space.reserve - 1)
	if err := commitKey(t, s, "below"); !errors.Is(err, cache.ErrFull) {
		t.Fatalf("commit below the reserve, right after one near it: %v, want ErrFull", err)
	}
}

// standInThenRestore opens a store standing in memory for its directory
// (a first start on a full disk), restores into that directory another
// store's contents, which fill writes, and reopens it read-write once
// the disk has room: what the store knows of its contents must come from
// the restored directory.
func standInThenRestore(t *testing.T, fill func(src *Store)) *Store {
	t.Helper()
	clock := storetest.NewClock()
	disk := &fakeDisk{}
	disk.free.Store(1 << 20)
	dir := filepath.Join(t.TempDir(), "data")
	s := openSpaceStore(t, dir, clock, disk, 0)
	if sp := s.Space(); !sp.ReadOnly {
		t.Fatalf("not standing in: %+v", sp)
	}
	roomy := &fakeDisk{}
	roomy.free.Store(1 << 30)
	src := openSpaceStore(t, t.TempDir(), clock, roomy, 0)
	fill(src)
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	copyDir(t, src.dir, dir)

	disk.free.Store(1 << 30)
	clock.Advance(spaceMaxAge)
	s.checkSpace()
	if sp := s.Space(); sp.ReadOnly {
		t.Fatalf("not reopened read-write: %+v", sp)
	}
	return s
}
