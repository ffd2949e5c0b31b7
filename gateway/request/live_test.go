package request

import (
	"bytes"
	"fmt"
	"io"
	"testing"
)

// A joiner that follows a live stream from any offset reads exactly the
// bytes written, in order, however they fall across the body's chunks; what
// it was handed is never changed by later writes; the whole body is whole.
func TestLiveStreamChunksReadBackWhole(t *testing.T) {
	l := newLiveStream("fp", 1<<20)
	var want []byte
	var held [][]byte // views handed out, with the bytes they showed
	var heldWas [][]byte
	for i := range 400 {
		ev := bytes.Repeat(fmt.Appendf(nil, "data: %d\n", i), 1+i%37)
		ev = append(ev, '\n')
		l.write(ev)
		want = append(want, ev...)
		if i%50 == 0 {
			v := l.view(len(want) - len(ev))
			held = append(held, v.more)
			heldWas = append(heldWas, bytes.Clone(v.more))
		}
	}
	if len(l.body) < 3 {
		t.Fatalf("%d chunks for %d bytes: the test means to cross chunks", len(l.body), len(want))
	}
	for _, from := range []int{0, 1, liveChunk - 1, liveChunk, liveChunk + 1, len(want) / 2, len(want) - 1} {
		var got []byte
		for off := from; ; {
			v := l.view(off)
			if len(v.more) == 0 {
				break
			}
			got = append(got, v.more...)
			off += len(v.more)
		}
		if !bytes.Equal(got, want[from:]) {
			t.Fatalf("from %d: read %d bytes, want %d (equal prefix %d)", from, len(got), len(want)-from, commonPrefix(got, want[from:]))
		}
	}
	for i := range held {
		if !bytes.Equal(held[i], heldWas[i]) {
			t.Fatalf("view %d changed after later writes", i)
		}
	}
	rd, size := l.reader()
	if all, err := io.ReadAll(rd); err != nil || !bytes.Equal(all, want) || size != len(want) {
		t.Fatalf("reader: %d bytes (size %d), want the %d written (%v)", len(all), size, len(want), err)
	}
	if l.size != len(want) {
		t.Fatalf("size %d, want %d", l.size, len(want))
	}
}

// Past max the stream stops keeping: over, and nothing more is shown.
func TestLiveStreamOverMax(t *testing.T) {
	l := newLiveStream("fp", 10<<10)
	chunk := bytes.Repeat([]byte("x"), 3<<10)
	for range 3 {
		l.write(chunk)
	}
	if l.over || l.size != 9<<10 {
		t.Fatalf("over %v size %d after 9 KiB of 10", l.over, l.size)
	}
	l.write(chunk)
	if v := l.view(0); !v.over || len(v.more) != 0 || l.body != nil || l.inline[0] != nil || l.inline[1] != nil {
		t.Fatalf("after 12 KiB of 10: over %v, %d bytes shown, body kept %v/%v", v.over, len(v.more), l.body != nil, l.inline[0] != nil)
	}
}

func commonPrefix(a, b []byte) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}
