package request

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgate/llmgate/gateway/idempotency"
	"github.com/llmgate/llmgate/gateway/metrics"
)

// A joiner that follows a live stream from any offset reads exactly the
// bytes written, in order, however they fall across the body's chunks —
// copied writes and kept ones (a recorder's bytes, held as they are)
// interleaved; what it was handed is never changed by later writes; the
// whole body is whole.
func TestLiveStreamChunksReadBackWhole(t *testing.T) {
	l := newLiveStream("fp", 1<<20)
	var want []byte
	var held [][]byte // views handed out, with the bytes they showed
	var heldWas [][]byte
	kept := 0
	for i := range 400 {
		ev := bytes.Repeat(fmt.Appendf(nil, "data: %d\n", i), 1+i%37)
		ev = append(ev, '\n')
		keep := i%3 == 1
		if keep {
			kept++
			ev = slices.Grow(ev, 64) // spare capacity a kept chunk must not lend to a later write
		}
		at := livePosAt(l, len(want))
		l.write(ev, keep)
		want = append(want, ev...)
		if i%50 == 0 {
			v := l.view(at)
			if !bytes.Equal(v.more, ev) {
				t.Fatalf("write %d: the view from before it shows %q", i, v.more)
			}
			held = append(held, v.more)
			heldWas = append(heldWas, bytes.Clone(v.more))
		}
	}
	if len(l.body) < kept {
		t.Fatalf("%d chunks for %d kept writes: each kept write is a chunk of its own", len(l.body), kept)
	}
	for _, from := range []int{0, 1, liveChunk - 1, liveChunk, liveChunk + 1, len(want) / 2, len(want) - 1} {
		var got []byte
		for at := livePosAt(l, from); ; {
			v := l.view(at)
			if len(v.more) == 0 {
				break
			}
			got = append(got, v.more...)
			at = v.next
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

// A kept write is held, not copied: the live stream shows the writer's own
// bytes, and takes no allocation for them.
func TestLiveStreamKeepsKeptBytes(t *testing.T) {
	l := newLiveStream("fp", 1<<20)
	ev := []byte("data: {}\n\n")
	if n := testing.AllocsPerRun(1, func() { l.write(ev, true) }); n != 0 {
		t.Fatalf("a kept write allocated %v times", n)
	}
	if v := l.view(livePos{}); len(v.more) != len(ev) || &v.more[0] != &ev[0] {
		t.Fatalf("the view shows %q, not the kept bytes themselves", v.more)
	}
}

// A joiner's position moves chunk by chunk: a stream of many small kept
// chunks costs each read the same, not a walk from the start.
func TestLiveStreamViewFromPosition(t *testing.T) {
	l := newLiveStream("fp", 1<<30)
	ev := []byte("data: x\n\n")
	const n = 20000
	for range n {
		l.write(ev, true)
	}
	var at livePos
	reads := 0
	for {
		v := l.view(at)
		if len(v.more) == 0 {
			break
		}
		if !bytes.Equal(v.more, ev) {
			t.Fatalf("read %d shows %q", reads, v.more)
		}
		at = v.next
		reads++
	}
	if reads != n || at != (livePos{n - 1, len(ev)}) {
		t.Fatalf("%d reads ending at %+v, want %d ending at the last chunk's end", reads, at, n)
	}
}

// livePosAt is the position of byte off of l's body; at its end, the end
// of its last chunk (where a joiner that has read it all stands).
func livePosAt(l *liveStream, off int) livePos {
	for i, c := range l.body {
		if off < len(c) || i == len(l.body)-1 {
			return livePos{i, off}
		}
		off -= len(c)
	}
	return livePos{}
}

// Past max the stream stops keeping: over, and nothing more is shown.
func TestLiveStreamOverMax(t *testing.T) {
	l := newLiveStream("fp", 10<<10)
	chunk := bytes.Repeat([]byte("x"), 3<<10)
	for range 3 {
		l.write(chunk, false)
	}
	if l.over || l.size != 9<<10 {
		t.Fatalf("over %v size %d after 9 KiB of 10", l.over, l.size)
	}
	l.write(chunk, true)
	if v := l.view(livePos{}); !v.over || len(v.more) != 0 || l.body != nil || slices.ContainsFunc(l.inline[:], func(c []byte) bool { return c != nil }) {
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

// The tokens a finished stream saved its joiners are read from it once:
// every joiner's savedByJoin copying the whole stream at its end, all at
// once, took max_record_bytes each (review: 40 joiners of a 4 MB stream
// allocated ~200 MB more as it ended).
func TestSavedByJoinReadsTheStreamOnce(t *testing.T) {
	l := newLiveStream("fp", 1<<30)
	for i := range 1000 {
		l.write(fmt.Appendf(nil, `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"%04d%s"}}]}`+"\n\n", i, bytes.Repeat([]byte("x"), 1000)), false)
	}
	l.write([]byte(`data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1000,"total_tokens":1003}}`+"\n\n"), false)
	l.write([]byte("data: [DONE]\n\n"), false)
	l.finish()
	g := &Handler{metrics: metrics.New(prometheus.NewRegistry(), nil)}
	kr := &idempotency.Request{Model: "m"}
	var ms runtime.MemStats
	alloc := func() uint64 { runtime.ReadMemStats(&ms); return ms.TotalAlloc }
	a0 := alloc()
	g.savedByJoin(kr, "up", l)
	first := alloc() - a0
	if l.saved.Out != 1000 || l.saved.In != 3 {
		t.Fatalf("usage read %+v", l.saved)
	}
	a1 := alloc()
	for range 10 {
		g.savedByJoin(kr, "up", l)
	}
	if rest := (alloc() - a1) / 10; rest > 64<<10 || first < 1<<20 {
		t.Fatalf("the first joiner allocated %d bytes, each later one %d: want the stream read once", first, rest)
	}
}
