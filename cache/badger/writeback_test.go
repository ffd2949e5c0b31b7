//go:build linux

package badgerstore

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/llmgate/llmgate/cache"
	"github.com/llmgate/llmgate/cache/storetest"
)

// vlogDirtyKiB is what this process's mappings of dir's newest value-log
// file hold dirty (not yet written back), from /proc/self/smaps.
func vlogDirtyKiB(t *testing.T, dir string) int {
	t.Helper()
	_, name, ok := newestVlog(dir)
	if !ok {
		t.Fatal("no value-log file")
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	path := filepath.Join(dir, name)
	kib, in := 0, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) >= 5 && strings.Contains(fields[0], "-"):
			in = fields[len(fields)-1] == path
		case in && (fields[0] == "Shared_Dirty:" || fields[0] == "Private_Dirty:"):
			n, _ := strconv.Atoi(fields[1])
			kib += n
		}
	}
	return kib
}

// commitBytes commits n records of 2 KiB bodies that do not compress (above ValueThreshold:
// into the value log).
func commitBytes(t *testing.T, s *Store, n int) {
	t.Helper()
	rec := storetest.JSONRecord()
	rec.Body = incompressible(2 << 10)
	for i := range n {
		k := cache.Key{Scope: "acme", Endpoint: chatEP, ID: fmt.Sprint("wb", i)}
		c := mustClaim(t, s, k, "fp", cache.Claimed)
		if err := s.Commit(ctx, k, c.Owner, rec, ttl); err != nil {
			t.Fatal(err)
		}
	}
}

// waitClean waits (for the disk, not for a goroutine of ours) until the
// newest value-log file holds under underKiB dirty.
func waitClean(t *testing.T, dir string, underKiB int, within time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		kib := vlogDirtyKiB(t, dir)
		if kib < underKiB || time.Now().After(deadline) {
			return kib
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWritebackLeavesTheRotationLittle: what the store writes to its value
// log is written back within a few writeback intervals, all but its last
// folio (and up to a chunk more), not left dirty for the
// rotation's msync to write while every commit waits; and the last
// folio, which Badger may still be writing, is not written back. The kernel's
// own flusher leaves dirty pages for 30 s, so without writeback the 6 MiB
// written here are still dirty after 10 s.
func TestWritebackLeavesTheRotationLittle(t *testing.T) {
	for _, tc := range []struct {
		name  string
		every time.Duration
	}{{"off", 0}, {"on", 100 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			needWriteback(t, dir)
			s, err := Open(Options{Dir: dir, Now: storetest.NewClock().Now, WritebackInterval: tc.every})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			commitBytes(t, s, 3000)
			const leftKiB = (writebackChunk+writebackMaxMargin)>>10 + 64
			if tc.every == 0 {
				if kib := vlogDirtyKiB(t, dir); kib < 5<<10 {
					t.Skipf("only %d KiB of the value log dirty after writing 6 MiB: this kernel wrote it back already", kib)
				}
				if kib := waitClean(t, dir, leftKiB, 2*time.Second); kib < leftKiB {
					t.Fatalf("without writeback the value log was written back anyway (%d KiB dirty): this test cannot tell", kib)
				}
				// A round as runWriteback makes it.
				wb := newWriteback(dir)
				defer wb.close()
				wb.round(s.live.written.Load())
			}
			kib := waitClean(t, dir, leftKiB, 10*time.Second)
			if kib >= leftKiB {
				t.Fatalf("%d KiB of the value log still dirty 10 s after the writes, want under %d", kib, leftKiB)
			}
			// Half the least margin: a round that wrote back up to
			// the data end fails here.
			const keptKiB = writebackMinMargin >> 11
			if kib < keptKiB {
				t.Errorf("only %d KiB of the value log still dirty: the last of it, which Badger may be writing, was written back", kib)
			}
		})
	}
}

// TestWritebackRound: a round starts the writeback of the newest value-log
// file's finished part, from the file's start, once writebackChunk or
// more is finished since the last one started and only when the store has
// written since the last round; it leaves out the last folio (Badger may
// be writing it: finishedBefore), and follows a rotation to the new
// file (the old one, truncated, has no data end to tell) and a file of
// the same name that is not the one it had open.
func TestWritebackRound(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"000001.vlog", "000002.vlog", "000003.mem", "000001.sst"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ends := map[string]int64{}
	var started, asked []string
	wb := &writeback{dir: dir, fid: -1,
		start: func(f *os.File, off, n int64) error {
			started = append(started, fmt.Sprintf("%s@%d+%d", filepath.Base(f.Name()), off, n))
			return nil
		},
		dataEnd: func(f *os.File) (int64, error) {
			name := filepath.Base(f.Name())
			asked = append(asked, name)
			end, ok := ends[name]
			if !ok || end < 0 {
				return 0, errNoHole
			}
			return end, nil
		}}
	defer wb.close()
	const mib = 1 << 20
	wb.round(0) // nothing written
	if len(asked) != 0 {
		t.Fatalf("a round with nothing written looked at %v", asked)
	}
	// An end 64 KiB past a multiple of 128 KiB has its last 64 KiB left
	// out (finishedBefore).
	at := func(finished int64) int64 { return finished + writebackMinMargin }
	ends["000002.vlog"] = at(mib / 2)
	wb.round(10) // under a chunk finished
	ends["000002.vlog"] = at(2 * mib)
	wb.round(20) // 2 MiB finished
	wb.round(20) // nothing since
	ends["000002.vlog"] = at(2*mib + 128<<10)
	wb.round(30) // a little more: under a chunk since the last start
	ends["000002.vlog"] = at(3*mib + 384<<10)
	wb.round(40) // a chunk and more since: again from the start
	// The rotation: 000002 truncated (no hole), 000010 the new file.
	ends["000002.vlog"] = -1
	if err := os.WriteFile(filepath.Join(dir, "000010.vlog"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ends["000010.vlog"] = at(mib)
	wb.round(50)
	// A file of the same name replaces it (a directory restored).
	if err := os.Remove(filepath.Join(dir, "000010.vlog")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "000010.vlog"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wb.round(60) // the open file did not grow: the new one, from scratch
	want := fmt.Sprint([]string{
		fmt.Sprintf("000002.vlog@0+%d", 2*mib),
		fmt.Sprintf("000002.vlog@0+%d", 3*mib+384<<10),
		fmt.Sprintf("000010.vlog@0+%d", mib),
		fmt.Sprintf("000010.vlog@0+%d", mib),
	})
	if got := fmt.Sprint(started); got != want {
		t.Errorf("rounds started\n%s\nwant\n%s", got, want)
	}
}

// needWriteback skips the test where writeback does not run on dir's
// filesystem.
func needWriteback(t *testing.T, dir string) {
	t.Helper()
	if fs, ok := writebackFS(dir); !ok {
		t.Skipf("writeback does not run on this filesystem (type %s)", fs)
	}
}

// sparseMap is a sparse value-log file of size bytes, as Badger makes
// one, and a shared writable map of it; the test is skipped where
// writeback does not run.
func sparseMap(t *testing.T, size int) (*os.File, []byte) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "000001.vlog"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	needWriteback(t, filepath.Dir(f.Name()))
	if err := f.Truncate(int64(size)); err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(m) })
	return f, m
}

// TestFinishedBefore: what a round leaves out before a data end is the
// largest power of two that divides it (the last folio can be no larger),
// within 64 KiB and 2 MiB, and what it writes back ends on a page.
func TestFinishedBefore(t *testing.T) {
	const kib, mib = 1 << 10, 1 << 20
	for _, tc := range []struct{ end, want int64 }{
		{5*mib + 16*kib, 5*mib + 16*kib - 64*kib}, // a 16 KiB folio: the least margin
		{5*mib + 384*kib, 5*mib + 256*kib},        // 128 KiB
		{3 * mib, 2 * mib},                        // 1 MiB
		{16 * mib, 14 * mib},                      // no folio is over 2 MiB
		{2*mib + 100, 2*mib - 64*kib},             // not on a page: the least margin, and a page's start
		{0, -2 * mib},                             // nothing finished
	} {
		if got := finishedBefore(tc.end); got != tc.want {
			t.Errorf("finishedBefore(%d) = %d, want %d", tc.end, got, tc.want)
		}
	}
}

// TestFinishedBeforeHoldsTheWriter: on this machine's kernel and
// filesystem, a file written in order through a shared map (as Badger
// writes its value log) never has a page being written, nor one after it,
// before finishedBefore of its data end: the last folio the writer
// faulted in is what ends the data, and it is no larger than the end's
// alignment. A kernel whose page cache broke that (a data end reported
// inside a folio, folios past the writer counted as data) fails here.
func TestFinishedBeforeHoldsTheWriter(t *testing.T) {
	const used = 6 << 20
	f, m := sparseMap(t, 32<<20)
	entry := incompressible(1500) // about a compressed record
	var ahead int64
	for off := 0; off+len(entry) <= used; off += len(entry) {
		copy(m[off:], entry)
		cursor := int64(off + len(entry))
		end, err := dataEnd(f)
		if err != nil {
			t.Fatal(err)
		}
		if end < cursor {
			t.Fatalf("data end %d before the bytes written, %d", end, cursor)
		}
		ahead = max(ahead, end-cursor)
		// The writer's folio holds its page and runs to the data end,
		// and a folio's size is a power of two: it starts no later
		// than end less the power of two at or above that span.
		page := cursor &^ int64(os.Getpagesize()-1)
		folio := int64(1)
		for folio < end-page {
			folio <<= 1
		}
		if fin := finishedBefore(end); fin > end-folio {
			t.Fatalf("finishedBefore(%d) = %d takes in the folio being written (writer at %d, its folio from %d at the latest)", end, fin, cursor, end-folio)
		}
	}
	t.Logf("the data end ran up to %d bytes ahead of the writer", ahead)
}

// TestDataEnd: where a sparse value-log file's data ends is its first
// hole, pages written through a shared map and not yet written back
// counted; a file without a hole (one Badger truncated at its rotation)
// has no end to tell.
func TestDataEnd(t *testing.T) {
	const size = 4 << 20
	f, m := sparseMap(t, size)
	for i := range 300 << 10 {
		m[i] = 1
	}
	end, err := dataEnd(f)
	if err != nil {
		t.Fatal(err)
	}
	if end < 300<<10 || end >= size {
		t.Errorf("data end %d, want from %d to under %d", end, 300<<10, size)
	}
	if err := f.Truncate(10000); err != nil {
		t.Fatal(err)
	}
	if end, err := dataEnd(f); err == nil {
		t.Errorf("a file without a hole has data end %d, want an error", end)
	}
}

// incompressible is n bytes that S2 cannot shrink, so that a record
// carrying them is stored at its full size (cache/internal/codec writes
// compressible bodies in a fraction of it).
func incompressible(n int) []byte {
	b := make([]byte, n)
	rng := rand.New(rand.NewPCG(uint64(n), 26))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}
