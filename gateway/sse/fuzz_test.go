package sse

import (
	"bytes"
	"errors"
	"io"
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
			if !bytes.HasSuffix(ev, []byte("\n\n")) && !bytes.HasSuffix(ev, []byte("\r\n\r\n")) && !bytes.HasSuffix(ev, []byte("\n\r\n")) && !bytes.HasSuffix(ev, []byte("\r\n\n")) {
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
