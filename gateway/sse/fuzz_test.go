package sse

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"testing"
	"unicode"
)

// FuzzSSEReader: splitting a stream into events never panics, loses no
// byte, and never returns an event without its terminating blank line
// except at a cut end.
func FuzzSSEReader(f *testing.F) {
	f.Add([]byte("data: {\"a\":1}\n\ndata: [DONE]\n\n"))
	f.Add([]byte(": keepalive\n\nevent: x\ndata: a\ndata: b\n\n"))
	f.Add([]byte("data: x\r\n\r\ndata: cut"))
	f.Add([]byte("\n\n\ndata: y\n\n"))
	f.Add([]byte("data: x\r\rdata: y\r\n\rdata: z\n\r"))
	f.Fuzz(func(t *testing.T, stream []byte) {
		rd := NewReader(bytes.NewReader(stream), 1<<20)
		defer rd.Release()
		var got []byte
		for {
			ev, err := rd.Next()
			got = append(got, ev...)
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, ErrEventTooLarge) {
					t.Fatalf("unexpected error %v", err)
				}
				break
			}
			if !endsInBlankLine(ev) {
				t.Fatalf("event without blank line: %q", ev)
			}
			_ = Data(ev)
		}
		if !bytes.Equal(bytes.TrimRightFunc(got, unicode.IsSpace), bytes.TrimRightFunc(stream, unicode.IsSpace)) && len(bytes.TrimSpace(stream)) > 0 {
			// Only trailing blank lines after the last event may be dropped.
			t.Fatalf("bytes lost:\n got %q\nwant %q", got, stream)
		}
	})
}

// endsInBlankLine reports whether ev ends in a line ending (CRLF, LF or CR)
// right after another.
func endsInBlankLine(ev []byte) bool {
	switch {
	case bytes.HasSuffix(ev, []byte("\r\n")):
		ev = ev[:len(ev)-2]
	case bytes.HasSuffix(ev, []byte("\n")), bytes.HasSuffix(ev, []byte("\r")):
		ev = ev[:len(ev)-1]
	default:
		return false
	}
	return bytes.HasSuffix(ev, []byte("\n")) || bytes.HasSuffix(ev, []byte("\r"))
}

// FuzzSSEReaderSpec holds the Reader to specEventEnds, the spec's framing
// written plainly, on streams that arrive in pieces the fuzzer chooses:
// each non-zero byte of cuts is the length of one Read, and the rest comes
// in one. maxEvent, when not 0, is the event limit.
func FuzzSSEReaderSpec(f *testing.F) {
	f.Add([]byte("data: a\n\ndata: b\n\n"), []byte{}, uint16(0), false)
	f.Add([]byte("data: a\r\rdata: b\r\r"), []byte{8}, uint16(0), false)
	f.Add([]byte("data: a\r\n\r\ndata: b\r\n\r\n"), []byte{8, 10, 1}, uint16(0), true)
	f.Add([]byte("\r\n\rdata: a\r\n\r\ndata: b\n\r\ndata: c\r\r\n\n"), []byte{1, 1, 1, 1, 9, 3, 2, 1}, uint16(0), false)
	f.Add([]byte("event: x\rdata: a\r\ndata: b\n\r: c\r"), []byte{3, 0, 7}, uint16(12), true)
	f.Add([]byte("data: abcdefghijklmnop\n\n\n\n\ndata: q"), []byte{5, 5, 5, 5}, uint16(24), false)
	f.Fuzz(func(t *testing.T, stream, cuts []byte, maxEvent uint16, eofWithData bool) {
		var at []int
		off := 0
		for _, c := range cuts {
			if c != 0 {
				off += int(c)
				at = append(at, off)
			}
		}
		r := &cutReader{data: stream, cuts: slices.Clone(at), eofWithData: eofWithData}
		if err := checkAgainstSpec(stream, r, int(maxEvent)); err != nil {
			t.Fatalf("%v\nstream %q\ncut at %v, EOF with data %v, limit %d", err, stream, at, eofWithData, maxEvent)
		}
	})
}
