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
// writebackChunk + writebackMargin at most, not left dirty for the
// rotation's msync to write while every commit waits. The kernel's own
// flusher leaves dirty pages for 30 s, so without writeback the 4 MiB
// written here are still dirty after 10 s.
func TestWritebackLeavesTheRotationLittle(t *testing.T) {
	for _, tc := range []struct {
		name  string
		every time.Duration
	}{{"off", 0}, {"on", 100 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s, err := Open(Options{Dir: dir, Now: storetest.NewClock().Now, WritebackInterval: tc.every})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			commitBytes(t, s, 2000)
			const leftKiB = (writebackChunk+writebackMargin)>>10 + 64
			if tc.every == 0 {
				if kib := vlogDirtyKiB(t, dir); kib < 3<<10 {
					t.Skipf("only %d KiB of the value log dirty after writing 4 MiB: this kernel wrote it back already", kib)
				}
				if kib := waitClean(t, dir, leftKiB, 2*time.Second); kib < leftKiB {
					t.Fatalf("without writeback the value log was written back anyway (%d KiB dirty): this test cannot tell", kib)
				}
				// A round as runWriteback makes it.
				wb := newWriteback(dir)
				defer wb.close()
				wb.round(s.live.written.Load())
			}
			if kib := waitClean(t, dir, leftKiB, 10*time.Second); kib >= leftKiB {
				t.Fatalf("%d KiB of the value log still dirty 10 s after the writes, want under %d", kib, leftKiB)
			}
		})
	}
}

// TestWritebackRound: a round starts the writeback of the newest value-log
// file's finished part not yet started, only once that is writebackChunk
// or more and only when the store has written since the last round; it
// leaves out the last writebackMargin bytes (Badger may be writing them)
// and follows a rotation to the new file.
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
			asked = append(asked, filepath.Base(f.Name()))
			return ends[filepath.Base(f.Name())], nil
		}}
	defer wb.close()
	const mib = 1 << 20
	wb.round(0) // nothing written
	if len(asked) != 0 {
		t.Fatalf("a round with nothing written looked at %v", asked)
	}
	ends["000002.vlog"] = mib / 2
	wb.round(10) // under a chunk finished
	ends["000002.vlog"] = 2*mib + 100
	wb.round(20) // 2 MiB + 100 written: all but the margin, page-aligned
	wb.round(20) // nothing since
	ends["000002.vlog"] = 2*mib + 200
	wb.round(30) // a little more: under a chunk since the last start
	ends["000002.vlog"] = 3*mib + 300*1024
	wb.round(40) // from where the last ended
	if err := os.WriteFile(filepath.Join(dir, "000010.vlog"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ends["000010.vlog"] = 1*mib + writebackMargin
	wb.round(50) // 000002 did not grow: the rotated file, from its start
	want := fmt.Sprint([]string{
		fmt.Sprintf("000002.vlog@0+%d", 2*mib-writebackMargin),
		fmt.Sprintf("000002.vlog@%d+%d", 2*mib-writebackMargin, mib+300*1024),
		fmt.Sprintf("000010.vlog@0+%d", mib),
	})
	if got := fmt.Sprint(started); got != want {
		t.Errorf("rounds started\n%s\nwant\n%s", got, want)
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

// TestDataEnd: where a sparse value-log file's data ends is its first
// hole, pages written through a map counted; a file without a hole (one
// Badger truncated at its rotation) has no end to tell.
func TestDataEnd(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "000001.vlog"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(4 << 20); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 10000), 0); err != nil {
		t.Fatal(err)
	}
	end, err := dataEnd(f)
	if err != nil {
		t.Skipf("this filesystem reports no hole in a sparse file: %v", err)
	}
	if end < 10000 || end >= 4<<20 {
		t.Errorf("data end %d, want from 10000 to under 4 MiB", end)
	}
	if err := f.Truncate(10000); err != nil {
		t.Fatal(err)
	}
	if end, err := dataEnd(f); err == nil {
		t.Errorf("a file without a hole has data end %d, want an error", end)
	}
}
